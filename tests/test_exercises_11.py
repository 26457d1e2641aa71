"""Notebook 11's checkers: each accepts an independent reference solution, says "not attempted yet"
for the shipped stub, and rejects typical wrong answers with the hint that names the mistake. The
tile counts' reference formula is checked against PyTorch's own create_block_mask."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from shared.exercises import nb11
from shared.generation import KVCache
from shared.modules import naive_attention
from tests.checker_helpers import NA, OK, run, stub, stub_raises  # noqa: F401


def mod_factory(rule):
    """``rule(q_idx, kv_idx, n)`` -> a factory ``n -> mask_mod``."""
    def factory(n):
        def mask_mod(b, h, q_idx, kv_idx):
            return rule(q_idx, kv_idx, n)
        return mask_mod
    return factory


# 11.1 ------------------------------------------------------------------------------------------
chunked_ok = mod_factory(lambda q, k, c: (q // c == k // c) & (k <= q))
chunked_where = mod_factory(lambda q, k, c: torch.where(k > q, False, q // c == k // c))
chunked_no_causal = mod_factory(lambda q, k, c: q // c == k // c)
chunked_window = mod_factory(lambda q, k, c: (k <= q) & (q - k < c))
chunked_modulo = mod_factory(lambda q, k, c: (q % c >= k % c) & (k <= q))
chunked_plain_causal = mod_factory(lambda q, k, c: k <= q)
chunked_inverted = mod_factory(lambda q, k, c: ~((q // c == k // c) & (k <= q)))
chunked_transposed = mod_factory(lambda q, k, c: (q // c == k // c) & (k >= q))
chunked_too_long = mod_factory(lambda q, k, c: (q // (c + 1) == k // (c + 1)) & (k <= q))
chunked_python_and = mod_factory(lambda q, k, c: (q // c == k // c) and (k <= q))
chunked_float = mod_factory(lambda q, k, c: ((q // c == k // c) & (k <= q)).float())


# 11.2 ------------------------------------------------------------------------------------------
window_ok = mod_factory(lambda q, k, w: (q - k >= 0) & (q - k <= w - 1))
window_still_buggy = mod_factory(lambda q, k, w: (k <= q) & (k >= q - w))
window_over = mod_factory(lambda q, k, w: (k <= q) & (k > q - w + 1))
window_future = mod_factory(lambda q, k, w: (q - k).abs() < w)
window_no_window = mod_factory(lambda q, k, w: k <= q)


# 11.3 ------------------------------------------------------------------------------------------
def tiles_ok(T, block_size, window):
    """Per diagonal offset d = q_block - k_block: the n - d tiles hold i - j from
    d*bs - (bs - 1) to d*bs + (bs - 1); full when all of it is in [0, window), computed when some
    of it is (written independently of the checker's reference, as closed-form ranges)."""
    n, bs = T // block_size, block_size
    d_full_max = (window - bs) // bs  # d*bs + bs - 1 < window  <=>  d <= (window - bs) // bs
    d_any_max = min(n - 1, (window + bs - 2) // bs)  # d*bs - bs + 1 < window
    full = sum(n - d for d in range(1, min(n - 1, d_full_max) + 1))
    computed = sum(n - d for d in range(0, d_any_max + 1))
    return full, computed - full


def tiles_swapped(T, bs, w):
    return tiles_ok(T, bs, w)[::-1]


def tiles_causal(T, bs, w):
    n = T // bs
    return n * (n - 1) // 2, n


def tiles_all_partial(T, bs, w):
    return 0, sum(tiles_ok(T, bs, w))


def tiles_wider(T, bs, w):
    return tiles_ok(T, bs, w + 1)


def tiles_dense(T, bs, w):  # builds the (T, T) mask: far too slow at T = 4 million
    return tuple(int(x) for x in np.zeros(2) + np.ones((T, T), dtype=bool).sum())


# 11.4 ------------------------------------------------------------------------------------------
def bias_factory(index):
    """``index(table, h, q_idx, kv_idx, R)`` -> the added bias; a factory table -> score_mod."""
    def relative_bias(table):
        R = (table.shape[1] - 1) // 2

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + index(table, h, q_idx, kv_idx, R)
        return score_mod
    return relative_bias


bias_ok = bias_factory(lambda t, h, q, k, R: t[h, torch.clamp(k - q, -R, R) + R])
bias_where = bias_factory(lambda t, h, q, k, R: t[h, torch.where(k - q > R, 2 * R, torch.where(
    k - q < -R, 0, k - q + R))])
bias_no_clamp = bias_factory(lambda t, h, q, k, R: t[h, k - q + R])
bias_no_offset = bias_factory(lambda t, h, q, k, R: t[h, torch.clamp(k - q, -R, R)])
bias_offset_too_big = bias_factory(lambda t, h, q, k, R: t[h, torch.clamp(k - q, -R, R) + R + 1])
bias_offset_too_small = bias_factory(lambda t, h, q, k, R: t[h, torch.clamp(k - q, -R, R) + R - 1])
bias_head0 = bias_factory(lambda t, h, q, k, R: t[0, torch.clamp(k - q, -R, R) + R])
bias_mirrored = bias_factory(lambda t, h, q, k, R: t[h, torch.clamp(q - k, -R, R) + R])
bias_detached = bias_factory(lambda t, h, q, k, R: t.detach()[h, torch.clamp(k - q, -R, R) + R])
bias_subtracted = bias_factory(lambda t, h, q, k, R: -t[h, torch.clamp(k - q, -R, R) + R])


def bias_alone(table):
    R = (table.shape[1] - 1) // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return table[h, torch.clamp(kv_idx - q_idx, -R, R) + R] + 0 * score
    return score_mod


def bias_python_min(table):
    R = (table.shape[1] - 1) // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, min(max(int(kv_idx - q_idx), -R), R) + R]
    return score_mod


C = nb11
CASES = [
    (C.check_chunked_causal, (chunked_ok,), True, OK),
    (C.check_chunked_causal, (chunked_where,), True, OK),
    (C.check_chunked_causal, (stub,), None, NA),
    (C.check_chunked_causal, (stub_raises,), None, NA),
    (C.check_chunked_causal, (chunked_no_causal,), False, "still causal"),
    (C.check_chunked_causal, (chunked_window,), False, "sliding window"),
    (C.check_chunked_causal, (chunked_modulo,), False, "position inside a chunk"),
    (C.check_chunked_causal, (chunked_plain_causal,), False, "plain causal attention"),
    (C.check_chunked_causal, (chunked_inverted,), False, "True means MAY attend"),
    (C.check_chunked_causal, (chunked_transposed,), False, "transpose"),
    (C.check_chunked_causal, (chunked_too_long,), False, "one token too long"),
    (C.check_chunked_causal, (chunked_python_and,), False, "& and |"),
    (C.check_chunked_causal, (chunked_float,), False, "must return booleans"),
    (C.check_window_bug, (4, window_ok), True, OK),
    (C.check_window_bug, (None, stub), None, NA),
    (C.check_window_bug, (4, stub), None, NA),
    (C.check_window_bug, (None, window_ok), False, "fill in first_wrong_query"),
    (C.check_window_bug, (5, window_ok), False, "too late"),
    (C.check_window_bug, (9, window_ok), False, "too late"),
    (C.check_window_bug, (3, window_ok), False, "too early"),
    (C.check_window_bug, (0, window_ok), False, "too early"),
    (C.check_window_bug, (4.0, window_ok), False, "one integer"),
    (C.check_window_bug, (4, window_still_buggy), False, "still the bug"),
    (C.check_window_bug, (4, window_over), False, "over-corrected"),
    (C.check_window_bug, (4, window_future), False, "future leaked"),
    (C.check_window_bug, (4, window_no_window), False, "window is gone"),
    (C.check_tile_counts, (tiles_ok,), True, OK),
    (C.check_tile_counts, (stub,), None, NA),
    (C.check_tile_counts, (stub_raises,), None, NA),
    (C.check_tile_counts, (tiles_swapped,), False, "swapped"),
    (C.check_tile_counts, (tiles_causal,), False, "plain causal attention"),
    (C.check_tile_counts, (tiles_all_partial,), False, "every computed tile as partial"),
    (C.check_tile_counts, (tiles_wider,), False, "one key wider"),
    (C.check_tile_counts, (tiles_dense,), False, "build no (T, T) mask"),
    (C.check_relative_bias, (bias_ok,), True, OK),
    (C.check_relative_bias, (bias_where,), True, OK),
    (C.check_relative_bias, (stub,), None, NA),
    (C.check_relative_bias, (stub_raises,), None, NA),
    (C.check_relative_bias, (bias_no_clamp,), False, "clamp the distance"),
    (C.check_relative_bias, (bias_offset_too_big,), False, "although every distance fits"),
    (C.check_relative_bias, (bias_offset_too_small,), False, "off by one"),
    (C.check_relative_bias, (bias_no_offset,), False, "shift the clamped distance by R"),
    (C.check_relative_bias, (bias_head0,), False, "its own row"),
    (C.check_relative_bias, (bias_mirrored,), False, "mirrored"),
    (C.check_relative_bias, (bias_subtracted,), False, "not subtracted"),
    (C.check_relative_bias, (bias_alone,), False, "not the bias alone"),
    (C.check_relative_bias, (bias_detached,), False, "no gradient"),
    (C.check_relative_bias, (bias_python_min,), False, "Python value"),
    (C.check_stale_prediction, ([0, 1, 2, 3, 6, 7],), True, OK),
    (C.check_stale_prediction, ((7, 6, 3, 2, 1, 0),), True, OK),
    (C.check_stale_prediction, (None,), None, NA),
    (C.check_stale_prediction, ([6, 7],), False, "what the new mask allows"),
    (C.check_stale_prediction, (list(range(8)),), False, "that is the old mask"),
    (C.check_stale_prediction, ([6, 7, 8],), False, "keys 0-3: for query 7's block, that tile was FULL"),
    (C.check_stale_prediction, ([0, 1, 2, 3, 4, 5, 6],), False, "keys 4-7: for query 7's block, that tile was PARTIAL"),
    (C.check_stale_prediction, ([0, 1, 2, 3, 6, 7, 8, 9],), False, "that tile was EMPTY"),
    (C.check_stale_prediction, ("0-3, 6, 7",), False, "list of key indices"),
    (C.check_stale_prediction, ([0, 12],), False, "keys run from 0 to 11"),
]


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, *_) in enumerate(CASES)])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    assert result.passed is expected, out
    assert phrase in out, out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    for name in nb11.__all__:
        rows = [(e, p) for c, _, e, p in CASES if c.__name__ == name]
        assert {True, None} <= {e for e, _ in rows}, name
        assert len({p for e, p in rows if e is False}) >= 2, name


