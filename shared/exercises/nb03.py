"""Exercise checkers for notebook 03 Causal attention.

As in ``nb01``: references come from the checker's own copies, made before the learner's code
runs; float32 answers are accepted; hints name the mistake that was actually made.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _diagnose,
    _maxdiff,
    _NotAttempted,
    _rng,
    _shape,
    _softmax,
    _Wrong,
)
from .nb01 import _numbers, _row_order_hint, _scalar

__all__ = [
    "check_sliding_window_attention",
    "check_window_pairs",
    "check_stacked_reach",
    "check_expected_empty_rows",
    "check_causal_bug_fix",
    "check_padded_causal_mask",
]


# --------------------------------------------------------------------------------------------
# 3.1 A sliding-window causal module with its mask as a buffer
# --------------------------------------------------------------------------------------------
def _band(n: int, window: int) -> np.ndarray:
    """True where key j may be seen by query i: ``i - window < j <= i``."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return (j <= i) & (j > i - window)


def _window_outputs(x: np.ndarray, W: dict, allowed: np.ndarray, scale: bool = True,
                    after: bool = False, divisor: float | None = None,
                    axis: int = -1) -> np.ndarray:
    """Reference: x (B, T, d_in) float64, W: the math's (d_in, d_out) matrices; ``divisor``
    replaces sqrt(d_out); ``axis`` is the softmax's. A query (or, for another axis, a slice)
    allowed nothing gets zeros."""
    Q, K, V = x @ W["W_query"], x @ W["W_key"], x @ W["W_value"]
    d = divisor if divisor is not None else math.sqrt(K.shape[-1])
    S = Q @ np.swapaxes(K, -1, -2) / (d if scale else 1.0)
    if after:
        return (_softmax(S) * allowed) @ V
    return _softmax(np.where(allowed, S, -np.inf), axis=axis) @ V


def _nan_as_zero(got: np.ndarray) -> np.ndarray:
    """PyTorch turns a softmax over nothing but -inf into NaN where the references give 0."""
    return np.where(np.isnan(got), 0.0, got)


def _scaling_candidates(ref_fn, d_in: int, d_k: int, d_v: int, what: str = "d_k"):
    """(hint, value) pairs for the scaling mistakes; ``ref_fn(divisor=...)`` -> outputs."""
    out = []
    if d_in != d_k:
        out.append((f"you scaled by sqrt(d_in) = sqrt({d_in}); the scores are dot products of "
                    f"{d_k}-dimensional queries and keys: divide by sqrt({what}) = "
                    f"sqrt({d_k})", ref_fn(divisor=math.sqrt(d_in))))
    if d_v != d_k:
        out.append((f"you scaled by sqrt(d_v) = sqrt({d_v}); scale by the query/key size: "
                    f"sqrt({what}) = sqrt({d_k})", ref_fn(divisor=math.sqrt(d_v))))
    if d_k != 1:
        out.append((f"you divided by {what} = {d_k}; divide by its square root, "
                    f"sqrt({what})", ref_fn(divisor=float(d_k))))
    return out


def _mask_hint(mask: np.ndarray, n: int, window: int) -> None:
    ref = _band(n, window)
    if np.array_equal(mask, ref):
        return
    for hint, value in (
        ("the buffer is the plain causal mask: also hide keys that are `window` or more steps "
         "back (j > i - window)", np.tril(np.ones((n, n), dtype=bool))),
        ("off by one, your band is one key too wide: query i should see exactly `window` keys, "
         "i - window + 1 .. i; yours sees window + 1", _band(n, window + 1)),
        ("off by one, your band is one key too narrow: query i should see exactly `window` keys, "
         "i - window + 1 .. i; yours sees window - 1",
         _band(n, window - 1) if window > 1 else None),
        ("True must mean 'may attend'; your buffer marks the forbidden keys: flip it", ~ref),
        ("your band looks into the future: query i may see keys j <= i only (a lower band)",
         ref.T),
        ("your buffer is the upper triangle, the keys at or after each query: the band lies at "
         "and below the diagonal (j <= i)", np.triu(np.ones((n, n), dtype=bool))),
        ("your buffer is the upper triangle above the diagonal, the future: the band lies at "
         "and below the diagonal (j <= i)", np.triu(np.ones((n, n), dtype=bool), 1)),
        ("your buffer marks the keys the window hides, `window` or more steps back "
         "(j <= i - window); True must mean 'may attend': i - window < j <= i",
         np.tril(np.ones((n, n), dtype=bool), -window)),
    ):
        if value is not None and np.array_equal(mask, value):
            raise _Wrong(f"mask buffer (context_length = {n}, window = {window}): {hint}")
    raise _Wrong(f"mask buffer (context_length = {n}, window = {window}): entry [i, j] should be "
                 "True exactly when i - window < j <= i")


