"""Exercise checkers for notebook 07 Position inside attention: RoPE and ALiBi (PyTorch)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._core import _arr, _call, _checker, _close, _diagnose, _maxdiff, _shape, _Wrong

__all__ = [
    "check_ntk_base",
    "check_shift_change",
    "check_to_half_split",
    "check_alibi_mass_beyond",
]


def _number(ans, what: str) -> float:
    """One number from a learner's answer (int, float, 0-d or 1-element tensor/array)."""
    if isinstance(ans, (str, bytes)):
        raise _Wrong(f"{what} should be a number; got the text {ans!r}")
    a = _arr(ans, what)
    if a.size != 1:
        raise _Wrong(f"{what} should be one number; got an array of shape {a.shape}")
    return float(a.reshape(()))


# --------------------------------------------------------------------------------------------
# 7.1 Stretch RoPE without touching the fast pairs (NTK-aware scaling)
# --------------------------------------------------------------------------------------------
@_checker
def check_ntk_base(ntk_base):
    """``ntk_base(base, head_dim, scale)`` -> the new base ``b'`` for which pair 0 keeps its
    angle per position (1 radian, for any base) and the slowest pair, ``i = head_dim/2 - 1``,
    turns exactly ``scale`` times slower: ``b' = base * scale ** (head_dim / (head_dim - 2))``."""
    cases = ((10_000.0, 64, 4.0), (10_000.0, 128, 8.0), (500_000.0, 128, 2.0), (10_000.0, 8, 4.0),
             (100.0, 16, 3.0))
    for base, d, s in cases:
        got = _number(_call(ntk_base, base, d, s, name="ntk_base"), "the new base")
        ref = base * s ** (d / (d - 2))
        if math.isclose(got, ref, rel_tol=1e-9):
            continue
        slow = ref ** (-(d - 2) / d)
        if not (math.isfinite(got) and got > 0):
            raise _Wrong(f"for base {base:g}, head_dim {d}, scale {s:g} you returned {got!r}: a "
                         "base must be a positive number")
        for hint, value in (
            ("b * scale would be right if the slowest pair turned by 1/base per position, but "
             "theta_i = base^(-2i/d), so the slowest pair (i = d/2 - 1) turns by "
             "base^(-(d-2)/d): solve b'^(-(d-2)/d) = base^(-(d-2)/d) / scale for b'",
             base * s),
            ("the exponent is upside down: from b'^(-(d-2)/d) = base^(-(d-2)/d) / scale, "
             "b' = base * scale^(d/(d-2))", base * s ** ((d - 2) / d)),
            ("a smaller base makes every pair turn *faster*; to slow the slow pairs down, "
             "raise the base", base / s ** (d / (d - 2))),
            ("a smaller base makes every pair turn *faster*; to slow the slow pairs down, "
             "raise the base", base / s),
            ("base ** scale is far too large: the base is multiplied by a factor, "
             "scale^(d/(d-2)), not raised to a power", base ** s),
            ("count the pairs from 0: the slowest is i = d/2 - 1, so its exponent is (d-2)/d, "
             "not (d-1)/d", base * s ** (d / (d - 1))),
        ):
            if math.isclose(got, value, rel_tol=1e-9):
                raise _Wrong(hint)
        got_slow = got ** (-(d - 2) / d) if got > 0 else float("nan")
        raise _Wrong(f"for base {base:g}, head_dim {d}, scale {s:g}: the slowest pair should turn "
                     f"by {slow:.4g} rad per position with the new base, but with yours it turns "
                     f"by {got_slow:.4g}")
    return ("for head_dim 64 and a 4x longer context the base grows from 10,000 to about "
            "41,800: pair 0 is untouched, the slowest pair turns 4x slower.")


# --------------------------------------------------------------------------------------------
# 7.2 A numerical test: shift every position, measure how much the scores move
# --------------------------------------------------------------------------------------------
def _positions(p) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(p.detach().cpu() if isinstance(p, torch.Tensor) else p))
    if t.is_floating_point() or t.dtype == torch.bool or t.ndim != 1:
        raise TypeError(f"positions must be a 1-D sequence of integers; got {t.dtype} with "
                        f"shape {tuple(t.shape)}")
    return t.to(torch.int64)


def _enc_rope(x, positions):
    """RoPE (apply_rope): scores depend on relative positions only."""
    from shared.positional import apply_rope

    return apply_rope(x, _positions(positions), base=100.0)


def _enc_sinusoid(x, positions):
    """x + the sinusoidal encoding of each position (notebook 02): absolute positions."""
    pos = _positions(positions).to(torch.float64)[:, None]
    d = x.shape[-1]
    freq = 100.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.stack((torch.sin(pos * freq), torch.cos(pos * freq)), dim=-1).flatten(-2)
    return x + pe.to(x.dtype)


def _enc_squared(x, positions):
    """A rotation by position**2: a rotation, yet not relative."""
    from shared.positional import apply_rope

    p = _positions(positions)
    return apply_rope(x, p * p, base=100.0)


