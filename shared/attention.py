"""Scaled dot-product attention in NumPy: the reference the whole course checks against.

Every function accepts any number of leading batch dimensions ``(..., T, d)`` and follows the
course's conventions (see the README):

* ``Q = X @ W_q`` with ``X`` of shape ``(..., T, d_in)`` and ``W_q`` of shape ``(d_in, d_out)``;
* masks are boolean and ``True`` means *may attend*;
* a query that may attend to nothing gets all-zero weights and a zero output, never NaN;
* multi-head weights are ``(d_in, num_heads * head_dim)``; head ``h`` owns the columns
  ``h * head_dim : (h + 1) * head_dim`` and the output projection is applied as ``concat @ W_o``.

Bad input raises ``TypeError`` (not a real numeric array) or ``ValueError`` (shape, NaN, inf) with
a message that names what was expected and what arrived.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "softmax",
    "causal_mask",
    "scaled_dot_product_attention",
    "self_attention",
    "multi_head_attention",
]


# --------------------------------------------------------------------------------------------
# Input checking: one place, so every public function fails the same clear way.
# --------------------------------------------------------------------------------------------
def _as_real_array(name: str, x, min_ndim: int = 0, allow_neg_inf: bool = False) -> np.ndarray:
    """Return ``x`` as a floating NumPy array, or raise a message naming ``name``."""
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as err:  # ragged nested lists and the like
        raise TypeError(
            f"{name} must be a real numeric array; could not convert it: {err}"
        ) from None
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(
            f"{name} must be a real numeric array (int or float); got dtype {arr.dtype}"
        )
    if arr.ndim < min_ndim:
        layout = {1: "(..., d)", 2: "(..., T, d)"}.get(min_ndim, f"{min_ndim}-D")
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions {layout}; "
            f"got shape {arr.shape} ({arr.ndim}-D)"
        )
    arr = arr.astype(np.result_type(arr.dtype, np.float32), copy=False)
    bad = np.isnan(arr) | (np.isposinf(arr) if allow_neg_inf else np.isinf(arr))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = "NaN and +inf are" if allow_neg_inf else "NaN and inf are"
        raise ValueError(
            f"{name} must be finite ({allowed} not allowed); found {arr[where]} at index {where}"
        )
    return arr


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def check_qkv_shapes(Q_shape, K_shape, V_shape) -> None:
    """Check that ``Q (..., T_q, d_k)``, ``K (..., T_k, d_k)`` and ``V (..., T_k, d_v)`` fit
    together (shared by the NumPy reference and ``shared.flash``, which passes tensor shapes)."""
    Q_shape, K_shape, V_shape = tuple(Q_shape), tuple(K_shape), tuple(V_shape)
    if Q_shape[-1] != K_shape[-1]:
        raise ValueError(
            f"Q and K must share their last dimension d_k; got Q {Q_shape} and K {K_shape}"
        )
    if K_shape[-2] != V_shape[-2]:
        raise ValueError(
            "K and V must have the same number of tokens T_k (second-to-last dimension); "
            f"got K {K_shape} and V {V_shape}"
        )


def _batch_shape(**arrays: np.ndarray) -> tuple:
    """Broadcast the leading (batch) dimensions of ``(..., T, d)`` arrays, or explain why not."""
    try:
        return np.broadcast_shapes(*(a.shape[:-2] for a in arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
        raise ValueError(
            f"the leading (batch) dimensions must broadcast; got {shapes}"
        ) from None


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------
def softmax(x, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Shapes: ``x`` any shape; the result has the same shape and sums to 1 along ``axis``.

    The maximum is subtracted before exponentiating, so large scores do not overflow.
    ``-inf`` entries get weight exactly 0; a slice that is ``-inf`` everywhere (a query that may
    attend to nothing) gets all-zero weights instead of NaN. NaN and ``+inf`` are rejected.
    """
    x = _as_real_array("softmax input x", x, min_ndim=1, allow_neg_inf=True)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(
            f"axis must be in [{-x.ndim}, {x.ndim - 1}] for x of shape {x.shape}; got {axis}"
        )
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # all -inf slice: shift by 0, exp gives 0
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def causal_mask(T: int) -> np.ndarray:
    """Boolean causal mask of shape ``(T, T)``: entry ``[i, j]`` is True when query ``i`` may
    attend to key ``j``, i.e. when ``j <= i`` (no peeking at the future)."""
    T = _check_positive_int("T (the number of tokens)", T)
    return np.tril(np.ones((T, T), dtype=bool))