def _buffer_hint(module: nn.Module, n: int, window: int) -> None:
    """Raise the hint for the first thing wrong with the module's ``mask`` buffer, if any."""
    buffers = dict(module.named_buffers())
    if "mask" not in buffers:
        attr = getattr(module, "mask", None)
        if isinstance(attr, nn.Parameter):
            raise _Wrong("the mask is an nn.Parameter: an optimiser would train it; keep it "
                         "with self.register_buffer('mask', ...) instead")
        if attr is not None:
            raise _Wrong("self.mask is a plain attribute: it does not move with .to(device) and "
                         "is not saved in state_dict; use self.register_buffer('mask', ...)")
        raise _Wrong("register the mask as a buffer in __init__: self.register_buffer('mask', "
                     "...)")
    mask = buffers["mask"]
    if tuple(mask.shape) != (n, n):
        raise _Wrong(f"the mask buffer should cover context_length = {n} positions, shape "
                     f"({n}, {n}); got {tuple(mask.shape)} (build it once in __init__, slice it "
                     "in forward)")
    if mask.dtype != torch.bool:
        raise _Wrong(f"make the mask boolean (True = may attend); got dtype {mask.dtype}")
    _mask_hint(mask.detach().cpu().numpy(), n, window)


@_checker
def check_sliding_window_attention(SlidingWindowAttention):
    """Exercise 3.1 (a): ``SlidingWindowAttention(d_in, d_out, context_length, window)`` (in the
    notebook: section 6's module with the learner's ``band_mask`` as its buffer) is an
    ``nn.Module`` with ``nn.Linear`` projections ``W_query``, ``W_key``, ``W_value`` and a
    boolean buffer ``mask`` ``(context_length, context_length)``, True where
    ``i - window < j <= i``; ``forward(x)``: ``(B, T, d_in)`` -> ``(B, T, d_out)`` for any
    ``T <= context_length``."""
    cases = [  # d_in, d_out, context_length, window, B, T
        (3, 2, 8, 3, 2, 6), (3, 2, 8, 3, 1, 8), (4, 3, 6, 1, 2, 5), (2, 2, 5, 5, 1, 5),
        (4, 4, 10, 2, 3, 1),
    ]
    for case, (d_in, d_out, n, window, B, T) in enumerate(cases):
        torch.manual_seed(310 + case)
        module = _call(SlidingWindowAttention, d_in, d_out, n, window,
                       name="SlidingWindowAttention",
                       on_error=f"building it with d_in = {d_in}, d_out = {d_out}, "
                                f"context_length = {n}, window = {window}")
        if not isinstance(module, nn.Module):
            raise _Wrong(f"SlidingWindowAttention(...) should build an nn.Module; got "
                         f"{type(module).__name__}: subclass nn.Module and call "
                         "super().__init__() first")
        if "mask" in module._buffers and module._buffers["mask"] is None:
            raise _NotAttempted("the mask buffer is still None: write band_mask (its TODO) so "
                                "that it returns the boolean band, and run the cell again")
        W = {}
        for name in ("W_query", "W_key", "W_value"):
            lin = getattr(module, name, None)
            if not isinstance(lin, nn.Linear):
                raise _Wrong(f"keep the three projections of the stub: self.{name} = "
                             f"nn.Linear(d_in, d_out, bias=False)")
            W[name] = lin.weight.detach().double().numpy().T.copy()  # the math's (d_in, d_out)
        x = torch.randn(B, T, d_in, generator=torch.Generator().manual_seed(320 + case))
        try:
            with torch.no_grad():
                out = _call(module, x.clone(), name="forward",
                            on_error=f"on x of shape {(B, T, d_in)}, context_length = {n}, "
                                     f"window = {window}")
        except _Wrong as e:
            _buffer_hint(module, n, window)
            if T < n:
                raise _Wrong(f"{e.args[0]} (the input has T = {T} tokens but the buffer covers "
                             f"context_length = {n}: slice it, self.mask[:T, :T])") from None
            raise
        _buffer_hint(module, n, window)
        if isinstance(out, (tuple, list)):
            raise _Wrong("forward should return only the context vectors (B, T, d_out), not a "
                         f"{type(out).__name__}")
        x64 = x.double().numpy()
        allowed = _band(T, window)
        ref = _window_outputs(x64, W, allowed)
        got = _numbers(out, "the output")
        _shape(got, (B, T, d_out), f"for x of shape {(B, T, d_in)} the output",
               "(B, T, d_out)")
        if _close(got, ref, atol=1e-5):
            continue
        for b in range(B):
            _row_order_hint(got[b], ref[b])
        causal = np.tril(np.ones((T, T), dtype=bool))
        hidden_somewhere = np.broadcast_to(~allowed.all(axis=-1), got.shape[:-1])
        if np.isnan(got).any() and np.array_equal(np.isnan(got).any(axis=-1), hidden_somewhere):
            raise _Wrong("the output is nan on exactly the queries that have a hidden key: the "
                         "softmax ran over a dim in which a hidden score is -inf everywhere, "
                         "such as the batch (dim=0); each query's weights must sum to 1 over "
                         "the keys: torch.softmax(scores, dim=-1)")
        _diagnose(_nan_as_zero(got), [
            ("masked_fill hides the keys the buffer ALLOWS: the buffer says True = may attend, "
             "so fill where it is False, scores.masked_fill(~self.mask[:T, :T], -inf)",
             _window_outputs(x64, W, ~allowed)),
            ("forward ignores the window: it matches plain causal attention; apply the buffer "
             "you built, self.mask[:T, :T]", _window_outputs(x64, W, causal)
             if window < T else None),
            ("forward uses no mask at all: every query sees every key",
             _window_outputs(x64, W, np.ones((T, T), dtype=bool))),
            ("off by one in forward: query i should see exactly `window` keys",
             _window_outputs(x64, W, _band(T, window + 1)) if window < T else None),
            ("softmax over the wrong dim: the scores are (B, T_query, T_key) and each query's "
             "weights must sum to 1 over the keys: torch.softmax(scores, dim=-1)",
             _window_outputs(x64, W, allowed, axis=-2) if T > 1 else None),
            ("forgot the scaling: divide the scores by sqrt(d_out)",
             _window_outputs(x64, W, allowed, scale=False)),
            *_scaling_candidates(functools.partial(_window_outputs, x64, W, allowed),
                                 d_in, d_out, d_out, what="d_out"),
            ("mask applied after the softmax without renormalising: set the hidden scores to "
             "-inf before the softmax", _window_outputs(x64, W, allowed, after=True)),
        ], atol=1e-5)
        raise _Wrong(f"for x of shape {(B, T, d_in)} the output differs from sliding-window "
                     f"attention by up to {_maxdiff(got, ref)}")
    return ("the band lives in one buffer, sliced to each input: every token sees itself and "
            "the window - 1 tokens before it.")


