"""Exercise checkers for notebook 01 Simplified self-attention (NumPy)."""

from __future__ import annotations

import math

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
    "check_attention_weights_for_query",
    "check_stable_softmax",
    "check_context_vectors",
    "check_spot_the_bug",
]

@_checker
def check_attention_weights_for_query(attention_weights_for_query):
    """``attention_weights_for_query(X, i)`` -> the ``(T,)`` weights of query ``i``:
    ``softmax(X @ X[i])`` (no scaling in notebook 01). X: NumPy ``(T, d)``."""
    rng = _rng(101)
    cases = [(rng.uniform(-1, 1, (6, 3)), 1), (rng.uniform(-1, 1, (5, 4)), 0),
             (rng.uniform(-1, 1, (7, 2)), 6), (rng.normal(size=(4, 5)), 2)]
    for X, i in cases:
        T, d = X.shape
        got = _arr(_call(attention_weights_for_query, X.copy(), i,
                         name="attention_weights_for_query"), "the weights")
        _shape(got, (T,), "the weights", "(one weight per token, T,)")
        scores = X @ X[i]
        ref = _softmax(scores)
        if _close(got, ref):
            continue
        others = [(f"these are the weights of query {j}, not of query {i}: use the row X[i] "
                   "as the query", _softmax(X @ X[j])) for j in range(T) if j != i]
        _diagnose(got, [
            ("these are the raw scores (dot products X @ X[i]); turn them into weights with "
             "softmax", scores),
            ("you divided the scores by their sum; attention uses softmax (exponentiate, then "
             "divide by the sum of the exponentials), which also copes with negative scores",
             scores / scores.sum()),
            ("notebook 01 uses the plain dot products: no division by sqrt(d) yet",
             _softmax(scores / math.sqrt(d))),
            ("you exponentiated but did not normalise: divide by the sum of the exponentials",
             np.exp(scores)),
            *others,
        ])
        if not np.isclose(got.sum(), 1.0):
            raise _Wrong(f"the weights of query {i} sum to {got.sum():.4f}, not 1: softmax "
                         "makes them sum to 1")
        raise _Wrong(f"the weights of query {i} differ from softmax(X @ X[{i}]) by up to "
                     f"{_maxdiff(got, ref)}")
    return "the weights of a query are softmax(X @ X[i]) and sum to 1."


@_checker
def check_stable_softmax(stable_softmax):
    """``stable_softmax(x)`` -> softmax along the last axis, for any shape ``(..., n)``, that does
    not overflow for large scores and leaves ``x`` unchanged."""
    rng = _rng(102)
    ordinary = [rng.normal(size=(4, 5)), np.array([1.0, 2.0, 3.0]), rng.normal(size=(2, 3, 4)),
                rng.normal(size=(4, 4)) * 2]
    for x in ordinary:
        x_in = x.copy()
        got = _arr(_call(stable_softmax, x_in, name="stable_softmax", copy=False))
        _shape(got, x.shape, "the softmax", "(the same shape as x)")
        if not np.array_equal(x_in, x):
            raise _Wrong("your function changed its input x in place (e.g. x -= ...): work on a "
                         "copy, `z = x - x.max(axis=-1, keepdims=True)` makes one")
        ref = _softmax(x)
        if _close(got, ref):
            continue
        if not np.all(np.isfinite(got)):
            raise _Wrong("your softmax returns nan or inf even for small scores")
        _diagnose(got, [
            ("softmax over the wrong axis: each row (the last axis) must sum to 1; use "
             "axis=-1 with keepdims=True", _softmax(x, axis=0) if x.ndim > 1 else None),
            ("you normalised over the whole array; normalise each row separately "
             "(axis=-1, keepdims=True)", np.exp(x - x.max()) / np.exp(x - x.max()).sum()),
            ("you divided x by its sum without exponentiating: softmax is exp(x) / sum(exp(x))",
             x / x.sum(axis=-1, keepdims=True)),
            ("you exponentiated but did not normalise: divide by the sum along the last axis",
             np.exp(x)),
            ("you exponentiated but did not normalise: divide by the sum along the last axis",
             np.exp(x - x.max(axis=-1, keepdims=True))),
        ])
        sums = got.sum(axis=-1)
        if not np.allclose(sums, 1.0):
            bad = np.unravel_index(int(np.argmax(np.abs(sums - 1.0))), sums.shape)
            raise _Wrong(f"row {bad if len(bad) > 1 else bad[0]} sums to {sums[bad]:.4f}, not 1:"
                         " divide by the sum along the last axis (axis=-1, keepdims=True)")
        raise _Wrong(f"the values differ from softmax by up to {_maxdiff(got, ref)} (did you "
                     "forget keepdims=True? without it a square input broadcasts the wrong way)")
    large = np.array([[1000.0, 1001.0, 1002.0], [1002.0, 1000.0, 1001.5]])
    mixed = np.array([[1000.0, 1001.0, 999.0], [-2.0, 0.0, 1.0]])
    for x, is_mixed in ((large, False), (mixed, True)):
        got = _arr(_call(stable_softmax, x.copy(), name="stable_softmax"))
        _shape(got, x.shape, "the softmax", "(the same shape as x)")
        if _close(got, _softmax(x)):
            continue
        if not np.all(np.isfinite(got)):
            if is_mixed:
                raise _Wrong("nan for the input [[1000, 1001, 999], [-2, 0, 1]]: subtract each "
                             "row's own maximum (x.max(axis=-1, keepdims=True)), not the maximum "
                             "of the whole array")
            raise _Wrong("overflow: for scores like 1000, exp(1000) is inf and the result "
                         "becomes nan; subtract the row maximum before exponentiating")
        raise _Wrong(f"for large scores like {x[0].tolist()} the result differs from softmax "
                     f"by up to {_maxdiff(got, _softmax(x))}")
    return "no overflow for scores like 1000, and every row sums to 1."


