"""The checkers of notebook 07 (RoPE and ALiBi): each accepts a reference solution, says "not
attempted yet" for the shipped stub, and rejects typical wrong answers with the hint that names the
mistake. The reference solutions here are written independently of the checkers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shared import exercises as ex
from tests.checker_helpers import NA, OK, case_id, run, stub, stub_raises  # noqa: F401


# 7.1 ntk_base ---------------------------------------------------------------------------------
def ntk_ok(base, head_dim, scale):
    return base * scale ** (head_dim / (head_dim - 2))


def ntk_by_solving(base, head_dim, scale):  # solve for the slowest pair's angle numerically
    slow = base ** (-(head_dim - 2) / head_dim) / scale
    return slow ** (-head_dim / (head_dim - 2))


def ntk_times_scale(base, head_dim, scale):
    return base * scale


def ntk_inverted_exponent(base, head_dim, scale):
    return base * scale ** ((head_dim - 2) / head_dim)


def ntk_divided(base, head_dim, scale):
    return base / scale


def ntk_power(base, head_dim, scale):
    return base ** scale


def ntk_off_by_one(base, head_dim, scale):
    return base * scale ** (head_dim / (head_dim - 1))


def ntk_tensor(base, head_dim, scale):
    return torch.tensor(ntk_ok(base, head_dim, scale), dtype=torch.float64)


def ntk_rounded(base, head_dim, scale):
    return round(ntk_ok(base, head_dim, scale), -2)


# 7.2 shift_change ------------------------------------------------------------------------------
def shift_ok(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    before = encode(Q, p) @ encode(K, p).T
    after = encode(Q, p + offset) @ encode(K, p + offset).T
    return (before - after).abs().max().item()


def shift_numpy_list_positions(encode, Q, K, offset):
    p = list(range(Q.shape[0]))
    q = [m + offset for m in p]
    before = (encode(Q, p) @ encode(K, p).T).numpy()
    after = (encode(Q, q) @ encode(K, q).T).numpy()
    return float(np.max(np.abs(before - after)))


def shift_self(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    s = encode(Q, p) @ encode(K, p).T
    return (s - s).abs().max().item()


def shift_queries_only(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    before = encode(Q, p) @ encode(K, p).T
    after = encode(Q, p + offset) @ encode(K, p).T
    return (before - after).abs().max().item()


def shift_no_abs(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    return (encode(Q, p) @ encode(K, p).T - encode(Q, p + offset) @ encode(K, p + offset).T).max().item()


def shift_mean(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    return (encode(Q, p) @ encode(K, p).T - encode(Q, p + offset) @ encode(K, p + offset).T).abs().mean().item()


def shift_matrix(encode, Q, K, offset):
    p = torch.arange(Q.shape[0])
    return (encode(Q, p) @ encode(K, p).T - encode(Q, p + offset) @ encode(K, p + offset).T).abs()


def shift_float_positions(encode, Q, K, offset):
    p = torch.arange(Q.shape[0], dtype=torch.float64)
    return (encode(Q, p) @ encode(K, p).T).max().item()


# 7.3 to_half_split (fused GPT-NeoX layout) ----------------------------------------------------
def fused_ok(W, num_heads):
    d_in, head_dim = W.shape[0], W.shape[1] // (3 * num_heads)
    blocks = W.reshape(d_in, num_heads, 3, head_dim).clone()  # (d_in, head, q/k/v, feature)
    qk = blocks[:, :, :2].reshape(d_in, num_heads, 2, head_dim // 2, 2)  # (..., pair, member)
    blocks[:, :, :2] = qk.transpose(-1, -2).reshape(d_in, num_heads, 2, head_dim)
    return blocks.reshape(W.shape)


def fused_loop(W, num_heads):
    head_dim = W.shape[1] // (3 * num_heads)
    order = []
    for h in range(num_heads):
        for block in range(3):
            start = (3 * h + block) * head_dim
            if block == 2:  # values: untouched
                order += range(start, start + head_dim)
            else:
                order += [start + j for j in [*range(0, head_dim, 2), *range(1, head_dim, 2)]]
    return W[:, order]


def fused_numpy(W, num_heads):
    return fused_ok(torch.as_tensor(W), num_heads).numpy()


def _pi(n):
    return [*range(0, n, 2), *range(1, n, 2)]


def fused_cell_27(W, num_heads):  # notebook 07's head_order, applied to the fused columns
    head_dim = W.shape[1] // num_heads
    return W[:, [h * head_dim + j for h in range(num_heads) for j in _pi(head_dim)]]


def fused_qkv_blocks(W, num_heads):  # as if W were [all queries | all keys | all values]
    n = W.shape[1] // 3
    head_dim = n // num_heads
    within = [h * head_dim + j for h in range(num_heads) for j in _pi(head_dim)]
    return W[:, within + [n + c for c in within] + list(range(2 * n, 3 * n))]


def _fused_with(W, num_heads, blocks, perm=_pi):
    head_dim = W.shape[1] // (3 * num_heads)
    order = []
    for h in range(num_heads):
        for block in range(3):
            start = (3 * h + block) * head_dim
            order += [start + j for j in (perm(head_dim) if block in blocks else range(head_dim))]
    return W[:, order]


def fused_values_too(W, num_heads):
    return _fused_with(W, num_heads, (0, 1, 2))


def fused_queries_only(W, num_heads):
    return _fused_with(W, num_heads, (0,))


def fused_keys_only(W, num_heads):
    return _fused_with(W, num_heads, (1,))


def fused_inverse(W, num_heads):
    return _fused_with(W, num_heads, (0, 1), perm=lambda n: np.argsort(_pi(n)).tolist())


def fused_all_at_once(W, num_heads):
    return W[:, _pi(W.shape[1])]


def fused_rows(W, num_heads):  # reorders the input features instead (W is square in case 1)
    return fused_ok(W.T.contiguous(), num_heads).T


def fused_unchanged(W, num_heads):
    return W.clone()


def fused_transposed(W, num_heads):
    return fused_ok(W, num_heads).T


def fused_in_place(W, num_heads):
    W[:] = fused_ok(W.clone(), num_heads)
    return W


def fused_one_column_off(W, num_heads):  # right except two swapped value columns of head 0
    out = fused_ok(W, num_heads)
    head_dim = W.shape[1] // (3 * num_heads)
    out[:, [2 * head_dim, 2 * head_dim + 1]] = out[:, [2 * head_dim + 1, 2 * head_dim]]
    return out


# 7.4 alibi_mass_beyond (closed form; the checker uses T = 10**15) -------------------------------
def mass_closed_form(slope, T, distance):
    if distance >= T - 1:
        return 0.0
    r = math.exp(-slope)
    return (r ** (distance + 1) - r ** T) / (1 - r ** T)


def mass_expm1(slope, T, distance):  # the same sum, written with exp(-slope * n) directly
    if distance + 1 >= T:
        return 0.0
    return (math.exp(-slope * (distance + 1)) - math.exp(-slope * T)) / -math.expm1(-slope * T)


def mass_softmax(slope, T, distance):  # section 10's last_query_weights: fine for small T only
    w = torch.softmax(-slope * torch.arange(T, dtype=torch.float64), dim=0)
    return w[distance + 1:].sum().item()


def mass_loop(slope, T, distance):  # a Python loop over every key
    total = beyond = 0.0
    for k in range(T):
        total += math.exp(-slope * k)
        if k > distance:
            beyond += math.exp(-slope * k)
    return beyond / total


def mass_no_edge(slope, T, distance):
    r = math.exp(-slope)
    return (r ** (distance + 1) - r ** T) / (1 - r ** T)


def mass_off_by_one(slope, T, distance):
    return mass_closed_form(slope, T, distance - 1)


def mass_within(slope, T, distance):
    return 1.0 - mass_closed_form(slope, T, distance)


def mass_plus_sign(slope, T, distance):
    return mass_softmax(-slope, T, distance)


def mass_unnormalised(slope, T, distance):
    r = math.exp(-slope)
    return max(r ** (distance + 1) - r ** T, 0.0) / (1 - r)


def mass_infinite(slope, T, distance):
    return math.exp(-slope * (distance + 1))


def mass_T_plus_1(slope, T, distance):
    return mass_closed_form(slope, T + 1, distance)


def mass_T_minus_1(slope, T, distance):
    return mass_closed_form(slope, T - 1, distance)


def mass_truncated(slope, T, distance):  # brute force over at most 10**7 keys: drops r^T's tiny share
    return mass_closed_form(slope, min(T, 10**7), distance)


C = ex
CASES = [
    (C.check_ntk_base, (ntk_ok,), True, "about 41,800"),
    (C.check_ntk_base, (ntk_by_solving,), True, OK),
    (C.check_ntk_base, (ntk_tensor,), True, OK),
    (C.check_ntk_base, (stub,), None, NA),
    (C.check_ntk_base, (ntk_times_scale,), False, "b * scale would be right if"),
    (C.check_ntk_base, (ntk_inverted_exponent,), False, "the exponent is upside down"),
    (C.check_ntk_base, (ntk_divided,), False, "a smaller base makes every pair turn *faster*"),
    (C.check_ntk_base, (ntk_power,), False, "base ** scale is far too large"),
    (C.check_ntk_base, (ntk_off_by_one,), False, "count the pairs from 0"),
    (C.check_ntk_base, (ntk_rounded,), False, "the slowest pair should turn by"),
    (C.check_shift_change, (shift_ok,), True, "RoPE's scores moved by less than 1e-10"),
    (C.check_shift_change, (shift_numpy_list_positions,), True, OK),
    (C.check_shift_change, (stub,), None, NA),
    (C.check_shift_change, (shift_self,), False, "not with themselves"),
    (C.check_shift_change, (shift_queries_only,), False, "shift the keys' positions too"),
    (C.check_shift_change, (shift_no_abs,), False, "absolute value"),
    (C.check_shift_change, (shift_mean,), False, "not the average"),
    (C.check_shift_change, (shift_matrix,), False, "should be one number; got an array of shape (6, 6)"),
    (C.check_shift_change, (shift_float_positions,), False, "positions must be a 1-D sequence of integers"),
    (C.check_to_half_split, (fused_ok,), True, "only the query and key columns moved"),
    (C.check_to_half_split, (fused_loop,), True, "max diff < 1e-12"),
    (C.check_to_half_split, (fused_numpy,), True, OK),
    (C.check_to_half_split, (stub,), None, NA),
    (C.check_to_half_split, (fused_cell_27,), False, "as one block"),
    (C.check_to_half_split, (fused_qkv_blocks,), False, "[all queries | all keys | all values]"),
    (C.check_to_half_split, (fused_values_too,), False, "values are not rotated"),
    (C.check_to_half_split, (fused_queries_only,), False, "reorder the keys too"),
    (C.check_to_half_split, (fused_keys_only,), False, "reorder the queries too"),
    (C.check_to_half_split, (fused_inverse,), False, "other direction"),
    (C.check_to_half_split, (fused_all_at_once,), False, "all the columns of W_qkv at once"),
    (C.check_to_half_split, (fused_rows,), False, "not the rows"),
    (C.check_to_half_split, (fused_unchanged,), False, "came back unchanged"),
    (C.check_to_half_split, (fused_transposed,), False, "don't transpose it"),
    (C.check_to_half_split, (fused_in_place,), False, "changed W_qkv in place"),
    (C.check_to_half_split, (fused_one_column_off,), False, "in head 0's value block (columns 8 .. 11)"),
    (C.check_alibi_mass_beyond, (mass_closed_form,), True, "slope 1/2 puts 0.0111"),
    (C.check_alibi_mass_beyond, (mass_expm1,), True, "beyond 177 tokens"),
    (C.check_alibi_mass_beyond, (stub,), None, NA),
    (C.check_alibi_mass_beyond, (mass_softmax,), False, "for T = 10**15 it raised RuntimeError"),
    (C.check_alibi_mass_beyond, (mass_loop,), False, "for T = 10**15 it ran for more than 5 s"),
    (C.check_alibi_mass_beyond, (mass_no_edge,), False, "no key lies beyond it"),
    (C.check_alibi_mass_beyond, (mass_off_by_one,), False, "exactly that distance"),
    (C.check_alibi_mass_beyond, (mass_within,), False, "WITHIN"),
    (C.check_alibi_mass_beyond, (mass_plus_sign,), False, "penalty"),
    (C.check_alibi_mass_beyond, (mass_unnormalised,), False, "normalise"),
    (C.check_alibi_mass_beyond, (mass_infinite,), False, "only T keys"),
    (C.check_alibi_mass_beyond, (mass_T_plus_1,), False, "not r^(T+1)"),
    (C.check_alibi_mass_beyond, (mass_T_minus_1,), False, "not r^(T-1)"),
    (C.check_alibi_mass_beyond, (mass_truncated,), False, "is 0.38532225; got 0.3852779, off by -4.4e-05"),
]
CHECKERS = ex.nb07.__all__


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[case_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    assert result.passed is expected, out
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    for name in CHECKERS:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 2, name
    assert set(CHECKERS) <= set(ex.__all__)


def test_reference_solutions_are_right():
    """The references above against independent facts, not against the checkers."""
    # NTK base: the slowest pair turns `scale` times slower, pair 0 exactly as before
    from shared.positional import apply_rope, rope_frequencies, rope_permutation

    for base, d, scale in ((10_000.0, 64, 4.0), (500_000.0, 128, 2.0), (10_000.0, 8, 4.0)):
        old, new = rope_frequencies(d, base), rope_frequencies(d, ntk_ok(base, d, scale))
        assert float(new[0]) == float(old[0]) == 1.0
        assert float(old[-1] / new[-1]) == pytest.approx(scale, rel=1e-9)
        assert ntk_by_solving(base, d, scale) == pytest.approx(ntk_ok(base, d, scale), rel=1e-12)
    # RoPE scores are shift invariant; an identity "encoding" trivially too
    Q, K = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    assert shift_ok(lambda x, q: apply_rope(x, q), Q, K, 40) < 1e-10
    assert shift_ok(lambda x, q: x + torch.as_tensor(q)[:, None], Q, K, 3) > 1
    # the fused conversion: an interleaved model with W and a half-split model with the converted
    # W give the same scores and the same values; the index version equals the reshape version
    torch.manual_seed(3)
    H, hd, d_in, T = 2, 6, 5, 7
    W, X, pos = torch.randn(d_in, H * 3 * hd, dtype=torch.float64), torch.randn(T, d_in, dtype=torch.float64), torch.arange(T)

    def qkv(W, interleaved):
        q, k, v = (X @ W).view(T, H, 3, hd).permute(2, 1, 0, 3)
        return apply_rope(q, pos, interleaved=interleaved), apply_rope(k, pos, interleaved=interleaved), v

    (q_i, k_i, v_i), (q_h, k_h, v_h) = qkv(W, True), qkv(fused_ok(W, H), False)
    torch.testing.assert_close(q_h @ k_h.transpose(-1, -2), q_i @ k_i.transpose(-1, -2), rtol=0, atol=1e-12)
    assert torch.equal(v_h, v_i)
    torch.testing.assert_close(fused_loop(W, H), fused_ok(W, H), rtol=0, atol=0)
    q_w, k_w, _ = qkv(fused_ok(W, H), True)  # the converted W under the OLD convention: wrong
    assert (q_w @ k_w.transpose(-1, -2) - q_i @ k_i.transpose(-1, -2)).abs().max() > 0.1
    blocks, converted = W.view(d_in, H, 3, hd), fused_ok(W, H).view(d_in, H, 3, hd)  # per head: q, k, v
    for b in (0, 1):  # queries and keys: reordered by rope_permutation inside every head
        assert torch.equal(converted[:, :, b], blocks[:, :, b][..., rope_permutation(hd)])
    # ALiBi mass: the closed forms agree with the softmax; a uniform head (slope -> 0) gives (T - d - 1) / T
    for slope, T, d in ((0.5, 64, 8), (1 / 256, 64, 16), (0.1, 5, 10), (1 / 64, 1000, 100)):
        assert mass_closed_form(slope, T, d) == pytest.approx(mass_softmax(slope, T, d), abs=1e-12)
        assert mass_expm1(slope, T, d) == pytest.approx(mass_softmax(slope, T, d), abs=1e-12)
    assert mass_softmax(1e-12, 10, 3) == pytest.approx(6 / 10)
    assert mass_closed_form(1 / 256, 10**15, 1000) == pytest.approx(math.exp(-1001 / 256), rel=1e-12)


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0), lambda *a, **k: float("nan")]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    for name in CHECKERS:
        getattr(ex, name)(stub)
    ex.check_shift_change(shift_ok)
    ex.check_to_half_split(fused_ok)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002
