"""Exercise checkers for notebook 02 Self-attention with trainable weights (PyTorch)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _entropy,
    _NotAttempted,
    _rng,
    _softmax,
    _Wrong,
)

__all__ = [
    "check_weight_transfer",
    "check_attention_entropy",
    "check_permutation_equivariance",
]

@_checker
def check_weight_transfer(transfer_weights):
    """``transfer_weights(sa_v1, sa_v2)`` copies the ``nn.Linear`` weights of a
    ``SelfAttentionV2`` into a ``SelfAttentionV1`` (in place) so both compute the same output."""
    try:
        from shared.modules import SelfAttentionV1, SelfAttentionV2
    except ImportError:
        raise _Wrong("shared.modules has no SelfAttentionV1/SelfAttentionV2 yet: update the "
                     "course files") from None
    names = ("W_query", "W_key", "W_value")
    for case, (d_in, d_out) in enumerate(((3, 2), (4, 4), (5, 3))):
        torch.manual_seed(200 + case)
        v1, v2 = SelfAttentionV1(d_in, d_out), SelfAttentionV2(d_in, d_out)
        before1 = {n: getattr(v1, n).detach().clone() for n in names}
        before2 = {n: getattr(v2, n).weight.detach().clone() for n in names}
        _call(transfer_weights, v1, v2, name="transfer_weights", none_ok=True,
              on_error="hint: nn.Linear stores its weight as (d_out, d_in) while v1's parameters "
                       "are (d_in, d_out): copy the transpose, sa_v2.W_query.weight.T")
        after2 = {n: getattr(v2, n).weight.detach() for n in names}
        if any(not torch.equal(before2[n], after2[n]) for n in names):
            raise _Wrong("sa_v2's weights changed: copy in the other direction, from sa_v2 "
                         "(nn.Linear) into sa_v1")
        try:
            after1 = {n: _arr(getattr(v1, n), f"sa_v1.{n}") for n in names}
        except AttributeError as e:
            raise _Wrong(f"sa_v1 lost an attribute ({e})") from None
        if all(np.array_equal(after1[n], before1[n].numpy()) for n in names):
            raise _NotAttempted("sa_v1's weights are unchanged: copy sa_v2's weights into it")
        for n in names:
            w = after2[n].double().numpy()
            if d_in != d_out and _close(after1[n], w):
                raise _Wrong("nn.Linear stores its weight as (d_out, d_in); v1's parameter is "
                             "(d_in, d_out): copy the transpose (.T)")
            if after1[n].shape != (d_in, d_out):
                raise _Wrong(f"sa_v1.{n} now has shape {after1[n].shape}; expected "
                             f"(d_in, d_out) = {(d_in, d_out)}: copy sa_v2.{n}.weight.T")
            if _close(after1[n], w) and not _close(w, w.T):
                raise _Wrong("nn.Linear stores its weight as (d_out, d_in); v1 multiplies "
                             "x @ W, so copy the transpose: sa_v2.W_query.weight.T")
            for other in names:
                if other != n and _close(after1[n], after2[other].double().numpy().T):
                    raise _Wrong(f"sa_v1.{n} received sa_v2.{other}'s weights: copy query to "
                                 "query, key to key and value to value")
        x = torch.rand(6, d_in, generator=torch.Generator().manual_seed(210 + case))
        try:
            with torch.no_grad():
                out1, out2 = v1(x), v2(x)
        except Exception as e:  # noqa: BLE001
            raise _Wrong(f"sa_v1 no longer runs after the transfer ({type(e).__name__}: {e}); "
                         "copy into its parameters, e.g. "
                         "sa_v1.W_query.data.copy_(sa_v2.W_query.weight.T)") from None
        if not torch.allclose(out1, out2, atol=1e-6):
            diff = float((out1 - out2).abs().max())
            raise _Wrong(f"after the transfer the two modules still differ by up to {diff:.4f}")
    return "sa_v1 and sa_v2 now give the same context vectors (W_q = W_query.weight.T)."


def _entropy_cases():
    g = torch.Generator().manual_seed(202)
    cases = [torch.randn(8, d_k, generator=g, dtype=torch.float64) for d_k in (4, 64, 256)]
    out = []
    for i, d_k in enumerate((4, 64, 256)):
        out.append((cases[i], torch.randn(8, d_k, generator=g, dtype=torch.float64)))
    big = torch.randn(6, 16, generator=g) * 30  # float32 and saturated: some weights are exactly 0
    out.append((big, big.flip(0).clone()))
    return out


def _mean_entropy(Q: np.ndarray, K: np.ndarray, scale: float, axis: int = -1,
                  dtype=np.float64) -> float:
    w = _softmax((Q @ K.T / scale).astype(dtype), axis=axis)
    return float(_entropy(w, axis=axis).mean())


@_checker
def check_attention_entropy(attention_entropy):
    """``attention_entropy(Q, K, scaled=True)`` -> the mean (over queries) entropy, in nats, of
    the rows of ``softmax(Q @ K.T / sqrt(d_k))`` (no division when ``scaled=False``).
    Q, K: torch tensors ``(T, d_k)``."""
    for Q, K in _entropy_cases():
        q, k = Q.double().numpy(), K.double().numpy()
        d_k = q.shape[-1]
        for scaled in (True, False):
            got = _arr(_call(attention_entropy, Q.clone(), K.clone(), scaled=scaled,
                             name="attention_entropy"), "the entropy")
            if got.size != 1:
                raise _Wrong(f"return one number (the mean entropy over the {q.shape[0]} "
                             f"queries); got shape {got.shape}")
            got = float(got.reshape(()))
            ref = _mean_entropy(q, k, math.sqrt(d_k) if scaled else 1.0)
            if math.isclose(got, ref, rel_tol=1e-4, abs_tol=1e-5):
                continue
            if math.isnan(got):
                raise _Wrong("your entropy is nan: when a weight underflows to exactly 0, "
                             "p * log(p) is 0 * (-inf); count it as 0 (torch.special.xlogy(p, p) "
                             "or torch.where(p > 0, p * p.log(), 0))")
            cands = [
                ("forgot the scaling: with scaled=True divide the scores by sqrt(d_k)",
                 _mean_entropy(q, k, 1.0) if scaled else None),
                ("with scaled=False use the raw scores Q @ K.T (no division)",
                 _mean_entropy(q, k, math.sqrt(d_k)) if not scaled else None),
                ("divide the scores by sqrt(d_k), not by d_k",
                 _mean_entropy(q, k, d_k) if scaled else None),
                ("the entropy is -sum(p * log p): you lost the minus sign", -ref),
                ("the course measures entropy in nats: use the natural log (torch.log), not "
                 "log2", ref / math.log(2)),
                ("average the row entropies over the queries (mean), don't sum them",
                 ref * q.shape[0]),
                ("softmax over the wrong axis: each query's weights (a row, dim=-1) must sum "
                 "to 1", _mean_entropy(q, k, math.sqrt(d_k) if scaled else 1.0, axis=0)),
            ]
            for hint, value in cands:
                if value is not None and math.isclose(got, value, rel_tol=1e-4, abs_tol=1e-5):
                    raise _Wrong(hint)
            raise _Wrong(f"for d_k = {d_k}, scaled={scaled} the mean entropy should be "
                         f"{ref:.4f} nats; got {got:.4f}")
    return "without scaling the entropy collapses as d_k grows; with it, it stays put."


def _identity(X):
    return X.copy()


def _make_attention(causal: bool = False, positions: bool = False, noise: bool = False):
    rng = _rng(203)
    W_q, W_k, W_v = (rng.normal(size=(4, 4)) for _ in range(3))
    P = rng.normal(size=(16, 4))
    calls = [0]

    def attention(X):
        X = np.asarray(X, dtype=np.float64)
        T = X.shape[-2]
        if positions:
            X = X + P[:T]
        S = (X @ W_q) @ (X @ W_k).T / 2.0
        if causal:
            S = np.where(np.tril(np.ones((T, T), dtype=bool)), S, -np.inf)
        out = _softmax(S) @ (X @ W_v)
        if noise:  # rounding-sized differences, as a different summation order produces
            calls[0] += 1
            out = out + 1e-13 * np.random.default_rng(calls[0]).standard_normal(out.shape)
        return out

    return attention


@_checker
def check_permutation_equivariance(is_permutation_equivariant):
    """``is_permutation_equivariant(attention_fn, X, perm)`` -> True iff
    ``attention_fn(X[perm])`` equals ``attention_fn(X)[perm]`` (up to rounding: use allclose).
    ``attention_fn`` maps a NumPy ``(T, d)`` array to ``(T, d_v)``."""
    rng = _rng(204)
    X = rng.normal(size=(5, 4))
    swap, cycle = np.array([1, 0, 2, 3, 4]), np.array([1, 2, 0, 4, 3])

    def ask(fn, perm):
        ans = _call(is_permutation_equivariant, fn, X.copy(), perm.copy(),
                    name="is_permutation_equivariant")
        if isinstance(ans, (bool, np.bool_)) or (isinstance(ans, torch.Tensor) and ans.numel() == 1
                                                 and ans.dtype == torch.bool):
            return bool(ans)
        raise _Wrong(f"return a single True or False (np.allclose gives one); got "
                     f"{type(ans).__name__}" + (f" of shape {tuple(ans.shape)}"
                                                if hasattr(ans, "shape") else ""))

    if not ask(_identity, swap):
        raise _Wrong("even for f(X) = X your check says False: compare f(X[perm]) with the "
                     "ORIGINAL output permuted the same way, f(X)[perm] (not with f(X) itself)")
    if not ask(_identity, cycle):
        raise _Wrong("right for a swap but False for a 3-cycle: the permutation goes the wrong "
                     "way; compare f(X[perm]) with f(X)[perm] (same perm, not its inverse)")
    if not ask(_make_attention(noise=True), cycle):
        raise _Wrong("self-attention IS permutation-equivariant, but the sums run in a different "
                     "order so the last digits differ: compare with np.allclose, not ==")
    if not ask(_make_attention(), cycle):
        raise _Wrong("plain self-attention is permutation-equivariant; your check says False")
    if ask(_make_attention(causal=True), cycle):
        raise _Wrong("your check says True for causal attention, which is NOT "
                     "permutation-equivariant (token 0 sees only itself): are you comparing "
                     "the same thing with itself?")
    if ask(_make_attention(positions=True), cycle):
        raise _Wrong("your check says True for attention with positional encodings added, which "
                     "is NOT permutation-equivariant: compare f(X[perm]) with f(X)[perm]")
    return ("permuting the tokens permutes the outputs the same way; causal masks and "
            "positional encodings break that.")