def scaled_dot_product_attention(Q, K, V, mask=None, causal: bool = False):
    """``softmax(Q K^T / sqrt(d_k)) V`` with an optional boolean mask.

    Shapes:
        Q: ``(..., T_q, d_k)``, K: ``(..., T_k, d_k)``, V: ``(..., T_k, d_v)``; the leading
        dimensions broadcast. T_q may differ from T_k (cross-attention).
        mask: boolean, broadcastable to ``(..., T_q, T_k)``; True = may attend.
        causal: if True, query ``i`` may also only attend to keys ``j <= i`` (combined with
        ``mask`` by AND), aligned top-left as in PyTorch's ``F.scaled_dot_product_attention``.

    Returns:
        ``(output, weights)`` with output ``(..., T_q, d_v)`` and weights ``(..., T_q, T_k)``.
        A query row that may attend to nothing has zero weights and a zero output.
    """
    Q = _as_real_array("Q", Q, min_ndim=2)
    K = _as_real_array("K", K, min_ndim=2)
    V = _as_real_array("V", V, min_ndim=2)
    check_qkv_shapes(Q.shape, K.shape, V.shape)
    batch = _batch_shape(Q=Q, K=K, V=V)
    T_q, d_k, T_k = Q.shape[-2], Q.shape[-1], K.shape[-2]
    # (..., T_q, T_k); dividing by a Python float keeps float32 inputs in float32
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)
    scores = np.broadcast_to(scores, batch + (T_q, T_k))

    allowed = None
    if mask is not None:
        allowed = np.asarray(mask)
        if allowed.dtype != np.bool_:
            raise TypeError(
                f"mask must be a boolean array (True = may attend); got dtype {allowed.dtype}"
            )
        try:
            ok = np.broadcast_shapes(allowed.shape, scores.shape) == scores.shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"mask of shape {allowed.shape} does not broadcast to the scores' shape "
                f"{scores.shape} (..., T_q, T_k)"
            )
    if causal:
        tri = np.tril(np.ones((T_q, T_k), dtype=bool))
        allowed = tri if allowed is None else (allowed & tri)
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)

    weights = softmax(scores, axis=-1)
    return weights @ V, weights


def _check_projections(X, W_q, W_k, W_v, num_heads: int = 1):
    """Validate ``X (..., T, d_in)`` and ``W_q, W_k (d_in, d_k)``, ``W_v (d_in, d_v)`` (with
    ``d_k`` and ``d_v`` divisible by ``num_heads``); return them as float arrays."""
    X = _as_real_array("X", X, min_ndim=2)
    d_in = X.shape[-1]
    checked = []
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        W = _as_real_array(name, W)
        if W.ndim != 2:
            raise ValueError(f"{name} must be 2-D (d_in, d_out); got shape {W.shape}")
        if W.shape[0] != d_in:
            raise ValueError(
                f"{name} must have d_in = {d_in} rows to match X's last dimension; "
                f"got shape {W.shape}"
            )
        if W.shape[1] % num_heads:
            raise ValueError(
                f"{name}'s d_out = {W.shape[1]} (shape {W.shape}) is not divisible by "
                f"num_heads = {num_heads}"
            )
        checked.append(W)
    W_q, W_k, W_v = checked
    if W_q.shape != W_k.shape:
        raise ValueError(
            f"W_q and W_k must have the same shape (d_in, d_k); got {W_q.shape} and {W_k.shape}"
        )
    return X, W_q, W_k, W_v


def self_attention(X, W_q, W_k, W_v, causal: bool = False):
    """Self-attention with projections ``Q = X @ W_q``, ``K = X @ W_k``, ``V = X @ W_v``.

    Shapes:
        X: ``(..., T, d_in)``; W_q, W_k: ``(d_in, d_k)``; W_v: ``(d_in, d_v)``.

    Returns:
        ``(output, weights)``: output ``(..., T, d_v)``, weights ``(..., T, T)``.
    """
    X, W_q, W_k, W_v = _check_projections(X, W_q, W_k, W_v)
    return scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, causal=causal)


def _split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(..., T, num_heads * head_dim)`` -> ``(..., num_heads, T, head_dim)``."""
    *lead, T, d = x.shape
    return np.swapaxes(x.reshape(*lead, T, num_heads, d // num_heads), -3, -2)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """``(..., num_heads, T, head_dim)`` -> ``(..., T, num_heads * head_dim)``."""
    x = np.swapaxes(x, -3, -2)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def multi_head_attention(X, W_q, W_k, W_v, num_heads: int, W_o=None, causal: bool = False):
    """Multi-head self-attention: ``num_heads`` independent heads, concatenated, then ``@ W_o``.

    Shapes:
        X: ``(..., T, d_in)``; W_q, W_k: ``(d_in, num_heads * head_dim)``;
        W_v: ``(d_in, num_heads * head_dim_v)``; head ``h`` owns the columns
        ``h * head_dim : (h + 1) * head_dim``. W_o (optional): ``(num_heads * head_dim_v, d_out)``.

    Returns:
        ``(output, weights)``: output ``(..., T, d_out)`` (or ``(..., T, num_heads * head_dim_v)``
        without W_o), weights ``(..., num_heads, T, T)``.
    """
    num_heads = _check_positive_int("num_heads", num_heads)
    X, W_q, W_k, W_v = _check_projections(X, W_q, W_k, W_v, num_heads)
    Q = _split_heads(X @ W_q, num_heads)  # (..., H, T, head_dim)
    K = _split_heads(X @ W_k, num_heads)
    V = _split_heads(X @ W_v, num_heads)
    context, weights = scaled_dot_product_attention(Q, K, V, causal=causal)
    out = _merge_heads(context)  # (..., T, H * head_dim_v)
    if W_o is not None:
        W_o = _as_real_array("W_o", W_o)
        if W_o.ndim != 2 or W_o.shape[0] != out.shape[-1]:
            raise ValueError(
                f"W_o must be 2-D with {out.shape[-1]} rows (num_heads * head_dim_v) to match the "
                f"concatenated heads; got shape {W_o.shape}"
            )
        out = out @ W_o
    return out, weights
