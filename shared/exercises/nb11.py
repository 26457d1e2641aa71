"""Exercise checkers for notebook 11 Every mask in one API: FlexAttention (PyTorch)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ._core import _call, _checker, _time_limit, _TimedOut, _Wrong

__all__ = [
    "check_chunked_causal",
    "check_window_bug",
    "check_tile_counts",
]


def _ij(T: int):
    """Query indices ``(T, 1)`` and key indices ``(1, T)``, to broadcast into ``(T, T)`` masks."""
    return np.arange(T)[:, None], np.arange(T)[None, :]


def _full(x, T: int) -> np.ndarray:
    return np.broadcast_to(x, (T, T))


def _evaluate(mask_mod, T: int, what: str) -> np.ndarray:
    """Run a learner's mask_mod the way FlexAttention does (``torch.vmap`` over the indices, via
    ``create_mask``) and return the ``(T, T)`` boolean mask."""
    from torch.nn.attention.flex_attention import create_mask

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
        hints = {
            W + 1: "count from 0: query q sees keys q - 4 .. q under the bug; the first one for "
                   "which q - 4 is a real key (key 0) is query 4",
            W - 1: "query 3 sees keys 0 .. 3, four keys, under both masks: the bug adds key "
                   "q - 4, which exists only from query 4 on",
            0: "query 0 sees only itself under both masks: the extra key q - window does not "
               "exist yet for the first queries",
        }
        raise _Wrong(hints.get(int(first_wrong_query),
                               "under the bug query q sees keys q - window .. q (window + 1 of "
                               "them) once they exist; which query is the first to have key "
                               "q - window?"))
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