def _scores(encode, Q, K, pq, pk) -> torch.Tensor:
    return encode(Q, pq) @ encode(K, pk).T


@_checker
def check_shift_change(shift_change):
    """``shift_change(encode, Q, K, offset)`` -> one number: the largest absolute change of the
    score matrix ``encode(Q, p) @ encode(K, p).T`` (``p = 0 .. T-1``) when every position moves
    to ``p + offset``. ``encode(x, positions)`` is a position encoding handed in by the checker
    (RoPE, added sinusoids, ...); ``Q``, ``K`` are ``(T, d)`` torch tensors."""
    g = torch.Generator().manual_seed(702)
    T, d = 6, 8
    Q = torch.randn(T, d, generator=g, dtype=torch.float64)
    K = torch.randn(T, d, generator=g, dtype=torch.float64)
    p = torch.arange(T)
    found = {}
    for encode, name in ((_enc_rope, "RoPE"), (_enc_sinusoid, "added sinusoids"),
                         (_enc_squared, "a rotation by position**2")):
        for offset in (5, 123):
            Q_in, K_in = Q.clone(), K.clone()
            ans = _call(shift_change, encode, Q_in, K_in, offset, name="shift_change")
            got = _number(ans, "shift_change's result")
            S0 = _scores(encode, Q, K, p, p)
            diff = S0 - _scores(encode, Q, K, p + offset, p + offset)
            ref = float(diff.abs().max())
            if abs(got - ref) <= 1e-9 + 1e-6 * ref:
                found[(name, offset)] = ref
                continue
            if ref > 1e-6 and got == 0:
                raise _Wrong(f"you got 0 for {name}, whose scores do change with a shift: "
                             "compare the scores at positions 0 .. T-1 with the scores at "
                             "offset .. offset+T-1 (not with themselves)")
            only_one = ("shift the keys' positions too: with only the queries moved, the "
                        "distance m - n changes, so even RoPE's scores change")
            for hint, value in (
                (only_one, (S0 - _scores(encode, Q, K, p + offset, p)).abs().max()),
                (only_one, (S0 - _scores(encode, Q, K, p, p + offset)).abs().max()),
                ("encode the keys too: the score is encode(Q, p) @ encode(K, p).T",
                 (encode(Q, p) @ K.T - encode(Q, p + offset) @ K.T).abs().max()),
                ("take the absolute value of the differences before the maximum", diff.max()),
                ("report the largest absolute change (max), not the average", diff.abs().mean()),
            ):
                if abs(got - float(value)) <= 1e-9 + 1e-6 * abs(float(value)):
                    raise _Wrong(hint)
            raise _Wrong(f"for {name} with offset {offset} the largest change is {ref:.4g}; "
                         f"got {got:.4g}")
    rope_max = max(v for (n, _), v in found.items() if n == "RoPE")
    rope = "less than 1e-10 (float rounding)" if rope_max < 1e-10 else f"{rope_max:.1e}"
    return (f"under shifts of 5 and 123, RoPE's scores moved by {rope}; added sinusoids' by up "
            f"to {max(found[('added sinusoids', o)] for o in (5, 123)):.4f}.")


# --------------------------------------------------------------------------------------------
# 7.3 Convert weights trained with interleaved RoPE to the half-split convention
# --------------------------------------------------------------------------------------------
def _half_split_order(num_heads: int, head_dim: int) -> np.ndarray:
    within = np.concatenate((np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)))
    return np.concatenate([h * head_dim + within for h in range(num_heads)])


def _heads_rope(X: torch.Tensor, W: torch.Tensor, num_heads: int, interleaved: bool):
    from shared.positional import apply_rope

    T = X.shape[0]
    heads = (X @ W).view(T, num_heads, -1).transpose(0, 1)  # (H, T, head_dim)
    return apply_rope(heads, torch.arange(T), interleaved=interleaved)