def _context_cases():
    rng = _rng(103)
    return [rng.uniform(-1, 1, (6, 3)), rng.normal(size=(4, 5)), rng.uniform(0, 1, (3, 2))]


def _check_context(fn, name: str, raw_hint: str, batched: bool = False) -> str:
    cases = _context_cases()
    if batched:
        cases.append(_rng(104).normal(size=(2, 4, 3)))
    for X in cases:
        T, d = X.shape[-2:]
        if X.ndim == 3:
            got = _arr(_call(fn, X.copy(), name=name,
                             on_error="for a batch X of shape (2, 4, 3): X.T reverses ALL axes; "
                                      "use np.swapaxes(X, -1, -2)"), "the context vectors")
            ref = _softmax(X @ np.swapaxes(X, -1, -2)) @ X
            if _close(got, ref):
                continue
            _shape(got, X.shape, "for a batch X of shape (2, 4, 3) the context vectors",
                   "(..., T, d): use np.swapaxes(X, -1, -2) instead of X.T, which reverses ALL "
                   "axes of a batch")
            raise _Wrong("the batched case (2, 4, 3) is off: X.T reverses all axes of a batch; "
                         "use np.swapaxes(X, -1, -2) and softmax over axis=-1")
        got = _arr(_call(fn, X.copy(), name=name), "the context vectors")
        scores = X @ X.T
        weights = _softmax(scores)
        if got.shape == (T, T) and _close(got, weights):
            raise _Wrong(f"these are the attention weights (T, T) = {(T, T)}; the context vectors "
                         f"are weights @ X, shape (T, d) = {(T, d)}")
        _shape(got, (T, d), "the context vectors", "(T, d): one context vector per token")
        ref = weights @ X
        if _close(got, ref):
            continue
        _diagnose(got, [
            (raw_hint, scores @ X),
            ("softmax over the wrong axis: each query's weights (a row) must sum to 1, so use "
             "axis=-1 (or you multiplied by weights.T)", _softmax(scores, axis=0) @ X),
            ("notebook 01 uses the plain dot products: no division by sqrt(d) yet",
             _softmax(scores / math.sqrt(d)) @ X),
            ("you normalised the scores by dividing by their sum; use softmax",
             (scores / scores.sum(axis=-1, keepdims=True)) @ X),
            ("the context vectors are the weights times X, not X times the weights' transpose "
             "or the scores alone", scores),
        ])
        raise _Wrong(f"the context vectors differ from softmax(X @ X.T) @ X by up to "
                     f"{_maxdiff(got, ref)}")
    return "every context vector is a weighted average of the rows of X."


@_checker
def check_context_vectors(context_vectors):
    """``context_vectors(X)`` -> ``softmax(X X^T, axis=-1) @ X``, shape ``(..., T, d)``: also for
    a batch ``(B, T, d)``, so transpose with ``np.swapaxes(X, -1, -2)``."""
    return _check_context(
        context_vectors, "context_vectors",
        "the context vectors were computed from the raw scores X @ X.T instead of the softmax "
        "weights: apply softmax (row-wise) first, then multiply by X", batched=True)


@_checker
def check_spot_the_bug(fixed_context_vectors):
    """The fixed version of the buggy loop in notebook 01: same answer as ``context_vectors``."""
    return _check_context(
        fixed_context_vectors, "fixed_context_vectors",
        "still the bug: the context vector is built from the raw scores instead of the softmax "
        "weights; use `context[i] = weights @ X`") + " The bug was `scores @ X`."


