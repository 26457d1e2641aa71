"""Exercise checkers for notebook 11 Every mask in one API: FlexAttention (PyTorch)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ._core import _call, _checker, _NotAttempted, _time_limit, _TimedOut, _Wrong

__all__ = [
    "check_chunked_causal",
    "check_window_bug",
    "check_tile_counts",
    "check_relative_bias",
    "check_stale_prediction",
]


def _ij(T: int):
    """Query indices ``(T, 1)`` and key indices ``(1, T)``, to broadcast into ``(T, T)`` masks."""
    return np.arange(T)[:, None], np.arange(T)[None, :]


def _full(x, T: int) -> np.ndarray:
    return np.broadcast_to(x, (T, T))


_WARM = []


def _warm_up() -> None:
    """Import and run FlexAttention's mask machinery once, outside any time limit: its first use
    imports torch._dynamo, which takes seconds on a busy machine, and an import cut short by the
    time limit would leave it half-initialised."""
    if not _WARM:
        from torch.nn.attention.flex_attention import create_mask

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            create_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 2, 2,
                        device="cpu")
        _WARM.append(True)


def _evaluate(mask_mod, T: int, what: str) -> np.ndarray:
    """Run a learner's mask_mod the way FlexAttention does (``torch.vmap`` over the indices, via
    ``create_mask``) and return the ``(T, T)`` boolean mask."""
    from torch.nn.attention.flex_attention import create_mask

    _warm_up()
    if not callable(mask_mod):
        raise _Wrong(f"{what} should return a mask_mod, a function (b, h, q_idx, kv_idx) -> bool "
                     f"tensor; got {type(mask_mod).__name__}")
    try:
        with _time_limit(5.0), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask = create_mask(mask_mod, None, None, T, T, device="cpu")
    except _TimedOut:
        raise _Wrong(f"the mask_mod from {what} was still running after 5 s") from None
    except TypeError as e:
        raise _Wrong(f"the mask_mod from {what} takes (b, h, q_idx, kv_idx) and must return a "
                     f"boolean tensor ({type(e).__name__}: {e})") from None
    except Exception as e:  # noqa: BLE001 - learner code may raise anything
        text = str(e)
        if "data-dependent" in text or "Boolean value of Tensor" in text or "bool" in text:
            raise _Wrong(f"the mask_mod from {what} uses Python `and`/`or`/`if` on tensors: "
                         "FlexAttention calls it on index tensors, so combine conditions with "
                         "& and | (with parentheses) or torch.where") from None
        raise _Wrong(f"the mask_mod from {what} raised {type(e).__name__}: {text[:200]}") from None
    if mask.dtype != torch.bool:
        raise _Wrong(f"the mask_mod from {what} must return booleans (True = may attend); got "
                     f"{mask.dtype}")
    return mask[0, 0].numpy()


def _first_difference(got: np.ndarray, ref: np.ndarray, what: str) -> str:
    i, j = np.argwhere(got != ref)[0]
    return f"query {i}, key {j} should be {bool(ref[i, j])} {what}"


# --------------------------------------------------------------------------------------------
# 11.1 Chunked causal attention, from a picture
# --------------------------------------------------------------------------------------------
@_checker
def check_chunked_causal(chunked_causal):
    """``chunked_causal(chunk)`` -> a mask_mod: query ``i`` may attend to key ``j`` when both lie
    in the same chunk of ``chunk`` tokens (``i // chunk == j // chunk``) and ``j <= i``."""
    for T, chunk in ((8, 3), (12, 4), (10, 1), (9, 9), (13, 5), (7, 20)):
        mod = _call(chunked_causal, chunk, name="chunked_causal")
        what = f"(T = {T}, chunk = {chunk})"
        i, j = _ij(T)
        got = _evaluate(mod, T, f"chunked_causal({chunk})")
        ref = _full((i // chunk == j // chunk) & (j <= i), T)
        if np.array_equal(got, ref):
            continue
        cands = [
            (~ref, "True means MAY attend: you returned the masked pairs"),
            (ref.T, "rows are queries and columns keys: your mask lets queries see later keys "
                    "and hides earlier ones (the transpose)"),
            (_full(i // chunk == j // chunk, T),
             "inside a chunk attention is still causal: add (kv_idx <= q_idx)"),
            (_full((j <= i) & (i - j < chunk), T),
             "that is a sliding window of `chunk` keys: chunked attention starts afresh at each "
             "chunk boundary, so compare which chunk each index is in, q_idx // chunk"),
            (_full((i % chunk >= j % chunk) & (j <= i), T),
             "q_idx % chunk is the position inside a chunk; which chunk an index falls in is "
             "q_idx // chunk"),
            (_full(j <= i, T),
             "that is plain causal attention: a query must not see keys of earlier chunks"),
            (_full((i // (chunk + 1) == j // (chunk + 1)) & (j <= i), T),
             "your chunks are one token too long: each holds `chunk` tokens, positions "
             "c * chunk .. (c + 1) * chunk - 1"),
            (_full((i // max(chunk - 1, 1) == j // max(chunk - 1, 1)) & (j <= i), T)
             if chunk > 2 else None,
             "your chunks are one token too short: each holds `chunk` tokens, positions "
             "c * chunk .. (c + 1) * chunk - 1"),
        ]
        for value, hint in cands:
            if value is not None and np.array_equal(got, value):
                raise _Wrong(f"{hint} {what}")
        raise _Wrong(_first_difference(got, ref, what))
    return ("the mask of chunked attention (used by Llama 4 in some of its layers): a new chunk "
            "forgets the ones before it.")


# --------------------------------------------------------------------------------------------
# 11.2 The off-by-one window
# --------------------------------------------------------------------------------------------
@_checker
def check_window_bug(first_wrong_query, fixed_window):
    """``first_wrong_query``: the first (0-based) query whose output under the notebook's buggy
    window (``kv_idx >= q_idx - window``, window 4, T = 10) differs from a KV cache that keeps the
    last 4 tokens; ``fixed_window(window)`` -> a mask_mod that agrees with that cache."""
    if first_wrong_query is None:
        _call(fixed_window, 4, name="fixed_window")  # a stub: "not attempted yet"
        raise _Wrong("fill in first_wrong_query too: predict it before you fix the mask")
    if isinstance(first_wrong_query, bool) or not isinstance(first_wrong_query, (int, np.integer)):
        raise _Wrong(f"first_wrong_query should be one integer (a 0-based query index); got "
                     f"{type(first_wrong_query).__name__}")
    W = 4
    if first_wrong_query != W:
        direction = "too early" if first_wrong_query < W else "too late"
        raise _Wrong(f"{direction}: under the bug query q sees keys q - window .. q, one key more "
                     "than the cache keeps, but only once key q - window exists (count from 0); "
                     "which query is the first to have it?")
    for T, w in ((10, 4), (12, 1), (9, 3), (7, 7), (6, 10)):
        mod = _call(fixed_window, w, name="fixed_window")
        what = f"(T = {T}, window = {w})"
        i, j = _ij(T)
        got = _evaluate(mod, T, f"fixed_window({w})")
        ref = _full((j <= i) & (i - j < w), T)
        if np.array_equal(got, ref):
            continue
        cands = [
            (_full((j <= i) & (i - j <= w), T),
             "still the bug: each query sees window + 1 keys; it should see window keys, "
             "itself included (q_idx - kv_idx < window)"),
            (_full((j <= i) & (i - j < w - 1), T) if w > 1 else None,
             "over-corrected: each query now sees window - 1 keys; it should see window keys, "
             "itself included"),
            (_full(np.abs(i - j) < w, T),
             "the future leaked: keys after the query (kv_idx > q_idx) must stay masked"),
            (~ref, "True means MAY attend: you returned the masked pairs"),
            (_full(j <= i, T), "the window is gone: keys `window` or more positions back must "
                               "be masked"),
        ]
        for value, hint in cands:
            if value is not None and np.array_equal(got, value):
                raise _Wrong(f"{hint} {what}")
        raise _Wrong(_first_difference(got, ref, what))
    return "each query now sees exactly what KVCache(window) keeps: its last `window` tokens."


# --------------------------------------------------------------------------------------------
# 11.3 Predict a BlockMask
# --------------------------------------------------------------------------------------------
def sliding_window_tiles(T: int, block_size: int, window: int) -> tuple[int, int]:
    """``(full, partial)`` tiles of the causal sliding-window mask (query ``i`` sees keys
    ``i - window < j <= i``) cut into ``block_size`` tiles, ``T`` a multiple of ``block_size``.

    Tiles ``d = q_block - k_block`` apart hold pairs with ``i - j`` from ``d * block_size -
    (block_size - 1)`` to ``d * block_size + block_size - 1``; there are ``n - d`` of them. A tile
    is full when every such ``i - j`` lies in ``[0, window)``, computed when one does."""
    n = T // block_size
    full = partial = 0
    for d in range(n):
        lo, hi = d * block_size - (block_size - 1), d * block_size + block_size - 1
        if lo >= 0 and hi < window:
            full += n - d
        elif hi >= 0 and lo < window:
            partial += n - d
    return full, partial


_TILE_CASES = ((64, 16, 16), (128, 8, 20), (96, 32, 1), (64, 8, 64), (48, 16, 200),
               (2**20, 128, 4096), (2**22, 64, 1000))


@_checker
def check_tile_counts(tile_counts):
    """``tile_counts(T, block_size, window)`` -> ``(full, partial)``: how many tiles of a causal
    sliding-window BlockMask are computed whole and how many are computed with the mask, for a
    ``T`` that ``block_size`` divides. Some hidden cases have a million tokens: too many for a
    dense mask, so the answer must come from the geometry."""
    answers = []
    for T, bs, w in _TILE_CASES:
        ans = _call(tile_counts, T, bs, w, name="tile_counts",
                    on_error="T, block_size and window are Python ints; T can be 4 million, so "
                             "build no (T, T) mask")
        if not isinstance(ans, (tuple, list)) or len(ans) != 2:
            raise _Wrong(f"return two numbers, (full, partial); got {type(ans).__name__}")
        try:
            full, partial = (float(a) for a in ans)
        except (TypeError, ValueError):
            raise _Wrong("return two numbers, (full, partial); got a "
                         f"{type(ans).__name__} of {len(ans)} non-numbers") from None
        answers.append((full, partial))
    refs = [sliding_window_tiles(T, bs, w) for T, bs, w in _TILE_CASES]
    if all(a == r for a, r in zip(answers, refs, strict=True)):
        T, bs, w = _TILE_CASES[-2]
        full, partial = refs[-2]
        n = T // bs
        return (f"at T = {T:,}, window {w}, tiles of {bs}: {full + partial:,} of {n * n:,} tiles "
                f"computed ({100 * (1 - (full + partial) / n**2):.2f} % skipped).")

    def counts(rule):
        return [rule(T, bs, w) for T, bs, w in _TILE_CASES]

    def causal_tiles(T, bs, w):
        n = T // bs
        return n * (n - 1) // 2, n

    mistakes = (
        ("the order is (full, partial): you swapped them",
         counts(lambda T, bs, w: sliding_window_tiles(T, bs, w)[::-1])),
        ("those are the tiles of plain causal attention: the window also empties the tiles far "
         "below the diagonal", counts(causal_tiles)),
        ("a tile is FULL when every (query, key) pair in it is allowed and then needs no mask; "
         "you counted every computed tile as partial",
         counts(lambda T, bs, w: (0, sum(sliding_window_tiles(T, bs, w))))),
        ("a query sees `window` keys, itself included (i - j < window); your tiles are those of "
         "a window one key wider",
         counts(lambda T, bs, w: sliding_window_tiles(T, bs, w + 1))),
        ("a query sees `window` keys, itself included (i - j < window); your tiles are those of "
         "a window one key narrower",
         counts(lambda T, bs, w: sliding_window_tiles(T, bs, max(w - 1, 1)))),
    )
    for hint, wrong in mistakes:
        if all(a == tuple(float(x) for x in m) for a, m in zip(answers, wrong, strict=True)):
            raise _Wrong(hint)
    k = next(i for i, (a, r) in enumerate(zip(answers, refs, strict=True)) if a != r)
    T, bs, w = _TILE_CASES[k]
    n = T // bs
    if answers[k][0] + answers[k][1] > n * (n + 1) // 2:
        raise _Wrong(f"T = {T}, block_size = {bs}, window = {w}: more tiles than the "
                     f"{n * (n + 1) // 2} on and below the diagonal; tiles above it (keys after "
                     "every query) are always empty")
    raise _Wrong(f"T = {T}, block_size = {bs}, window = {w}: expected (full, partial) = {refs[k]}, "
                 f"got ({answers[k][0]:g}, {answers[k][1]:g}). Tiles d blocks below the "
                 "diagonal hold pairs with i - j from d * block_size - (block_size - 1) to "
                 "d * block_size + block_size - 1")


# --------------------------------------------------------------------------------------------
# 11.4 A learned relative-position bias (a score_mod that reads a trainable tensor)
# --------------------------------------------------------------------------------------------
def _reference_bias(table: torch.Tensor, T: int) -> torch.Tensor:
    """``(H, T, T)``: ``table[h, clamp(j - i, -R, R) + R]`` for query ``i``, key ``j``, where
    ``table`` is ``(H, 2R + 1)``: column 0 = ``R`` or more keys before the query, column ``R`` =
    the query's own position, column ``2R`` = ``R`` or more keys after it."""
    R = (table.shape[1] - 1) // 2
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return table[:, (j - i).clamp(-R, R) + R]


# heads, R (the table has 2R + 1 columns), tokens; the first case needs no clamp (T <= R + 1)
_BIAS_CASES = ((2, 3, 4), (3, 2, 9), (4, 4, 12))


@_checker
def check_relative_bias(relative_bias):
    """``relative_bias(table)`` -> a score_mod adding ``table[h, clamp(kv_idx - q_idx, -R, R) + R]``
    to the score of query ``q_idx`` and key ``kv_idx`` in head ``h`` (``table`` ``(H, 2R + 1)``,
    trainable; no mask, as in an encoder). Checked on the scores and on the table's gradient
    through FlexAttention against SDPA with the dense bias."""
    from torch.nn.attention.flex_attention import flex_attention

    from shared.flex import score_bias

    gen = torch.Generator().manual_seed(11)
    for H, R, T in _BIAS_CASES:
        D = 2 * R + 1
        what = f"(H = {H}, R = {R}, T = {T})"
        table = torch.randn(H, D, generator=gen, dtype=torch.float64, requires_grad=True)
        mod = _call(relative_bias, table, name="relative_bias", copy=False)
        if not callable(mod):
            raise _Wrong(f"relative_bias should return a score_mod, a function (score, b, h, "
                         f"q_idx, kv_idx) -> new score; got {type(mod).__name__}")
        scores = torch.randn(1, H, T, T, generator=gen, dtype=torch.float64)
        _warm_up()
        try:
            with _time_limit(5.0), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = score_bias(mod, scores).detach()
        except _TimedOut:
            raise _Wrong(f"the score_mod was still running after 5 s {what}") from None
        except Exception as e:  # noqa: BLE001 - learner code may raise anything
            text = str(e)
            if "index" in text.lower() and ("out of" in text or "bounds" in text):
                if T <= R + 1:  # every distance fits the table: the offset is wrong
                    raise _Wrong("an index went past the table although every distance fits: "
                                 "distance 0 is column R, so the columns run from 0 (R keys "
                                 f"back) to 2R (R keys ahead) {what}") from None
                raise _Wrong("an index went past the table: keys more than R positions away "
                             "must share the first or the last column (clamp the distance "
                             f"to [-R, R]) {what}") from None
            if "data-dependent" in text or "Boolean value of Tensor" in text or ".item()" in text:
                raise _Wrong("the score_mod converts a tensor to a Python value (`if`, `min`, "
                             "`.item()`): FlexAttention calls it on index tensors, so use "
                             f"torch.clamp or torch.where {what}") from None
            raise _Wrong(f"the score_mod raised {type(e).__name__}: {text[:200]} {what}") from None
        if not isinstance(got, torch.Tensor) or got.shape != scores.shape:
            raise _Wrong(f"the score_mod must return one new score per score; got "
                         f"{getattr(got, 'shape', type(got).__name__)} for scores of shape "
                         f"{tuple(scores.shape)}")
        bias = _reference_bias(table.detach(), T)[None]
        if not torch.allclose(got, scores + bias, atol=1e-9):
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            t = table.detach()
            cands = [
                (scores - bias, "the bias is added to the score, not subtracted"),
                (bias, "a score_mod returns the new score: the score plus the bias, not the bias "
                       "alone"),
                (scores + t[0, (j - i).clamp(-R, R) + R][None, None],
                 "every head reads row 0 of the table: each head has its own row, table[h]"),
                (scores + t[:, (i - j).clamp(-R, R) + R][None],
                 "mirrored: column 0 is for keys R or more positions *before* the query, so "
                 "the column follows kv_idx - q_idx"),
                (scores + t[:, ((j - i).clamp(-R, R)) % D][None],
                 "distance 0 is column R: shift the clamped distance by R (a negative index "
                 "wraps round to the end of the table)"),
                (scores + t[:, ((j - i).clamp(-R, R) + R - 1) % D][None],
                 "off by one: distance 0 is column R, the middle of the table"),
            ]
            for value, hint in cands:
                if torch.allclose(got, value, atol=1e-9):
                    raise _Wrong(f"{hint} {what}")
            diff = (got - scores - bias).abs()[0].amax(dim=0)
            qi, kj = (int(x) for x in torch.nonzero(diff > 1e-9)[0])
            raise _Wrong(f"query {qi}, key {kj}: the score should change by the table entry for "
                         f"key - query = {kj - qi} (clamped to [-R, R]) {what}")
        # the gradient: through FlexAttention (eager), against SDPA with the dense bias
        Q, K, V = (torch.randn(1, H, T, 4, generator=gen, dtype=torch.float64) for _ in range(3))
        G = torch.randn(1, H, T, 4, generator=gen, dtype=torch.float64)
        no_grad = ("the table gets no gradient through your score_mod: keep it a tensor in "
                   "the computation (no .item(), .tolist(), .detach() or a copy made without "
                   f"its gradient) {what}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = flex_attention(Q, K, V, score_mod=mod)
            except Exception as e:  # noqa: BLE001 - its values were right under vmap
                raise _Wrong(f"{no_grad} (FlexAttention raised {type(e).__name__})") from None
        if not out.requires_grad:
            raise _Wrong(no_grad)
        try:
            (out * G).sum().backward()
        except Exception as e:  # noqa: BLE001 - the backward of a detached copy fails here
            raise _Wrong(f"{no_grad} (its backward raised {type(e).__name__})") from None
        got_grad = table.grad
        ref_table = table.detach().clone().requires_grad_()
        sdpa = torch.nn.functional.scaled_dot_product_attention
        (sdpa(Q, K, V, attn_mask=_reference_bias(ref_table, T)) * G).sum().backward()
        if got_grad is None or not torch.allclose(got_grad, ref_table.grad, atol=1e-9):
            raise _Wrong("the table's gradient is wrong: read the table itself inside the "
                         f"score_mod, not a copy {what}")
    return ("one row of learned biases per head, trained through FlexAttention like any other "
            "parameter (T5 learns such a table, with log-spaced buckets for far distances).")


# --------------------------------------------------------------------------------------------
# 11.5 Predict what a stale BlockMask lets through
# --------------------------------------------------------------------------------------------
STALE_OLD_IDS = [0] * 8 + [1] * 4  # documents of 8 and 4 tokens when the BlockMask is built
STALE_NEW_IDS = [0] * 6 + [1] * 6  # then doc_ids changes in place: documents of 6 and 6
STALE_QUERY, STALE_TILE = 7, 4


def _stale_tiles():
    """The old BlockMask (tiles of 4) of the document mask, built while ``doc_ids`` held
    ``STALE_OLD_IDS``, then the ids changed in place to ``STALE_NEW_IDS``."""
    from torch.nn.attention.flex_attention import create_block_mask

    from shared.flex import document

    ids = torch.tensor(STALE_OLD_IDS)
    T = len(STALE_OLD_IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bm = create_block_mask(document(ids), None, None, T, T, device="cpu",
                               BLOCK_SIZE=STALE_TILE)
    ids.copy_(torch.tensor(STALE_NEW_IDS))
    return bm


def stale_keys() -> list[int]:
    """The keys query ``STALE_QUERY`` attends to with the old BlockMask and the new ids: every key
    of a tile that was FULL, the keys of a PARTIAL tile that the mask allows with the new ids,
    none of an EMPTY tile (``shared.flex.effective_mask``)."""
    from shared.flex import effective_mask

    return torch.nonzero(effective_mask(_stale_tiles())[STALE_QUERY]).flatten().tolist()


@_checker
def check_stale_prediction(keys_seen):
    """``keys_seen``: the keys query 7 attends to in the compiled kernel when the document mask's
    ``doc_ids`` changed from documents of 8 + 4 to 6 + 6 after ``create_block_mask`` (tiles of
    4), predicted from the tile kinds."""
    from shared.flex import EMPTY, FULL, tile_map

    if keys_seen is None:
        raise _NotAttempted("keys_seen is still None: write your prediction, a list of key "
                            "indices")
    try:
        got = sorted({int(k) for k in keys_seen})
        if any(isinstance(k, bool) or int(k) != k for k in keys_seen):
            raise ValueError
    except (TypeError, ValueError):
        raise _Wrong("keys_seen should be a list of key indices (integers from 0 to 11); got "
                     f"{type(keys_seen).__name__}") from None
    T, q, bs = len(STALE_OLD_IDS), STALE_QUERY, STALE_TILE
    if any(k < 0 or k >= T for k in got):
        raise _Wrong(f"keys run from 0 to {T - 1}")
    ref = stale_keys()
    if got == ref:
        return ("the full tile let the old document's keys 0-3 through, and the partial tile "
                "applied the new ids: neither the old mask nor the new one.")
    new_row = [j for j in range(T) if STALE_NEW_IDS[j] == STALE_NEW_IDS[q] and j <= q]
    old_row = [j for j in range(T) if STALE_OLD_IDS[j] == STALE_OLD_IDS[q] and j <= q]
    if got == new_row:
        raise _Wrong("that is what the new mask allows, what eager mode would compute; the "
                     "compiled kernel follows the old tiles: which kind was each tile of query "
                     "7's row when the BlockMask was built?")
    if got == old_row:
        raise _Wrong("that is the old mask; but the mask_mod reads doc_ids when the kernel runs, "
                     "so wherever it is evaluated it sees the new ids: in which tiles is it "
                     "evaluated?")
    kinds = tile_map(_stale_tiles())[q // bs].tolist()
    for t, kind in enumerate(kinds):
        keys = range(t * bs, (t + 1) * bs)
        if [k for k in got if k in keys] != [k for k in ref if k in keys]:
            why = ("was FULL: the kernel computes a full tile whole, without evaluating the mask"
                   if kind == FULL else "was EMPTY: the kernel skips it" if kind == EMPTY else
                   "was PARTIAL: the kernel evaluates the mask_mod on each of its pairs, with "
                   "the doc_ids it reads now")
            raise _Wrong(f"look again at keys {t * bs}-{(t + 1) * bs - 1}: for query 7's block, "
                         f"that tile {why}")
    raise _Wrong("compare tile by tile")  # unreachable: some tile differs