@_checker
def check_to_half_split(to_half_split):
    """``to_half_split(W, num_heads)``: ``W`` is the math's ``(d_in, num_heads * head_dim)``
    query or key weight (head ``h`` owns columns ``h*head_dim:(h+1)*head_dim``) of a model trained
    with interleaved RoPE -> the same matrix with its columns reordered so that half-split RoPE
    gives the same scores: within every head, the order ``[0, 2, 4, ..., 1, 3, 5, ...]``."""
    rng = np.random.default_rng(703)
    worst = 0.0
    for d_in, H, hd in ((8, 2, 4), (3, 3, 6), (5, 2, 4), (6, 1, 8)):
        W = rng.normal(size=(d_in, H * hd))
        W_in = torch.from_numpy(W.copy())
        got = _arr(_call(to_half_split, W_in, H, name="to_half_split", copy=False),
                   "the converted W")
        if not np.array_equal(W_in.numpy(), W):
            raise _Wrong("to_half_split changed W in place; return a reordered copy "
                         "(W[:, order] makes one)")
        ref = W[:, _half_split_order(H, hd)]
        if got.shape == ref.shape[::-1] and got.shape != ref.shape:
            raise _Wrong(f"wrong shape {got.shape}: W is the math's (d_in, num_heads * head_dim) "
                         f"= {ref.shape} matrix; reorder its columns, don't transpose it")
        _shape(got, ref.shape, "the converted W", "(d_in, num_heads * head_dim), like W")
        if _close(got, ref, atol=1e-12):
            X = torch.from_numpy(rng.normal(size=(7, d_in)))
            Wk = rng.normal(size=(d_in, H * hd))
            Wk_half = _arr(_call(to_half_split, torch.from_numpy(Wk.copy()), H,
                                 name="to_half_split"), "the converted W")
            S_inter = (_heads_rope(X, torch.from_numpy(W), H, True)
                       @ _heads_rope(X, torch.from_numpy(Wk), H, True).transpose(-1, -2))
            S_half = (_heads_rope(X, torch.from_numpy(got), H, False)
                      @ _heads_rope(X, torch.from_numpy(Wk_half), H, False).transpose(-1, -2))
            worst = max(worst, float((S_inter - S_half).abs().max()))
            continue
        order_all = np.concatenate((np.arange(0, H * hd, 2), np.arange(1, H * hd, 2)))
        inverse = np.argsort(_half_split_order(H, hd))
        _diagnose(got, [
            ("W came back unchanged: the columns must be reordered", W),
            ("reorder within each head: head h owns columns h*head_dim:(h+1)*head_dim, and each "
             "head gets its own order [0, 2, 4, ..., 1, 3, 5, ...]; you reordered all the "
             "columns at once", W[:, order_all]),
            ("that is the other direction (half-split to interleaved): the half-split model's "
             "feature j must be the interleaved model's feature order[j], i.e. W[:, order]",
             W[:, inverse]),
            ("reorder the columns (output features), not the rows (input features)",
             W[_half_split_order(H, hd)] if d_in == H * hd else None),
            ("W is the math's (d_in, num_heads * head_dim) matrix: reorder its columns, don't "
             "transpose it", ref.T if d_in == H * hd else None),
        ], atol=1e-12)
        raise _Wrong(f"for num_heads = {H}, head_dim = {hd} the columns should be in the order "
                     f"{_half_split_order(H, hd).tolist()} (up to {_maxdiff(got, ref)} off)")
    return (f"with the reordered W_q and W_k, half-split RoPE reproduces the interleaved "
            f"model's scores (max diff {'< 1e-12' if worst < 1e-12 else f'{worst:.1e}'}).")


# --------------------------------------------------------------------------------------------
# 7.4 ALiBi: how much weight lies beyond a distance
# --------------------------------------------------------------------------------------------
def _alibi_weights(slope: float, T: int, sign: float = -1.0) -> np.ndarray:
    z = sign * slope * np.arange(T, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


@_checker
def check_alibi_mass_beyond(alibi_mass_beyond):
    """``alibi_mass_beyond(slope, T, distance)`` -> one number: the total attention weight that
    the last query of a causal sequence of ``T`` tokens puts on keys farther than ``distance``
    (distance ``i - j > distance``) when every content score is equal and ALiBi adds
    ``-slope * (i - j)``."""
    notes = {}
    for slope, T, dist in ((0.5, 64, 8), (1 / 256, 64, 16), (1 / 16, 200, 32), (0.25, 10, 20),
                           (0.5, 8, 0), (1 / 64, 1000, 100)):
        ans = _call(alibi_mass_beyond, slope, T, dist, name="alibi_mass_beyond")
        got = _number(ans, "alibi_mass_beyond's result")
        w = _alibi_weights(slope, T)
        ref = float(w[dist + 1:].sum())
        if _close(got, ref, atol=1e-7):
            notes[(slope, T, dist)] = ref
            continue
        e = np.exp(-slope * np.arange(T, dtype=np.float64))
        _diagnose(np.asarray(got), [
            ("farther than `distance` means i - j > distance: you also counted the key at "
             "exactly that distance", float(w[dist:].sum()) if dist < T else None),
            ("that is the weight WITHIN the distance; the question asks for the weight beyond it",
             1.0 - ref),
            ("the bias is a penalty, -slope * distance: farther keys get less weight, not more",
             float(_alibi_weights(slope, T, +1.0)[dist + 1:].sum())),
            ("normalise: divide by the sum of exp(-slope * distance) over all T keys (that is "
             "the softmax)", float(e[dist + 1:].sum())),
            ("there are only T keys (distances 0 .. T-1): the sums are finite, not infinite "
             "geometric series", math.exp(-slope * (dist + 1))),
        ], atol=1e-7)
        raise _Wrong(f"for slope = {slope:g}, T = {T}, distance = {dist} the weight beyond is "
                     f"{ref:.4f}; got {got:.4f}")
    return (f"with T = 64, a head with slope 1/2 puts {notes[(0.5, 64, 8)]:.4f} of its weight "
            f"beyond 8 tokens; a head with slope 1/256 puts {notes[(1 / 256, 64, 16)]:.4f} "
            "beyond 16.")
