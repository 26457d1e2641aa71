"""Exercise checkers for notebook 03 Causal attention (NumPy)."""

from __future__ import annotations

import numpy as np

from ._core import (
    _arr,
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

__all__ = [
    "check_causal_mask",
    "check_attention_dropout",
    "check_causal_bug_fix",
]

@_checker
def check_causal_mask(causal_mask):
    """``causal_mask(T)`` -> boolean ``(T, T)``, True where query i may attend to key j (j <= i)."""
    for T in (4, 1, 7):
        raw = _call(causal_mask, T, name="causal_mask")
        got = _arr(raw, "the mask")
        _shape(got, (T, T), "the mask", "(T, T): one row per query, one column per key")
        ref = np.tril(np.ones((T, T), dtype=bool))
        if got.dtype != np.bool_:
            if np.array_equal(got, ref.astype(float)):
                raise _Wrong("right pattern, but return a boolean array (dtype=bool; True = may "
                             "attend), e.g. np.tril(np.ones((T, T), dtype=bool))")
            raise _Wrong(f"return a boolean array (True = may attend); got dtype {got.dtype}")
        if np.array_equal(got, ref):
            continue
        _diagnose(got, [
            ("True should mean 'may attend'; you marked the forbidden future positions: flip it "
             "(~mask) or use np.tril", ~ref),
            ("that is the upper triangle, which looks into the future: query i may attend to "
             "keys j <= i, the lower triangle (np.tril)", ref.T),
            ("the diagonal is missing: a token may attend to itself (np.tril with k=0)",
             np.tril(np.ones((T, T), dtype=bool), k=-1)),
            ("one step of the future leaks in: use np.tril with k=0, not k=1",
             np.tril(np.ones((T, T), dtype=bool), k=1)),
        ])
        raise _Wrong(f"for T = {T} the mask should be the lower triangle including the diagonal "
                     "(j <= i)")
    return "query i may attend to keys 0..i; the mask is a lower triangle of True."


@_checker
def check_attention_dropout(attention_dropout):
    """``attention_dropout(weights, p, rng)`` -> each weight zeroed with probability ``p`` (drawn
    from the NumPy Generator ``rng``) and the survivors divided by ``1 - p``, so the expected
    value of every weight is unchanged. ``weights`` is left unchanged."""
    rng = _rng(301)
    W = _softmax(rng.normal(size=(64, 64)))

    def run(p, seed):
        w_in = W.copy()
        got = _arr(_call(attention_dropout, w_in, p, np.random.default_rng(seed),
                         name="attention_dropout"), "the dropped-out weights")
        _shape(got, W.shape, "the dropped-out weights", "(the same shape as weights)")
        if not np.array_equal(w_in, W):
            raise _Wrong("your function changed `weights` in place: return a new array")
        return got

    got0 = run(0.0, 1)
    if not got0.any():
        raise _Wrong("with p = 0 every weight was dropped: drop each weight with probability p "
                     "(keep it with probability 1 - p)")
    if not np.allclose(got0, W):
        raise _Wrong("with p = 0 nothing should be dropped or rescaled")
    for p in (0.2, 0.5):
        got = run(p, 2)
        kept = got != 0
        frac = 1.0 - kept.mean()
        if not kept.any():
            raise _Wrong(f"with p = {p} every weight was zeroed")
        if np.allclose(got.sum(axis=-1), 1.0) and not np.allclose(got[kept], W[kept] / (1 - p)):
            raise _Wrong("don't renormalise the rows after dropout: divide the survivors by "
                         "(1 - p) so each weight keeps its expected value")
        k_got, k_w = got[kept], W[kept]
        if not np.allclose(k_got, k_w / (1 - p)):
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
        if not np.array_equal(run(p, 2), got):
            raise _Wrong("the same seed gave a different result: draw the random numbers from "
                         "the rng you are given (rng.random(weights.shape)), not np.random")
        if np.array_equal(run(p, 3) != 0, kept):
            raise _Wrong("a different rng gave the same mask: draw the mask from rng")
    return "survivors are scaled by 1/(1 - p), so the expected weights are unchanged."


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
    """``causal_attention(Q, K, V)`` -> ``(T, d_v)`` outputs where query i uses keys j <= i only.
    Q, K: NumPy ``(T, d_k)``; V: ``(T, d_v)``."""
    rng = _rng(302)
    for T, d_k, d_v in ((5, 4, 3), (6, 2, 2), (1, 3, 2)):
        Q, K, V = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
        got = _arr(_call(causal_attention, Q.copy(), K.copy(), V.copy(), name="causal_attention"),
                   "the output")
        _shape(got, (T, d_v), "the output", "(T, d_v): one output per query")
        ref = _causal_reference(Q, K, V)
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            raise _Wrong("the output contains nan: is some query masked from every key? Query i "
                         "must at least see itself (keep the diagonal)")
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
        got2 = _arr(_call(causal_attention, Q.copy(), K2, V2, name="causal_attention"))
        leaked = [i for i in range(T - 1) if not np.allclose(got[i], got2[i])] if got2.shape == \
            got.shape else []
        if leaked:
            raise _Wrong(f"future leaked: the output of token {leaked[0]} changed when only the "
                         f"last token (position {T - 1}) changed; keys j > i must get weight 0")
        raise _Wrong(f"the output differs from causal attention by up to {_maxdiff(got, ref)}")
    return "no token sees the future any more."


