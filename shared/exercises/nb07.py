"""Exercise checkers for notebook 07 Position inside attention: RoPE and ALiBi (PyTorch)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._core import _arr, _call, _checker, _close, _diagnose, _shape, _Wrong

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
# 7.3 Convert a fused query-key-value weight trained with interleaved RoPE to half-split
# --------------------------------------------------------------------------------------------
def _pi(n: int) -> np.ndarray:
    """Even features first, then odd: [0, 2, 4, ..., 1, 3, 5, ...]."""
    return np.concatenate((np.arange(0, n, 2), np.arange(1, n, 2)))


def _fused_order(num_heads: int, head_dim: int, q: bool = True, k: bool = True,
                 v: bool = False, perm=_pi) -> np.ndarray:
    """Column order of a fused (d_in, num_heads * 3 * head_dim) weight laid out like GPT-NeoX's
    query_key_value (head h: q, k, v blocks of head_dim each), with ``perm`` applied inside the
    chosen blocks."""
    keep, mixed = np.arange(head_dim), perm(head_dim)
    cols = []
    for h in range(num_heads):
        start = h * 3 * head_dim
        for offset, apply in ((0, q), (head_dim, k), (2 * head_dim, v)):
            cols.append(start + offset + (mixed if apply else keep))
    return np.concatenate(cols)


def _qkv_blocks_order(num_heads: int, head_dim: int) -> np.ndarray:
    """The right reordering, but for the layout [all queries | all keys | all values]."""
    within = np.concatenate([h * head_dim + _pi(head_dim) for h in range(num_heads)])
    n = num_heads * head_dim
    return np.concatenate((within, n + within, 2 * n + np.arange(n)))


def _fused_heads(X: torch.Tensor, W: torch.Tensor, num_heads: int, interleaved: bool):
    """Rotated queries, rotated keys and values (H, T, head_dim) from a fused weight."""
    from shared.positional import apply_rope

    T = X.shape[0]
    q, k, v = (X @ W).view(T, num_heads, 3, -1).permute(2, 1, 0, 3)  # 3 x (H, T, head_dim)
    pos = torch.arange(T)
    return (apply_rope(q, pos, interleaved=interleaved),
            apply_rope(k, pos, interleaved=interleaved), v)


@_checker
def check_to_half_split(to_half_split):
    """``to_half_split(W_qkv, num_heads)``: ``W_qkv`` is the math's ``(d_in, num_heads * 3 *
    head_dim)`` fused weight (``query_key_value.weight.T``) of a model trained with interleaved
    RoPE, laid out like GPT-NeoX's: head ``h`` owns columns ``h*3*head_dim:(h+1)*3*head_dim``,
    its query first, then its key, then its value (``head_dim`` each) -> a reordered copy for
    which half-split RoPE gives the same scores and the same values: the order ``[0, 2, 4, ...,
    1, 3, 5, ...]`` inside every query block and every key block, value blocks untouched."""
    rng = np.random.default_rng(703)
    worst = 0.0
    for d_in, H, hd in ((24, 2, 4), (5, 3, 6), (4, 2, 8), (6, 1, 4)):
        W = rng.normal(size=(d_in, H * 3 * hd))
        W_in = torch.from_numpy(W.copy())
        got = _arr(_call(to_half_split, W_in, H, name="to_half_split", copy=False),
                   "the converted W_qkv")
        if not np.array_equal(W_in.numpy(), W):
            raise _Wrong("to_half_split changed W_qkv in place; return a reordered copy "
                         "(W_qkv[:, order] makes one)")
        ref = W[:, _fused_order(H, hd)]
        if got.shape == ref.shape[::-1] and got.shape != ref.shape:
            raise _Wrong(f"wrong shape {got.shape}: W_qkv is the math's (d_in, num_heads * 3 * "
                         f"head_dim) = {ref.shape} matrix; reorder its columns, don't transpose it")
        _shape(got, ref.shape, "the converted W_qkv",
               "(d_in, num_heads * 3 * head_dim), like W_qkv")
        if _close(got, ref, atol=1e-12):
            X = torch.from_numpy(rng.normal(size=(7, d_in)))
            q_i, k_i, v_i = _fused_heads(X, torch.from_numpy(W), H, True)
            q_h, k_h, v_h = _fused_heads(X, torch.from_numpy(got), H, False)
            worst = max(worst, float((q_i @ k_i.transpose(-1, -2) - q_h @ k_h.transpose(-1, -2))
                                     .abs().max()), float((v_i - v_h).abs().max()))
            continue
        square = d_in == H * 3 * hd
        _diagnose(got, [
            ("W_qkv came back unchanged: the query and key columns must be reordered", W),
            ("GPT-NeoX keeps each head's query, key and value together: head h owns columns "
             "h*3*head_dim:(h+1)*3*head_dim (query, then key, then value); you treated W_qkv as "
             "[all queries | all keys | all values]", W[:, _qkv_blocks_order(H, hd)]),
            ("values are not rotated: leave every head's value columns in their order (the "
             "output projection expects them that way)", W[:, _fused_order(H, hd, v=True)]),
            ("you reordered each head's 3*head_dim columns as one block; head_dim is "
             "W_qkv.shape[1] // (3 * num_heads), and the order [0, 2, 4, ..., 1, 3, 5, ...] "
             "goes inside the query block and inside the key block separately",
             W[:, np.concatenate([h * 3 * hd + _pi(3 * hd) for h in range(H)])]),
            ("reorder within each head: you reordered all the columns of W_qkv at once",
             W[:, _pi(H * 3 * hd)]),
            ("reorder the keys too: a score pairs a rotated query with a rotated key, so both "
             "must use the half-split pairing", W[:, _fused_order(H, hd, k=False)]),
            ("reorder the queries too: a score pairs a rotated query with a rotated key, so both "
             "must use the half-split pairing", W[:, _fused_order(H, hd, q=False)]),
            ("that is the other direction (half-split to interleaved): the half-split model's "
             "feature j must be the interleaved model's feature order[j], i.e. W[:, order]",
             W[:, _fused_order(H, hd, perm=lambda n: np.argsort(_pi(n)))]),
            ("reorder the columns (output features), not the rows (input features)",
             W[_fused_order(H, hd)] if square else None),
            ("W_qkv is the math's (d_in, num_heads * 3 * head_dim) matrix: reorder its columns, "
             "don't transpose it", ref.T if square else None),
        ], atol=1e-12)
        bad = np.flatnonzero(~np.isclose(got, ref, atol=1e-12, rtol=0).all(axis=0))[0]
        h, part = divmod(int(bad) // hd, 3)
        raise _Wrong(f"for num_heads = {H}, head_dim = {hd}: the first wrong column is {bad}, "
                     f"in head {h}'s {('query', 'key', 'value')[part]} block (columns "
                     f"{h * 3 * hd + part * hd} .. {h * 3 * hd + (part + 1) * hd - 1})")
    return (f"the half-split model reproduces the interleaved model's scores and values (max "
            f"diff {'< 1e-12' if worst < 1e-12 else f'{worst:.1e}'}); only the query and key "
            "columns moved.")


# --------------------------------------------------------------------------------------------
# 7.4 ALiBi: how much weight lies beyond a distance, in closed form
# --------------------------------------------------------------------------------------------
HUGE_T = 10**15  # keys: far too many for any softmax or loop


def _geometric_mass(slope: float, T: int, dist: int, sign: float = -1.0) -> float:
    """sum_{k=dist+1}^{T-1} r^k / sum_{k=0}^{T-1} r^k with r = exp(sign * slope), computed with
    expm1 (no cancellation); 0 when no key lies beyond ``dist``."""
    if dist >= T - 1:
        return 0.0
    a = sign * slope
    if a < 0:  # r < 1: r^(dist+1) (1 - r^(T-dist-1)) / (1 - r^T)
        return math.exp(a * (dist + 1)) * math.expm1(a * (T - dist - 1)) / math.expm1(a * T)
    # r > 1: divide through by r^(T-1) so that nothing overflows
    return -math.expm1(-a * (T - dist - 1)) / -math.expm1(-a * T)


@_checker
def check_alibi_mass_beyond(alibi_mass_beyond):
    """``alibi_mass_beyond(slope, T, distance)`` -> one number: the total attention weight that
    the last query of a causal sequence of ``T`` tokens puts on keys farther than ``distance``
    (``i - j > distance``) when every content score is equal and ALiBi adds ``-slope * (i - j)``.
    Hidden cases include ``T = 10**15``: only a closed form answers them."""
    notes = {}
    for slope, T, dist in ((0.5, 64, 8), (1 / 256, 64, 16), (1 / 16, 200, 32), (0.25, 10, 20),
                           (0.5, 8, 0), (1 / 64, 1000, 100), (1 / 256, HUGE_T, 1000),
                           (2.0 ** -20, HUGE_T, 10**6), (0.5, HUGE_T, 3)):
        try:
            ans = _call(alibi_mass_beyond, slope, T, dist, name="alibi_mass_beyond")
        except _Wrong as e:
            if T != HUGE_T:
                raise
            why = ("it ran for more than 5 s" if "still running" in e.args[0] else
                   "it raised " + e.args[0].split(" raised ", 1)[-1].split(":", 1)[0]
                   if " raised " in e.args[0] else e.args[0])
            raise _Wrong(f"right for small T, but for T = 10**15 {why}: no softmax can hold "
                         "10**15 keys and no loop can visit them; the weights form a geometric "
                         "sequence, so sum it on paper (a closed form)") from None
        got = _number(ans, "alibi_mass_beyond's result")
        ref = _geometric_mass(slope, T, dist)
        if math.isfinite(got) and math.isclose(got, ref, rel_tol=1e-6, abs_tol=1e-9):
            notes[(slope, T, dist)] = ref
            continue
        r = math.exp(-slope)
        small = T <= 1000
        raw = (r ** (dist + 1) - r ** T) / (1 - r ** T)  # the closed form without the edge case
        for hint, value in (
            ("when distance >= T - 1 no key lies beyond it, so the weight is 0; your formula "
             "went negative there", raw if ref == 0.0 else None),
            ("farther than `distance` means i - j > distance: you also counted the key at "
             "exactly that distance", _geometric_mass(slope, T, dist - 1) if dist >= 1 else None),
            ("that is the weight WITHIN the distance; the question asks for the weight beyond it",
             1.0 - ref),
            ("the bias is a penalty, -slope * distance: farther keys get less weight, not more",
             _geometric_mass(slope, T, dist, +1.0) if small else None),
            ("normalise: divide by the sum of exp(-slope * distance) over all T keys (that is "
             "the softmax)", (r ** (dist + 1) - r ** T) / (1 - r) if ref > 0 else None),
            ("there are only T keys (distances 0 .. T-1): the sums are finite, not infinite "
             "geometric series", math.exp(-slope * (dist + 1))),
            ("there are T keys, distances 0 .. T-1: both sums stop at r^(T-1), so the closed "
             "form has r^T, not r^(T+1)", _geometric_mass(slope, T + 1, dist)),
            ("there are T keys, distances 0 .. T-1: both sums stop at r^(T-1), so the closed "
             "form has r^T, not r^(T-1)", _geometric_mass(slope, T - 1, dist)),
        ):
            if value is not None and math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9):
                raise _Wrong(hint)
        raise _Wrong(f"for slope = {slope:g}, T = {T:g}, distance = {dist} the weight beyond is "
                     f"{ref:.8g}; got {got:.8g}, off by {got - ref:.2g}, more than "
                     "the checker's relative tolerance of 1e-6")
    return ("with T = 64, a head with slope 1/2 puts "
            f"{notes[(0.5, 64, 8)]:.4f} of its weight beyond 8 tokens. For large T the mass "
            "beyond D is just e^(-slope (D+1)): a head with slope 1/256 keeps about half its "
            "weight (0.4989) beyond 177 tokens, however long the input.")