def test_checkers_are_exported_and_shaped_like_the_others():
    for name in nb11.__all__:
        assert callable(getattr(nb11, name)) and name.startswith("check_")


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2, 3), lambda *a, **k: torch.zeros(2, 2),
           lambda *a, **k: (lambda b, h, q, kv: q)]
    for answer in odd:
        for checker, args in ((nb11.check_chunked_causal, (answer,)),
                              (nb11.check_tile_counts, (answer,)),
                              (nb11.check_window_bug, (4, answer)),
                              (nb11.check_window_bug, (answer, window_ok)),
                              (nb11.check_relative_bias, (answer,)),
                              (nb11.check_stale_prediction, (answer,))):
            result = checker(*args)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (checker.__name__, answer, out)
            assert out.count("\n") == 1, (checker.__name__, out)


# --------------------------------------------------------------------- independent facts
@pytest.mark.parametrize("T, bs, w", [(64, 16, 16), (128, 8, 20), (96, 32, 1), (64, 8, 64),
                                      (48, 16, 200), (128, 16, 33), (256, 32, 100)])
def test_tile_formulas_match_pytorchs_block_mask(T, bs, w):
    def mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < w)

    bm = create_block_mask(mod, None, None, T, T, device="cpu", BLOCK_SIZE=bs)
    full, partial = int(bm.full_kv_num_blocks.sum()), int(bm.kv_num_blocks.sum())
    assert tiles_ok(T, bs, w) == (full, partial)
    assert nb11.sliding_window_tiles(T, bs, w) == (full, partial)


