"""Exercise checkers for notebook 03 Causal attention.

As in ``nb01``: references come from the checker's own copies, made before the learner's code
runs; float32 answers are accepted; hints name the mistake that was actually made.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ._core import (
    _call,
    _checker,
    _close,
    _diagnose,
    _maxdiff,
    _rng,
    _shape,
    _softmax,
    _Wrong,
)
from .nb01 import _numbers, _row_order_hint

__all__ = [
    "check_sliding_window_attention",
    "check_attention_dropout",
    "check_causal_bug_fix",
]


# --------------------------------------------------------------------------------------------
# 3.1 A sliding-window causal module with its mask as a buffer
# --------------------------------------------------------------------------------------------
def _band(n: int, window: int) -> np.ndarray:
    """True where key j may be seen by query i: ``i - window < j <= i``."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return (j <= i) & (j > i - window)


def _window_outputs(x: np.ndarray, W: dict, allowed: np.ndarray, scale: bool = True,
                    after: bool = False) -> np.ndarray:
    """Reference: x (B, T, d_in) float64, W: the math's (d_in, d_out) matrices."""
    Q, K, V = x @ W["W_query"], x @ W["W_key"], x @ W["W_value"]
    S = Q @ np.swapaxes(K, -1, -2) / (math.sqrt(K.shape[-1]) if scale else 1.0)
    if after:
        return (_softmax(S) * allowed) @ V
    return _softmax(np.where(allowed, S, -np.inf)) @ V