# --------------------------------------------------------------------------------------------
# 3.1 (b) How many (query, key) pairs does the band allow?
_PAIRS_CASES = ((6, 3), (10, 1), (4, 6), (5, 5), (7, 2), (4096, 1024), (10**6, 4096))  # (T, window)
_BIG_T = 10**6  # a (T, T) mask would hold 10**12 entries: count with a formula or a loop


def _pairs(T: int, window: int) -> int:
    """The number of True entries of the (T, T) band: query i sees min(i + 1, window) keys."""
    return int(sum(min(i + 1, window) for i in range(T)))


def _pairs_candidates(T: int, w: int) -> list[tuple[str, float]]:
    """(hint, value) for the typical wrong counts; the right one is sum_i min(i + 1, w)."""
    return [
        ("that is T * window: every query gets `window` keys, but the first ones have fewer "
         "(query i, 0-based, has only i + 1 keys before the window is full)", float(T * w)),
        ("that is the plain causal count T(T + 1)/2; the window removes the keys `window` or "
         "more steps back", float(T * (T + 1) // 2)),
        ("right while window <= T, but when window > T the band is the whole causal triangle: "
         "no query has `window` keys to see; clamp the window to T",
         float(T * w - w * (w - 1) // 2)),
        ("off by one: query i sees min(i + 1, window) keys, i - window + 1 .. i; yours counts "
         "one key more (window + 1)", float(_pairs(T, w + 1))),
        ("off by one: query i sees min(i + 1, window) keys, i - window + 1 .. i; yours counts "
         "one key less: each query also sees itself", float(_pairs(T, w) - T)),
        ("that counts the pairs the mask HIDES (its False entries); count the allowed ones",
         float(T * T - _pairs(T, w))),
        ("T * T is attention without any mask; count only the True entries of the band",
         float(T * T)),
    ]


def _number_answers(fn, name: str, cases, arg_names: tuple[str, str], reference):
    """The learner's numbers and the right ones, ``(got, want)`` as arrays, one per hidden case
    ``(a, b)``: ``fn(a, b)`` against ``reference(a, b)``."""
    got, want = [], []
    for a, b in cases:
        args = f"{arg_names[0]} = {a}, {arg_names[1]} = {b}"
        got.append(_scalar(_call(fn, a, b, name=name, on_error=f"called with {args}"),
                           f"{name}({a}, {b})"))
        want.append(float(reference(a, b)))
    return np.array(got), np.array(want)


def _raise_if_a_typical_mistake(got: np.ndarray, candidates_per_case) -> None:
    """Raise the hint of the typical mistake that gives exactly ``got`` on every case, if any.
    ``candidates_per_case``: per case, the same list of ``(hint, value)`` pairs."""
    for column in zip(*candidates_per_case, strict=True):
        if np.array_equal(got, np.array([value for _, value in column])):
            raise _Wrong(column[0][0])


@_checker
def check_window_pairs(allowed_pairs):
    """Exercise 3.1 (b): ``allowed_pairs(T, window)`` -> the number of (query, key) pairs a
    ``(T, T)`` sliding-window mask allows (its True entries): ``sum_i min(i + 1, window)``."""
    try:
        got_a, want_a = _number_answers(allowed_pairs, "allowed_pairs", _PAIRS_CASES,
                                        ("T", "window"), _pairs)
    except _Wrong as e:
        if f"T = {_BIG_T}," not in str(e):
            raise
        raise _Wrong(f"{e}. At T = {_BIG_T:,} a (T, T) mask has 10^12 entries and does not fit in "
                     "memory: count the pairs without building the mask (a formula, or a sum "
                     "over the queries)") from None
    if np.array_equal(got_a, want_a):
        return ("about T * window pairs once T >> window: linear in T, where the causal "
                "triangle has T(T + 1)/2.")
    _raise_if_a_typical_mistake(got_a, [_pairs_candidates(T, w) for T, w in _PAIRS_CASES])
    k = int(np.argmax(got_a != want_a))
    T, w = _PAIRS_CASES[k]
    if w == 1 and got_a[k] != T:
        raise _Wrong(f"for T = {T}, window = 1 you return {got_a[k]:g}: with a window of one "
                     f"key each query sees only itself, so there are T = {T} pairs")
    if w >= T:
        raise _Wrong(f"for T = {T}, window = {w} (window >= T) you return {got_a[k]:g}: then "
                     "no key is too far back and the band is the whole causal triangle")
    raise _Wrong(f"for T = {T}, window = {w} you return {got_a[k]:g}: count, for each query "
                 "i, the keys it may see (at most `window`, at most i + 1), and add them up")


# --------------------------------------------------------------------------------------------
# 3.1 (c) How far back can a stack of sliding-window layers reach?
_REACH_CASES = ((3, 2), (4, 2), (1, 3), (5, 1), (2, 4), (4096, 2))  # (window, layers)


def _reach(window: int, layers: int) -> int:
    """The largest i - j for which token j can move output i: each layer adds window - 1."""
    return layers * (window - 1)


def _reach_candidates(w: int, L: int) -> list[tuple[str, float]]:
    """(hint, value) for the typical wrong derivations; the right one is L (w - 1)."""
    return [
        ("off by one: a window of w keys reaches w - 1 tokens back, since one of its keys is "
         "the token itself; yours counts w per layer", float(L * w)),
        ("that is the reach of one layer; the second layer attends over outputs of the first, "
         "and each of those already reaches back: follow the dependence through every layer",
         float(w - 1)),
        ("reaches add up from layer to layer, they do not multiply", float((w - 1) ** L)),
        ("reaches add up from layer to layer, they do not multiply", float(w ** L)),
        ("that counts the tokens output i can depend on, itself included; the task asks how "
         "far back: the largest i - j", float(L * (w - 1) + 1)),
    ]


@_checker
def check_stacked_reach(stacked_reach):
    """Exercise 3.1 (c): ``stacked_reach(window, layers)`` -> the largest ``i - j`` such that
    changing token j moves output i of ``layers`` stacked sliding-window layers:
    ``layers * (window - 1)``."""
    got_a, want_a = _number_answers(stacked_reach, "stacked_reach", _REACH_CASES,
                                    ("window", "layers"), _reach)
    if np.array_equal(got_a, want_a):
        return ("each layer adds window - 1 tokens of reach: Mistral's 32 layers of window "
                "4096 see about 131K tokens back, though each layer's mask is only 4096 wide.")
    _raise_if_a_typical_mistake(got_a, [_reach_candidates(w, L) for w, L in _REACH_CASES])
    k = int(np.argmax(got_a != want_a))
    w, L = _REACH_CASES[k]
    if w == 1:
        raise _Wrong(f"for window = 1, layers = {L} you return {got_a[k]:g}: with a window of "
                     "one key every layer's output i depends on token i alone")
    raise _Wrong(f"for window = {w}, layers = {L} you return {got_a[k]:g}: one layer lets "
                 "output i depend on the tokens its window covers; follow that dependence back "
                 "through the layers one at a time")


# --------------------------------------------------------------------------------------------
# 3.2 Predict, then measure: how many queries does attention dropout leave with nothing?
# --------------------------------------------------------------------------------------------
_EMPTY_CASES = ((6, 0.5), (10, 0.1), (3, 0.8), (1, 0.3), (8, 0.6))  # (T, p)


def _empty_rows_candidates(T: int, p: float) -> list[tuple[str, float]]:
    """(hint, value) for the typical wrong derivations; the right one is sum_i p^(i+1)."""
    i = np.arange(T)
    return [
        ("off by one: query i (0-based) has i + 1 keys, itself included, so its row empties "
         "with probability p^(i + 1); yours gives query 0 probability 1 (p^0)",
         float(np.sum(p ** i))),
        ("off by one: query i (0-based) has i + 1 keys, so its row empties with probability "
         "p^(i + 1); yours uses one key too many (p^(i + 2))", float(np.sum(p ** (i + 2)))),
        ("you counted T keys for every query: that is attention without a mask; with the causal "
         "mask query i has only i + 1 keys, so its row empties with probability p^(i + 1)",
         float(T * p ** T)),
        ("(1 - p) is the probability that a weight is KEPT; a row is empty when all its i + 1 "
         "weights are dropped, probability p^(i + 1)", float(np.sum((1 - p) ** (i + 1)))),
        ("that is the probability that EVERY row is empty at once; the expected NUMBER of empty "
         "rows adds up each row's probability p^(i + 1) (linearity of expectation)",
         float(p ** (T * (T + 1) / 2))),
        ("that is the probability that at least one row is empty; the expected NUMBER of empty "
         "rows adds up each row's probability p^(i + 1) (linearity of expectation)",
         float(1 - np.prod(1 - p ** (i + 1)))),
        ("a row is empty only when ALL of its keys are dropped, not when one is: query i's row "
         "empties with probability p^(i + 1), not p", float(T * p)),
        ("that is the expected FRACTION of empty rows; the task asks for the number (multiply "
         "by T)", float(np.sum(p ** (i + 1)) / T)),
        ("that counts only the last query (p^T); every query can lose all its keys: add "
         "p^(i + 1) over i = 0 .. T - 1", float(p ** T)),
    ]


@_checker
def check_expected_empty_rows(expected_empty_rows):
    """Exercise 3.2: ``expected_empty_rows(T, p)`` -> the expected number of queries (rows) of a
    ``(T, T)`` causal attention matrix whose every weight attention dropout (probability ``p``)
    sets to 0: ``sum_{i=0}^{T-1} p^(i+1)``."""
    got, want = [], []
    for T, p in _EMPTY_CASES:
        value = _scalar(_call(expected_empty_rows, T, p, name="expected_empty_rows",
                              on_error=f"called with T = {T}, p = {p}"),
                        f"expected_empty_rows({T}, {p})")
        got.append(value)
        want.append(float(np.sum(p ** (np.arange(T) + 1))))
    got_a, want_a = np.array(got), np.array(want)
    if np.allclose(got_a, want_a, rtol=1e-6, atol=1e-9):
        return ("query i keeps nothing with probability p^(i + 1), so the early queries, "
                "with few keys, are the ones that lose everything.")
    columns = list(zip(*(_empty_rows_candidates(T, p) for T, p in _EMPTY_CASES), strict=True))
    for column in columns:
        hint = column[0][0]
        values = np.array([v for _, v in column])
        if np.allclose(got_a, values, rtol=1e-6, atol=1e-9):
            raise _Wrong(hint)
    if np.all(np.abs(got_a - want_a) <= 0.02 + 0.03 * want_a):
        raise _Wrong("close, but not exact: did you simulate it? Derive the exact value "
                     "(one probability per query, added up) and return that")
    k = int(np.argmax(~np.isclose(got_a, want_a, rtol=1e-6, atol=1e-9)))
    T, p = _EMPTY_CASES[k]
    direction = "too large" if got_a[k] > want_a[k] else "too small"
    raise _Wrong(f"for T = {T}, p = {p} you return {got_a[k]:.4f}, {direction}: for each query "
                 "i, work out the probability that all the keys it may see are dropped, then "
                 "add these up over the T queries")


# --------------------------------------------------------------------------------------------
# 3.3 The leaky causal attention: predict what it leaks, then fix it
# --------------------------------------------------------------------------------------------
def _leaky_causal_attention(Q, K, V):
    """The buggy implementation shown in notebook 03: the mask is right, but the hand-written
    softmax divides by a column sum (``axis=0``), a sum over the queries, so query i's weights
    depend on every later query."""
    T, d_k = Q.shape
    scores = Q @ K.T / np.sqrt(d_k)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=0, keepdims=True)) @ V


_LEAK_T = 6  # the prediction: which outputs of the buggy code move when token T - 1 changes


def _moved_prediction(moved_outputs) -> set[int]:
    """The learner's predicted output indices as a set of ints, or a hint naming the problem."""
    if callable(moved_outputs) and not isinstance(moved_outputs, (np.ndarray, torch.Tensor)):
        raise _Wrong("moved_outputs: give the output indices themselves (a list such as "
                     "[0, 2]), not a function")
    if isinstance(moved_outputs, (str, bytes)):
        raise _Wrong(f"moved_outputs should be a list of output indices, not the text "
                     f"{moved_outputs!r}")
    if isinstance(moved_outputs, (int, np.integer)) and not isinstance(moved_outputs, bool):
        moved_outputs = [moved_outputs]
    a = _arr(list(moved_outputs) if isinstance(moved_outputs, (set, frozenset))
             else moved_outputs, "moved_outputs").reshape(-1)
    if a.dtype == np.bool_:
        raise _Wrong("moved_outputs should list the indices of the outputs that move (such as "
                     "[0, 2]), not one True/False per output")
    if not np.all(a == np.round(a)):
        raise _Wrong(f"moved_outputs should hold whole numbers, output indices 0 .. "
                     f"{_LEAK_T - 1}; got {a.tolist()}")
    return {int(v) for v in a}


def _check_moved_prediction(moved_outputs) -> None:
    T = _LEAK_T
    if moved_outputs is None:
        raise _NotAttempted("moved_outputs is still None: first predict which outputs of "
                            "leaky_causal_attention move when only the last token changes")
    got = _moved_prediction(moved_outputs)
    if got == set(range(T)):
        return
    if got == set(range(1, T + 1)):
        raise _Wrong(f"indices are 0-based: the {T} outputs are 0 .. {T - 1}")
    for hint, value in (
        (f"that is what a correct causal attention does, and this code's mask is correct; so "
         f"something after the mask carries token {T - 1} into other outputs: for each "
         "weight, list the scores that enter its denominator", {T - 1}),
        ("that would be a mask one step off (np.triu(..., k=2)); this mask, np.tril, is "
         "right: look for the leak after the mask, in how the weights are normalised",
         {T - 2, T - 1}),
        (f"output {T - 1} moves too: the query, key and value of token {T - 1} all changed",
         set(range(T - 1))),
    ):
        if got == value:
            raise _Wrong(f"moved_outputs = {sorted(got)}: {hint}")
    if not got <= set(range(T)):
        raise _Wrong(f"moved_outputs = {sorted(got)}: the outputs are numbered 0 .. {T - 1}")
    raise _Wrong(f"moved_outputs = {sorted(got)}: output i moves when anything it is computed "
                 f"from depends on token {T - 1}; trace each weight back to the scores in its "
                 "numerator and denominator, then measure it the way section 7 does")


def _causal_reference(Q, K, V, scale=True, after=False, axis=-1, mult=False, allowed=None,
                      divisor=None):
    """Reference outputs; ``allowed`` replaces the causal triangle (a query allowed nothing
    gets a zero output), ``divisor`` replaces sqrt(d_k)."""
    T, d_k = Q.shape
    d = divisor if divisor is not None else np.sqrt(d_k)
    scores = Q @ K.T / (d if scale else 1.0)
    tri = np.tril(np.ones((T, T), dtype=bool)) if allowed is None else allowed
    if mult:
        return _softmax(scores * tri) @ V
    if after:
        return (_softmax(scores) * tri) @ V
    return _softmax(np.where(tri, scores, -np.inf), axis=axis) @ V


@_checker
def check_causal_bug_fix(moved_outputs, causal_attention=None):
    """Exercise 3.3: ``moved_outputs``, the 0-based indices of the outputs of the buggy
    ``leaky_causal_attention`` that change when only the last of 6 tokens (its query, key and
    value) changes (predicted);
    ``causal_attention(Q, K, V)`` -> ``(T, d_v)`` outputs where query i uses keys j <= i only.
    Q, K: NumPy ``(T, d_k)``; V: ``(T, d_v)``; Q, K and V are left unchanged."""
    if causal_attention is None and callable(moved_outputs):
        raise _Wrong("pass your prediction first, then the function: "
                     "check_causal_bug_fix(moved_outputs, causal_attention)")
    _check_moved_prediction(moved_outputs)
    rng = _rng(302)
    for T, d_k, d_v in ((5, 4, 3), (6, 2, 2), (7, 3, 3), (1, 3, 2)):
        Q, K, V = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
        ref = _causal_reference(Q, K, V)
        inputs = [a.copy() for a in (Q, K, V)]
        shapes = f"on Q, K of shape {(T, d_k)} and V of shape {(T, d_v)}"
        got = _numbers(_call(causal_attention, *inputs, name="causal_attention", copy=False,
                             on_error=shapes),
                       "the output")
        changed = [n for n, a, b in zip("QKV", inputs, (Q, K, V), strict=True)
                   if not np.array_equal(a, b)]
        if changed:
            raise _Wrong(f"your function changed {', '.join(changed)} in place (e.g. `Q /= ...` "
                         "or `scores[...] = ...` on a view of an input): leave the inputs as "
                         "they are and compute into new arrays")
        _shape(got, (T, d_v), "the output", "(T, d_v): one output per query")
        if _close(got, ref):
            continue
        _row_order_hint(got, ref)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        _diagnose(_nan_as_zero(got), [
            ("still the original bug: the output equals leaky_causal_attention's. Print the "
             "weights of a small input and what each row sums to: every query's weights must "
             "sum to 1 over its own keys", _leaky_causal_attention(Q, K, V)),
            ("your mask hides j >= i + 2 only (np.triu(..., k=2) starts two places above the "
             "diagonal), so each query sees the next token i + 1; the future is j > i: "
             "np.triu(..., k=1)", _causal_reference(Q, K, V, allowed=j <= i + 1)),
            ("your mask hides j >= i + 3 only (np.triu(..., k=3)), so each query sees two "
             "future tokens; the future starts one place above the diagonal: np.triu(..., k=1)",
             _causal_reference(Q, K, V, allowed=j <= i + 2)),
            ("your mask hides the past (np.tril(..., k=-1) marks j < i) and keeps the future: "
             "each token sees itself and what comes AFTER it; the future is j > i: "
             "np.triu(..., k=1)", _causal_reference(Q, K, V, allowed=j >= i)),
            ("the mask hides the diagonal too: np.triu(..., k=0) marks j >= i, so token i "
             "cannot see itself (and token 0 sees nothing at all); the future starts one above "
             "the diagonal: np.triu(..., k=1)", _causal_reference(Q, K, V, allowed=j < i)),
            ("inverted mask: yours hides j <= i (the past and the token itself) and keeps the "
             "future; np.tril(..., k=0) is the set a query MAY see, so keep it with "
             "np.where(allowed, scores, -np.inf), or hide np.triu(..., k=1)",
             _causal_reference(Q, K, V, allowed=j > i)),
            ("mask applied after softmax without renormalising: the rows no longer sum to 1; "
             "mask the scores with -inf before the softmax (or divide by the row sums again)",
             _causal_reference(Q, K, V, after=True)),
            ("future leaked: multiplying the scores by the mask sets them to 0, not -inf, and "
             "exp(0) = 1 still gives the future weight; use np.where(mask, scores, -np.inf)",
             _causal_reference(Q, K, V, mult=True)),
            ("forgot the scaling: divide the scores by sqrt(d_k)",
             _causal_reference(Q, K, V, scale=False)),
            *_scaling_candidates(functools.partial(_causal_reference, Q, K, V),
                                 d_k, d_k, d_v),
            ("softmax over the wrong axis: each query's row must sum to 1 (axis=-1)",
             _causal_reference(Q, K, V, axis=0)),
        ])
        if np.isnan(got).any():
            rows = sorted({int(r) for r in np.nonzero(np.isnan(got))[0]})
            raise _Wrong(f"the output of token(s) {rows} is nan: a row whose scores are all "
                         "-inf gives 0/0 in the softmax. Query i must at least see itself "
                         "(keep the diagonal): hide only j > i")
        Q2, K2, V2 = Q.copy(), K.copy(), V.copy()
        for a in (Q2, K2, V2):
            a[-1] += 5.0  # change the last token only: its query, key and value
        got2 = _numbers(_call(causal_attention, Q2, K2, V2, name="causal_attention",
                              on_error=shapes),
                        "the output")
        leaked = [i for i in range(T - 1) if not np.allclose(got[i], got2[i])] if got2.shape == \
            got.shape else []
        if leaked:
            raise _Wrong(f"future leaked: the output of token {leaked[0]} changed when only the "
                         f"last token (position {T - 1}) changed; output i must not depend on any "
                         "later token, neither on its key nor on its query")
        raise _Wrong(f"the output differs from causal attention by up to {_maxdiff(got, ref)}")
    return ("no token sees the future any more: each query's weights are normalised over its "
            "own keys (axis=-1), so no later query enters its denominator.")


# --------------------------------------------------------------------------------------------
# 3.4 A padded batch: the causal mask meets a key-padding mask
# --------------------------------------------------------------------------------------------
# The batch of the prediction: sequence 0 is left-padded by 2, sequence 1 right-padded by 2.
_PAD_REAL = np.array([[False, False, True, True, True], [True, True, True, False, False]])
_SIDES = ("left", "right")  # sequence 0 is left-padded, sequence 1 right-padded


def _padded_causal(real: np.ndarray) -> np.ndarray:
    """(B, T) True = real token -> (B, T, T): query i may see key j iff j <= i and j is real."""
    T = real.shape[1]
    return np.tril(np.ones((T, T), dtype=bool))[None] & real[:, None, :]


def _row_pairs(rows, what: str) -> set[tuple[int, int]]:
    """The learner's (sequence, query) pairs as a set of int tuples, else a hint."""
    if isinstance(rows, (str, bytes)) or callable(rows):
        raise _Wrong(f"{what} should be a list of (sequence, query) pairs such as [(1, 0)]; got "
                     f"{type(rows).__name__}")
    out = set()
    for item in rows:
        pair = tuple(item) if isinstance(item, (tuple, list, np.ndarray)) else None
        if pair is None or len(pair) != 2 or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair):
            raise _Wrong(f"{what} should hold (sequence, query) pairs of 0-based whole numbers, "
                         f"such as (1, 0); got {item!r}")
        out.add((int(pair[0]), int(pair[1])))
    return out


def _check_padding_prediction(fully_masked_rows, real_outputs_change) -> None:
    if fully_masked_rows is None:
        raise _NotAttempted("fully_masked_rows is still None: first predict which queries of "
                            "the padded batch may attend to no key at all")
    got = _row_pairs(fully_masked_rows, "fully_masked_rows")
    want = {(0, 0), (0, 1)}
    if got != want:
        pads = {(b, i) for b, i in zip(*np.nonzero(~_PAD_REAL), strict=True)}
        for hint, value in (
            ("every query listed is a padding position, but a query is fully masked only when "
             "none of the keys it may see is real: look again at what the causal window of a "
             "padding query AFTER the real tokens contains", pads),
            ("padding on the wrong side: the padding that empties a causal window is the "
             "padding a query has BEHIND it (the keys j <= i), not ahead of it",
             {(1, 3), (1, 4)}),
            ("no row is empty? The causal window of query i holds keys 0 .. i only; in a "
             "left-padded sequence, what are the first of those keys?", set()),
            ("off by one: query i sees keys 0 .. i, itself included; count the padding keys in "
             "each early window again", {(0, 0)}),
            ("off by one: query i sees keys 0 .. i, itself included; count the padding keys in "
             "each early window again", {(0, 0), (0, 1), (0, 2)}),
        ):
            if got == value:
                raise _Wrong(f"fully_masked_rows = {sorted(got)}: {hint}")
        raise _Wrong(f"fully_masked_rows = {sorted(got)}: for each query (b, i), list the keys "
                     "the causal mask lets it see, and keep the query only if none of them is a "
                     "real token")
    if real_outputs_change is None or (isinstance(real_outputs_change, dict) and all(
            v is None for v in real_outputs_change.values())):
        raise _NotAttempted("fully_masked_rows is right; now predict real_outputs_change: do the "
                            "real tokens' outputs change without the key-padding mask?")
    if not isinstance(real_outputs_change, dict) or set(real_outputs_change) != set(_SIDES):
        raise _Wrong(f"real_outputs_change should be a dict with the keys {list(_SIDES)}, each "
                     "True or False")
    for side in _SIDES:
        value = real_outputs_change[side]
        if value is None:
            raise _NotAttempted(f"real_outputs_change[{side!r}] is still None: write True or False")
        if not isinstance(value, (bool, np.bool_)):
            raise _Wrong(f"real_outputs_change[{side!r}] should be True or False; got {value!r}")
    if not real_outputs_change["left"]:
        raise _Wrong("real_outputs_change['left'] = False: in the left-padded sequence, list the "
                     "keys in the causal window 0 .. i of a real query i: is any of them padding? "
                     "Only the key-padding mask can hide those")
    if real_outputs_change["right"]:
        raise _Wrong("real_outputs_change['right'] = True: in the right-padded sequence, list the "
                     "keys in the causal window 0 .. i of a real query i: is any of them padding? "
                     "A key the causal mask already hides needs no second mask")


_PAD_CASES = (  # (B, T, seed): random left, right or no padding per sequence
    (3, 6, 340), (4, 5, 341), (2, 8, 342), (5, 4, 343),
)


def _pad_batch(B: int, T: int, seed: int) -> np.ndarray:
    """(B, T) True = real: sequence b is left-padded, right-padded or unpadded, in turn."""
    rng = np.random.default_rng(seed)
    real = np.ones((B, T), dtype=bool)
    for b in range(B):
        n_pad = int(rng.integers(1, T - 1))
        if b % 3 == 0:
            real[b, :n_pad] = False
        elif b % 3 == 1:
            real[b, T - n_pad:] = False
    return real


@_checker
def check_padded_causal_mask(fully_masked_rows, real_outputs_change=None,
                             padded_causal_mask=None):
    """Exercise 3.4: ``fully_masked_rows``, the (sequence, query) pairs of the shown padded batch
    that may attend to no key (predicted); ``real_outputs_change``, a dict ``{"left", "right"}``
    -> bool: whether dropping the key-padding mask (keeping the causal one) changes an output of
    a real token of the left- / right-padded sequence (predicted);
    ``padded_causal_mask(key_is_real)``: ``(B, T)`` bool (True = a real token) -> ``(B, T, T)``
    bool, True where query i may attend to key j: ``j <= i`` and key j real."""
    _check_padding_prediction(fully_masked_rows, real_outputs_change)
    if padded_causal_mask is None:
        raise _Wrong("both predictions are right; pass your function too: "
                     "check_padded_causal_mask(fully_masked_rows, real_outputs_change, "
                     "padded_causal_mask)")
    for B, T, seed in _PAD_CASES:
        real = _pad_batch(B, T, seed)
        got = _call(padded_causal_mask, torch.from_numpy(real.copy()), name="padded_causal_mask",
                    on_error=f"on key_is_real of shape {(B, T)}")
        if got is None:
            raise _NotAttempted("padded_causal_mask still returns None: replace the TODO with "
                                "your code and run the cell again")
        dtype = got.dtype if isinstance(got, (torch.Tensor, np.ndarray)) else None
        got = _arr(got, "the mask")
        _shape(got, (B, T, T), f"for key_is_real of shape {(B, T)} the mask",
               "(B, T, T): one (T, T) mask per sequence")
        if dtype not in (torch.bool, np.bool_):
            raise _Wrong(f"return a boolean mask (True = may attend); got dtype {dtype}")
        want = _padded_causal(real)
        if np.array_equal(got, want):
            continue
        causal = np.tril(np.ones((T, T), dtype=bool))[None]
        for hint, value in (
            ("True must mean 'may attend'; yours marks the forbidden pairs: flip it", ~want),
            ("inverted padding: key_is_real is True for the REAL tokens; you kept the padding "
             "keys and hid the real ones", causal & ~real[:, None, :]),
            ("you forgot the causal part: every query sees every real key, the future included",
             np.broadcast_to(real[:, None, :], (B, T, T))),
            ("the padding is ignored: that is the plain causal mask; also hide the keys that "
             "are padding", np.broadcast_to(causal, (B, T, T))),
            ("padding on the wrong axis: you hid the padding QUERIES (rows); a real query must "
             "not attend to padding KEYS (columns)", causal & real[:, :, None]),
            ("you hid the padding queries as well as the padding keys: their outputs are "
             "discarded anyway, and hiding them only adds fully masked rows (nan with -inf); "
             "restrict the keys only", causal & real[:, :, None] & real[:, None, :]),
            ("the two masks are combined with `or`: a key must be in the past AND real (&)",
             causal | real[:, None, :]),
            ("your triangle is the future: query i may see keys j <= i (tril), not j >= i",
             causal.transpose(0, 2, 1) & real[:, None, :]),
        ):
            if np.array_equal(got, value):
                raise _Wrong(f"for key_is_real of shape {(B, T)}: {hint}")
        b, i, j = (int(v[0]) for v in np.nonzero(got != want))
        raise _Wrong(f"for key_is_real of shape {(B, T)}, entry [{b}, {i}, {j}] is {got[b, i, j]}: "
                     "query i may attend to key j exactly when j <= i and key j is real")
    return ("left padding puts padding keys into every real query's causal window (and empties "
            "the windows of the first queries); right padding puts them only in the future, "
            "where the causal mask already hides them.")