def test_the_buggy_window_first_differs_from_the_cache_at_query_4():
    """The notebook's buggy window against decoding through KVCache(window=4), by outputs."""
    T, W = 10, 4
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 1, T, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    cache, rows = KVCache(window=W), []
    for p in range(T):
        K_c, V_c, _ = cache.update(K[:, :, p:p + 1], V[:, :, p:p + 1])
        rows.append(naive_attention(Q[:, :, p:p + 1], K_c, V_c)[0])
    cached = torch.cat(rows, dim=2)[0, 0]

    def buggy(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= q_idx - W)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(Q, K, V, block_mask=create_block_mask(buggy, None, None, T, T,
                                                                   device="cpu", BLOCK_SIZE=2))
    differs = ((out[0, 0] - cached).abs().max(dim=-1).values > 1e-9).tolist()
    assert differs.index(True) == 4 and all(differs[4:])
    fixed = window_ok(W)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(Q, K, V, block_mask=create_block_mask(fixed, None, None, T, T,
                                                                   device="cpu", BLOCK_SIZE=2))
    assert torch.allclose(out[0, 0], cached, atol=1e-12)


def test_chunked_reference_by_brute_force():
    from torch.nn.attention.flex_attention import create_mask

    got = create_mask(chunked_ok(3), None, None, 8, 8, device="cpu")[0, 0]
    expected = torch.tensor([[j <= i and i // 3 == j // 3 for j in range(8)] for i in range(8)])
    assert torch.equal(got, expected)


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    nb11.check_chunked_causal(chunked_ok)
    nb11.check_tile_counts(tiles_ok)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002


def test_window_hints_never_name_the_answer(capsys):
    for guess in (0, 1, 2, 3, 5, 6, 9):
        nb11.check_window_bug(guess, window_ok)
        out = capsys.readouterr().out
        assert "4" not in out.replace("key q - window", ""), out


def test_stale_prediction_matches_a_compiled_free_brute_force():
    """Independent of effective_mask: rebuild the stale row from the old tiles by hand."""
    old, new, q, bs = nb11.STALE_OLD_IDS, nb11.STALE_NEW_IDS, 7, 4

    def allowed(ids, i, j):
        return ids[i] == ids[j] and j <= i

    keys = []
    rows = range(q // bs * bs, q // bs * bs + bs)
    for t in range(len(old) // bs):
        cols = range(t * bs, (t + 1) * bs)
        olds = [allowed(old, i, j) for i in rows for j in cols]
        if all(olds):
            keys += list(cols)
        elif any(olds):
            keys += [j for j in cols if allowed(new, q, j)]
    assert keys == nb11.stale_keys() == [0, 1, 2, 3, 6, 7]


def test_relative_bias_reference_against_a_loop():
    table = torch.arange(14.0).reshape(2, 7)  # R = 3
    got = nb11._reference_bias(table, 9)
    for h in range(2):
        for i in range(9):
            for j in range(9):
                assert got[h, i, j] == table[h, min(max(j - i, -3), 3) + 3]