def _mask_hint(mask: np.ndarray, n: int, window: int) -> None:
    ref = _band(n, window)
    if np.array_equal(mask, ref):
        return
    for hint, value in (
        ("the buffer is the plain causal mask: also hide keys that are `window` or more steps "
         "back (j > i - window)", np.tril(np.ones((n, n), dtype=bool))),
        ("off by one: query i should see exactly `window` keys, i - window + 1 .. i; yours sees "
         "window + 1", _band(n, window + 1)),
        ("off by one: query i should see exactly `window` keys, i - window + 1 .. i; yours sees "
         "window - 1", _band(n, window - 1) if window > 1 else None),
        ("True must mean 'may attend'; your buffer marks the forbidden keys: flip it", ~ref),
        ("your band looks into the future: query i may see keys j <= i only (a lower band)",
         ref.T),
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
    """Exercise 3.1: ``SlidingWindowAttention(d_in, d_out, context_length, window)`` is an
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
                       name="SlidingWindowAttention")
        if not isinstance(module, nn.Module):
            raise _Wrong(f"SlidingWindowAttention(...) should build an nn.Module; got "
                         f"{type(module).__name__}: subclass nn.Module and call "
                         "super().__init__() first")
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
                out = _call(module, x.clone(), name="forward")
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
        _diagnose(got, [
            ("forward ignores the window: it matches plain causal attention; apply the buffer "
             "you built, self.mask[:T, :T]", _window_outputs(x64, W, causal)
             if window < T else None),
            ("forward uses no mask at all: every query sees every key",
             _window_outputs(x64, W, np.ones((T, T), dtype=bool))),
            ("off by one in forward: query i should see exactly `window` keys",
             _window_outputs(x64, W, _band(T, window + 1)) if window < T else None),
            ("forgot the scaling: divide the scores by sqrt(d_out)",
             _window_outputs(x64, W, allowed, scale=False)),
            ("mask applied after the softmax without renormalising: set the hidden scores to "
             "-inf before the softmax", _window_outputs(x64, W, allowed, after=True)),
        ], atol=1e-5)
        raise _Wrong(f"for x of shape {(B, T, d_in)} the output differs from sliding-window "
                     f"attention by up to {_maxdiff(got, ref)}")
    return ("the band lives in one buffer, sliced to each input: every token sees itself and "
            "the window - 1 tokens before it.")


# --------------------------------------------------------------------------------------------
# 3.2 Attention dropout
# --------------------------------------------------------------------------------------------
@_checker
def check_attention_dropout(attention_dropout):
    """Exercise 3.2: ``attention_dropout(weights, p, rng)`` -> each weight zeroed independently
    with probability ``p`` (drawn from the NumPy Generator ``rng``) and the survivors divided by
    ``1 - p``, so the expected value of every weight is unchanged. ``weights`` is left unchanged."""
    rng = _rng(301)
    W2 = _softmax(rng.normal(size=(64, 64)))
    W3 = _softmax(rng.normal(size=(8, 24, 24)))  # a batch: masks must differ between sequences

    def run(W, p, seed):
        w_in = W.copy()
        got = _numbers(_call(attention_dropout, w_in, p, np.random.default_rng(seed),
                             name="attention_dropout"), "the dropped-out weights")
        _shape(got, W.shape, "the dropped-out weights", "(the same shape as weights)")
        if not np.array_equal(w_in, W):
            raise _Wrong("your function changed `weights` in place: return a new array")
        return got

    got0 = run(W2, 0.0, 1)
    if not got0.any():
        raise _Wrong("with p = 0 every weight was dropped: drop each weight with probability p "
                     "(keep it with probability 1 - p)")
    if not np.allclose(got0, W2):
        raise _Wrong("with p = 0 nothing should be dropped or rescaled: every weight should come "
                     "back unchanged")
    for W, p in ((W2, 0.2), (W2, 0.5), (W3, 0.3)):
        got = run(W, p, 2)
        kept = got != 0
        frac = 1.0 - kept.mean()
        if frac == 0.0:
            if np.allclose(got, W / (1 - p)):
                raise _Wrong(f"with p = {p} nothing was dropped: you divided every weight by "
                             "(1 - p) but never set any to 0; zero each one with probability p")
            if np.allclose(got, W):
                raise _Wrong(f"with p = {p} nothing changed: about {p:.0%} of the weights should "
                             "be set to 0 (and the rest divided by 1 - p)")
            raise _Wrong(f"with p = {p} no weight was set to 0: dropout zeroes each weight with "
                         "probability p")
        if not kept.any():
            raise _Wrong(f"with p = {p} every weight was zeroed")
        k_got, k_w = got[kept], W[kept]
        if not np.allclose(k_got, k_w / (1 - p)):
            if np.allclose(got.sum(axis=-1), 1.0) and not np.allclose(k_got, k_w):
                raise _Wrong("don't renormalise the rows after dropout: divide the survivors by "
                             "(1 - p) so each weight keeps its expected value")
            for factor, hint in (
                (1.0, "forgot to rescale: divide the kept weights by (1 - p) so the expected "
                      "value stays the same"),
                (1 / p, "divide the kept weights by (1 - p), not by p"),
                (1 - p, "divide the kept weights by (1 - p); you multiplied by it"),
                (p, "divide the kept weights by (1 - p); you multiplied by p"),
            ):
                if np.allclose(k_got, k_w * factor):
                    raise _Wrong(hint)
            raise _Wrong(f"every kept weight should be weight / (1 - p); with p = {p} the kept "
                         f"values differ by up to {_maxdiff(k_got, k_w / (1 - p))}")
        if abs(frac - (1 - p)) < 0.05 and abs(frac - p) > 0.05:
            raise _Wrong(f"you dropped {frac:.0%} of the weights with p = {p}: drop each weight "
                         "with probability p (keep it with probability 1 - p)")
        if abs(frac - p) > 0.05:
            raise _Wrong(f"you dropped {frac:.0%} of the weights; with p = {p} about {p:.0%} "
                         "should be zeroed (each one independently)")
        flat = kept.reshape(-1, *W.shape[-2:])
        if all(np.all(m == m[:, :1]) for m in flat):
            raise _Wrong("you drop whole rows (one random number per query): draw one per "
                         "weight, rng.random(weights.shape)")
        if all(np.all(m == m[:1, :]) for m in flat):
            raise _Wrong("you drop whole columns (the same keys for every query): draw one "
                         "random number per weight, rng.random(weights.shape)")
        if W.ndim == 3 and all(np.array_equal(m, flat[0]) for m in flat):
            raise _Wrong("every sequence of the batch got the same dropout pattern: draw "
                         "rng.random(weights.shape), not rng.random(weights.shape[-2:])")
        if not np.array_equal(run(W, p, 2), got):
            raise _Wrong("the same seed gave a different result: draw the random numbers from "
                         "the rng you are given (rng.random(weights.shape)), not np.random")
        if np.array_equal(run(W, p, 3) != 0, kept):
            raise _Wrong("a different rng gave the same mask: draw the mask from rng")
    return "survivors are scaled by 1/(1 - p), so the expected weights are unchanged."


# --------------------------------------------------------------------------------------------
# 3.3 The leaky causal attention
# --------------------------------------------------------------------------------------------
def _leaky_causal_attention(Q, K, V):
    """The buggy implementation shown in notebook 03 (marks the *past* as the future)."""
    T, d_k = Q.shape
    scores = Q @ K.T / np.sqrt(d_k)
    future = np.tril(np.ones((T, T), dtype=bool), k=-1)
    return _softmax(np.where(future, -np.inf, scores)) @ V


def _causal_reference(Q, K, V, scale=True, after=False, axis=-1, mult=False):
    T, d_k = Q.shape
    scores = Q @ K.T / (np.sqrt(d_k) if scale else 1.0)
    tri = np.tril(np.ones((T, T), dtype=bool))
    if mult:
        return _softmax(scores * tri) @ V
    if after:
        return (_softmax(scores) * tri) @ V
    return _softmax(np.where(tri, scores, -np.inf), axis=axis) @ V


@_checker
def check_causal_bug_fix(causal_attention):
    """Exercise 3.3: ``causal_attention(Q, K, V)`` -> ``(T, d_v)`` outputs where query i uses keys
    j <= i only. Q, K: NumPy ``(T, d_k)``; V: ``(T, d_v)``."""
    rng = _rng(302)
    for T, d_k, d_v in ((5, 4, 3), (6, 2, 2), (7, 3, 3), (1, 3, 2)):
        Q, K, V = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
        ref = _causal_reference(Q, K, V)
        inputs = [a.copy() for a in (Q, K, V)]
        got = _numbers(_call(causal_attention, *inputs, name="causal_attention", copy=False),
                       "the output")
        if not all(np.array_equal(a, b) for a, b in zip(inputs, (Q, K, V), strict=True)):
            raise _Wrong("your function changed Q, K or V in place: compute into new arrays")
        _shape(got, (T, d_v), "the output", "(T, d_v): one output per query")
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            raise _Wrong("the output contains nan: is some query masked from every key? Query i "
                         "must at least see itself (keep the diagonal)")
        _row_order_hint(got, ref)
        _diagnose(got, [
            ("still the original bug: the mask marks the past (j < i) as forbidden, so each "
             "token sees itself and the FUTURE; the future is j > i: np.triu(..., k=1)",
             _leaky_causal_attention(Q, K, V)),
            ("mask applied after softmax without renormalising: the rows no longer sum to 1; "
             "mask the scores with -inf before the softmax (or divide by the row sums again)",
             _causal_reference(Q, K, V, after=True)),
            ("future leaked: multiplying the scores by the mask sets them to 0, not -inf, and "
             "exp(0) = 1 still gives the future weight; use np.where(mask, scores, -np.inf)",
             _causal_reference(Q, K, V, mult=True)),
            ("forgot the scaling: divide the scores by sqrt(d_k)",
             _causal_reference(Q, K, V, scale=False)),
            ("softmax over the wrong axis: each query's row must sum to 1 (axis=-1)",
             _causal_reference(Q, K, V, axis=0)),
        ])
        K2, V2 = K.copy(), V.copy()
        K2[-1] += 5.0
        V2[-1] += 5.0
        got2 = _numbers(_call(causal_attention, Q.copy(), K2, V2, name="causal_attention"),
                        "the output")
        leaked = [i for i in range(T - 1) if not np.allclose(got[i], got2[i])] if got2.shape == \
            got.shape else []
        if leaked:
            raise _Wrong(f"future leaked: the output of token {leaked[0]} changed when only the "
                         f"last token (position {T - 1}) changed; keys j > i must get weight 0")
        raise _Wrong(f"the output differs from causal attention by up to {_maxdiff(got, ref)}")
    return "no token sees the future any more."
