"""Checkers for the exercises at the end of notebooks 01-05.

Every checker takes the learner's function (or value), runs it on hidden, seeded random cases,
compares with a reference, and prints exactly **one** friendly line:

* ``not attempted yet: ...`` - the stub still returns ``None`` (or raises ``NotImplementedError``);
* ``correct! ...`` - every hidden case matches;
* ``not quite: ...`` - a specific hint for the mistake it recognised (forgot the scaling, softmax
  over the wrong axis, mask applied after softmax without renormalising, future leaked, wrong shape
  with the expected shape named, ...).

It also *returns* a ``CheckResult`` whose ``passed`` is ``True`` (correct), ``False`` (not quite)
or ``None`` (not attempted), so tests and graders can use it (it compares equal to that value and
shows nothing as the last expression of a notebook cell). A checker never raises: an exception in
the learner's code becomes a message. NumPy warnings from the learner's code (overflow, ...) are
silenced while it runs; the checker diagnoses their effect instead.

The exercises, by notebook (the checker names say what they check):

* 01: ``check_attention_weights_for_query``, ``check_stable_softmax``, ``check_context_vectors``,
  ``check_spot_the_bug``.
* 02: ``check_weight_transfer``, ``check_attention_entropy``, ``check_permutation_equivariance``.
* 03: ``check_causal_mask``, ``check_attention_dropout``, ``check_causal_bug_fix``.
* 04: ``check_cross_attention``, ``check_split_merge_heads``, ``check_parameter_count``,
  ``check_row_entropy``, ``check_attention_patterns``.
* 05: ``check_time_call``, ``check_online_softmax_step``, ``check_score_memory``,
  ``check_block_size``.

Notebooks 01 and 03 pass NumPy arrays to the learner's functions; 02, 04 and 05 pass PyTorch
tensors. Answers may be either (they are converted for comparison).
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch

__all__ = [
    "CheckResult",
    "check_attention_weights_for_query",
    "check_stable_softmax",
    "check_context_vectors",
    "check_spot_the_bug",
    "check_weight_transfer",
    "check_attention_entropy",
    "check_permutation_equivariance",
    "check_causal_mask",
    "check_attention_dropout",
    "check_causal_bug_fix",
    "check_cross_attention",
    "check_split_merge_heads",
    "check_parameter_count",
    "check_row_entropy",
    "check_attention_patterns",
    "check_time_call",
    "check_online_softmax_step",
    "check_score_memory",
    "check_block_size",
]

NOT_ATTEMPTED = "not attempted yet"
CORRECT = "correct!"
NOT_QUITE = "not quite:"


# --------------------------------------------------------------------------------------------
# Machinery: one message per check, learner exceptions become messages
# --------------------------------------------------------------------------------------------
class CheckResult:
    """What a checker returns: ``passed`` is True (correct), False (not quite) or None (not
    attempted yet); ``message`` is the line it printed. Truthy only when correct. It shows nothing
    when it is the last expression of a notebook cell (the printed line says it all)."""

    __slots__ = ("passed", "message")

    def __init__(self, passed: bool | None, message: str):
        self.passed = passed
        self.message = message

    def __bool__(self) -> bool:
        return self.passed is True

    def __eq__(self, other) -> bool:
        if isinstance(other, CheckResult):
            return self.passed is other.passed
        return self.passed is other if other is None or isinstance(other, bool) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"CheckResult(passed={self.passed!r})"

    def _ipython_display_(self) -> None:  # the checker already printed its one line
        return None


class _NotAttempted(Exception):
    """The stub has not been filled in yet."""


class _Wrong(Exception):
    """The answer is wrong; ``args[0]`` is the hint."""


def _checker(body):
    """Turn ``body`` (raises ``_Wrong``/``_NotAttempted`` or returns a success note) into a
    checker that prints one line, returns a ``CheckResult`` and never raises."""

    @functools.wraps(body)
    def run(*args, **kwargs) -> CheckResult:
        np_state = np.random.get_state()  # noqa: NPY002 - restore the notebook's global stream
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings(), \
                    torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")
                note = body(*args, **kwargs)
        except _NotAttempted as e:
            detail = f": {e.args[0]}" if e.args and e.args[0] else ""
            passed, message = None, f"{NOT_ATTEMPTED}{detail}"
        except _Wrong as e:
            passed, message = False, f"{NOT_QUITE} {e.args[0]}"
        except Exception as e:  # noqa: BLE001 - a checker must never crash
            passed = False
            message = f"{NOT_QUITE} the checker could not use your answer ({type(e).__name__}: {e})"
        else:
            passed, message = True, CORRECT + (f" {note}" if note else "")
        finally:
            np.random.set_state(np_state)  # noqa: NPY002
        print(message)
        return CheckResult(passed, message)

    return run


def _call(fn, *args, name: str = "your function", on_error: str = "", none_ok: bool = False,
          **kwargs):
    """Call learner code: NotImplementedError or a ``None`` result -> not attempted; any other
    exception -> a hint naming it (plus ``on_error`` advice)."""
    if not callable(fn):
        raise _Wrong(f"expected a function, got {type(fn).__name__}; pass the function itself "
                     "(no parentheses)")
    label = getattr(fn, "__name__", "")
    if isinstance(label, str) and label.isidentifier():
        name = label  # the learner's own name for it
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotAttempted(f"{name} still raises NotImplementedError: fill in the TODO") from None
    except Exception as e:  # noqa: BLE001 - learner code may raise anything
        extra = f" ({on_error})" if on_error else ""
        raise _Wrong(f"{name} raised {type(e).__name__}: {e}{extra}") from None
    if out is None and not none_ok:
        raise _NotAttempted(f"{name} still returns None: replace the TODO with your code and "
                            "run the cell again")
    return out


def _arr(x, what: str = "your result") -> np.ndarray:
    """A learner's array or tensor as float64 NumPy (booleans kept as bool)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.bool else x.double().numpy()
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001
        raise _Wrong(f"{what} should be an array or tensor; got {type(x).__name__}") from None
    if a.dtype == np.bool_:
        return a
    if a.dtype == object or not np.issubdtype(a.dtype, np.number):
        raise _Wrong(f"{what} should be a numeric array or tensor; got {type(x).__name__} "
                     f"with dtype {a.dtype}")
    return a.astype(np.float64)


def _shape(a: np.ndarray, expected: tuple, what: str = "your result", meaning: str = "") -> None:
    if a.shape != tuple(expected):
        extra = f" {meaning}" if meaning else ""
        raise _Wrong(f"{what}: wrong shape {a.shape}; expected {tuple(expected)}{extra}")


def _close(a, b, atol: float = 1e-6) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=1e-5, equal_nan=False))


def _diagnose(got: np.ndarray, candidates, atol: float = 1e-6) -> None:
    """Raise ``_Wrong(hint)`` for the first ``(hint, value)`` candidate that ``got`` matches."""
    for hint, value in candidates:
        if value is not None and _close(got, value, atol):
            raise _Wrong(hint)


def _maxdiff(a: np.ndarray, b: np.ndarray) -> str:
    return f"{float(np.nanmax(np.abs(a - b))):.4f}"


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def _entropy(w: np.ndarray, axis: int = -1) -> np.ndarray:
    """Entropy in nats along ``axis``; 0 * log 0 counts as 0."""
    logw = np.log(np.where(w > 0, w, 1.0))
    return -(w * logw).sum(axis=axis)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# 01 Simplified self-attention (NumPy)
# --------------------------------------------------------------------------------------------
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
        got = _arr(_call(stable_softmax, x_in, name="stable_softmax"))
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


# --------------------------------------------------------------------------------------------
# 02 Self-attention with trainable weights (PyTorch)
# --------------------------------------------------------------------------------------------
@_checker
def check_weight_transfer(transfer_weights):
    """``transfer_weights(sa_v1, sa_v2)`` copies the ``nn.Linear`` weights of a
    ``SelfAttentionV2`` into a ``SelfAttentionV1`` (in place) so both compute the same output."""
    try:
        from shared.modules import SelfAttentionV1, SelfAttentionV2
    except ImportError:
        raise _Wrong("shared.modules has no SelfAttentionV1/SelfAttentionV2 yet: update the "
                     "course files") from None
    names = ("W_query", "W_key", "W_value")
    for case, (d_in, d_out) in enumerate(((3, 2), (4, 4), (5, 3))):
        torch.manual_seed(200 + case)
        v1, v2 = SelfAttentionV1(d_in, d_out), SelfAttentionV2(d_in, d_out)
        before1 = {n: getattr(v1, n).detach().clone() for n in names}
        before2 = {n: getattr(v2, n).weight.detach().clone() for n in names}
        _call(transfer_weights, v1, v2, name="transfer_weights", none_ok=True,
              on_error="hint: nn.Linear stores its weight as (d_out, d_in) while v1's parameters "
                       "are (d_in, d_out): copy the transpose, sa_v2.W_query.weight.T")
        after2 = {n: getattr(v2, n).weight.detach() for n in names}
        if any(not torch.equal(before2[n], after2[n]) for n in names):
            raise _Wrong("sa_v2's weights changed: copy in the other direction, from sa_v2 "
                         "(nn.Linear) into sa_v1")
        try:
            after1 = {n: _arr(getattr(v1, n), f"sa_v1.{n}") for n in names}
        except AttributeError as e:
            raise _Wrong(f"sa_v1 lost an attribute ({e})") from None
        if all(np.array_equal(after1[n], before1[n].numpy()) for n in names):
            raise _NotAttempted("sa_v1's weights are unchanged: copy sa_v2's weights into it")
        for n in names:
            w = after2[n].double().numpy()
            if d_in != d_out and _close(after1[n], w):
                raise _Wrong("nn.Linear stores its weight as (d_out, d_in); v1's parameter is "
                             "(d_in, d_out): copy the transpose (.T)")
            if after1[n].shape != (d_in, d_out):
                raise _Wrong(f"sa_v1.{n} now has shape {after1[n].shape}; expected "
                             f"(d_in, d_out) = {(d_in, d_out)}: copy sa_v2.{n}.weight.T")
            if _close(after1[n], w) and not _close(w, w.T):
                raise _Wrong("nn.Linear stores its weight as (d_out, d_in); v1 multiplies "
                             "x @ W, so copy the transpose: sa_v2.W_query.weight.T")
            for other in names:
                if other != n and _close(after1[n], after2[other].double().numpy().T):
                    raise _Wrong(f"sa_v1.{n} received sa_v2.{other}'s weights: copy query to "
                                 "query, key to key and value to value")
        x = torch.rand(6, d_in, generator=torch.Generator().manual_seed(210 + case))
        try:
            with torch.no_grad():
                out1, out2 = v1(x), v2(x)
        except Exception as e:  # noqa: BLE001
            raise _Wrong(f"sa_v1 no longer runs after the transfer ({type(e).__name__}: {e}); "
                         "copy into its parameters, e.g. "
                         "sa_v1.W_query.data.copy_(sa_v2.W_query.weight.T)") from None
        if not torch.allclose(out1, out2, atol=1e-6):
            diff = float((out1 - out2).abs().max())
            raise _Wrong(f"after the transfer the two modules still differ by up to {diff:.4f}")
    return "sa_v1 and sa_v2 now give the same context vectors (W_q = W_query.weight.T)."


def _entropy_cases():
    g = torch.Generator().manual_seed(202)
    cases = [torch.randn(8, d_k, generator=g, dtype=torch.float64) for d_k in (4, 64, 256)]
    out = []
    for i, d_k in enumerate((4, 64, 256)):
        out.append((cases[i], torch.randn(8, d_k, generator=g, dtype=torch.float64)))
    big = torch.randn(6, 16, generator=g) * 30  # float32 and saturated: some weights are exactly 0
    out.append((big, big.flip(0).clone()))
    return out


def _mean_entropy(Q: np.ndarray, K: np.ndarray, scale: float, axis: int = -1,
                  dtype=np.float64) -> float:
    w = _softmax((Q @ K.T / scale).astype(dtype), axis=axis)
    return float(_entropy(w, axis=axis).mean())


@_checker
def check_attention_entropy(attention_entropy):
    """``attention_entropy(Q, K, scaled=True)`` -> the mean (over queries) entropy, in nats, of
    the rows of ``softmax(Q @ K.T / sqrt(d_k))`` (no division when ``scaled=False``).
    Q, K: torch tensors ``(T, d_k)``."""
    for Q, K in _entropy_cases():
        q, k = Q.double().numpy(), K.double().numpy()
        d_k = q.shape[-1]
        for scaled in (True, False):
            got = _arr(_call(attention_entropy, Q.clone(), K.clone(), scaled=scaled,
                             name="attention_entropy"), "the entropy")
            if got.size != 1:
                raise _Wrong(f"return one number (the mean entropy over the {q.shape[0]} "
                             f"queries); got shape {got.shape}")
            got = float(got.reshape(()))
            ref = _mean_entropy(q, k, math.sqrt(d_k) if scaled else 1.0)
            if math.isclose(got, ref, rel_tol=1e-4, abs_tol=1e-5):
                continue
            if math.isnan(got):
                raise _Wrong("your entropy is nan: when a weight underflows to exactly 0, "
                             "p * log(p) is 0 * (-inf); count it as 0 (torch.special.xlogy(p, p) "
                             "or torch.where(p > 0, p * p.log(), 0))")
            cands = [
                ("forgot the scaling: with scaled=True divide the scores by sqrt(d_k)",
                 _mean_entropy(q, k, 1.0) if scaled else None),
                ("with scaled=False use the raw scores Q @ K.T (no division)",
                 _mean_entropy(q, k, math.sqrt(d_k)) if not scaled else None),
                ("divide the scores by sqrt(d_k), not by d_k",
                 _mean_entropy(q, k, d_k) if scaled else None),
                ("the entropy is -sum(p * log p): you lost the minus sign", -ref),
                ("the course measures entropy in nats: use the natural log (torch.log), not "
                 "log2", ref / math.log(2)),
                ("average the row entropies over the queries (mean), don't sum them",
                 ref * q.shape[0]),
                ("softmax over the wrong axis: each query's weights (a row, dim=-1) must sum "
                 "to 1", _mean_entropy(q, k, math.sqrt(d_k) if scaled else 1.0, axis=0)),
            ]
            for hint, value in cands:
                if value is not None and math.isclose(got, value, rel_tol=1e-4, abs_tol=1e-5):
                    raise _Wrong(hint)
            raise _Wrong(f"for d_k = {d_k}, scaled={scaled} the mean entropy should be "
                         f"{ref:.4f} nats; got {got:.4f}")
    return "without scaling the entropy collapses as d_k grows; with it, it stays put."


def _identity(X):
    return X.copy()


def _make_attention(causal: bool = False, positions: bool = False, noise: bool = False):
    rng = _rng(203)
    W_q, W_k, W_v = (rng.normal(size=(4, 4)) for _ in range(3))
    P = rng.normal(size=(16, 4))
    calls = [0]

    def attention(X):
        X = np.asarray(X, dtype=np.float64)
        T = X.shape[-2]
        if positions:
            X = X + P[:T]
        S = (X @ W_q) @ (X @ W_k).T / 2.0
        if causal:
            S = np.where(np.tril(np.ones((T, T), dtype=bool)), S, -np.inf)
        out = _softmax(S) @ (X @ W_v)
        if noise:  # rounding-sized differences, as a different summation order produces
            calls[0] += 1
            out = out + 1e-13 * np.random.default_rng(calls[0]).standard_normal(out.shape)
        return out

    return attention


@_checker
def check_permutation_equivariance(is_permutation_equivariant):
    """``is_permutation_equivariant(attention_fn, X, perm)`` -> True iff
    ``attention_fn(X[perm])`` equals ``attention_fn(X)[perm]`` (up to rounding: use allclose).
    ``attention_fn`` maps a NumPy ``(T, d)`` array to ``(T, d_v)``."""
    rng = _rng(204)
    X = rng.normal(size=(5, 4))
    swap, cycle = np.array([1, 0, 2, 3, 4]), np.array([1, 2, 0, 4, 3])

    def ask(fn, perm):
        ans = _call(is_permutation_equivariant, fn, X.copy(), perm.copy(),
                    name="is_permutation_equivariant")
        if isinstance(ans, (bool, np.bool_)) or (isinstance(ans, torch.Tensor) and ans.numel() == 1
                                                 and ans.dtype == torch.bool):
            return bool(ans)
        raise _Wrong(f"return a single True or False (np.allclose gives one); got "
                     f"{type(ans).__name__}" + (f" of shape {tuple(ans.shape)}"
                                                if hasattr(ans, "shape") else ""))

    if not ask(_identity, swap):
        raise _Wrong("even for f(X) = X your check says False: compare f(X[perm]) with the "
                     "ORIGINAL output permuted the same way, f(X)[perm] (not with f(X) itself)")
    if not ask(_identity, cycle):
        raise _Wrong("right for a swap but False for a 3-cycle: the permutation goes the wrong "
                     "way; compare f(X[perm]) with f(X)[perm] (same perm, not its inverse)")
    if not ask(_make_attention(noise=True), cycle):
        raise _Wrong("self-attention IS permutation-equivariant, but the sums run in a different "
                     "order so the last digits differ: compare with np.allclose, not ==")
    if not ask(_make_attention(), cycle):
        raise _Wrong("plain self-attention is permutation-equivariant; your check says False")
    if ask(_make_attention(causal=True), cycle):
        raise _Wrong("your check says True for causal attention, which is NOT "
                     "permutation-equivariant (token 0 sees only itself): are you comparing "
                     "the same thing with itself?")
    if ask(_make_attention(positions=True), cycle):
        raise _Wrong("your check says True for attention with positional encodings added, which "
                     "is NOT permutation-equivariant: compare f(X[perm]) with f(X)[perm]")
    return ("permuting the tokens permutes the outputs the same way; causal masks and "
            "positional encodings break that.")


# --------------------------------------------------------------------------------------------
# 03 Causal attention (NumPy)
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# 04 Multi-head attention (PyTorch)
# --------------------------------------------------------------------------------------------
def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


@_checker
def check_cross_attention(cross_attention):
    """``cross_attention(X_q, X_kv, W_q, W_k, W_v)`` -> ``(T_q, d_v)``: queries from ``X_q``
    ``(T_q, d_in)``, keys and values from ``X_kv`` ``(T_kv, d_in)``; scaled, no mask."""
    rng = _rng(401)
    for T_q, T_kv, d_in, d_k, d_v in ((3, 5, 4, 2, 3), (4, 2, 3, 3, 2)):
        X_q, X_kv = rng.normal(size=(T_q, d_in)), rng.normal(size=(T_kv, d_in))
        W_q, W_k, W_v = (rng.normal(size=(d_in, d_k)), rng.normal(size=(d_in, d_k)),
                         rng.normal(size=(d_in, d_v)))
        got = _arr(_call(cross_attention, _t(X_q), _t(X_kv), _t(W_q), _t(W_k), _t(W_v),
                         name="cross_attention",
                         on_error="hint: queries come from X_q; keys AND values both come from "
                                  "X_kv, which may have a different length"), "the output")
        if got.shape == (T_kv, d_v):
            raise _Wrong(f"the output has shape {got.shape}, one row per key: the queries must "
                         f"come from X_q, giving (T_q, d_v) = {(T_q, d_v)}")
        _shape(got, (T_q, d_v), "the output", "(T_q, d_v): one output per query")
        Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
        S = Q @ K.T
        ref = _softmax(S / math.sqrt(d_k)) @ V
        if _close(got, ref):
            continue
        tri = np.tril(np.ones((T_q, T_kv), dtype=bool))
        _diagnose(got, [
            ("forgot the scaling: divide the scores by sqrt(d_k)", _softmax(S) @ V),
            ("cross-attention has no causal mask: every query may look at every key of X_kv",
             _softmax(np.where(tri, S, -np.inf) / math.sqrt(d_k)) @ V),
            ("the values must come from X_kv too (V = X_kv @ W_v)", None),
        ])
        raise _Wrong(f"the output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                     f"{_maxdiff(got, ref)}")
    return "queries from one sequence, keys and values from another of a different length."


@_checker
def check_split_merge_heads(split_heads, merge_heads):
    """``split_heads(x, num_heads)``: ``(B, T, d)`` -> ``(B, num_heads, T, head_dim)`` with head h
    owning columns ``h*head_dim:(h+1)*head_dim``; ``merge_heads(y)`` undoes it. Torch tensors."""
    g = torch.Generator().manual_seed(402)
    for B, T, H, hd in ((2, 3, 4, 2), (1, 5, 3, 4)):
        x = torch.randn(B, T, H * hd, generator=g, dtype=torch.float64)
        ref = x.view(B, T, H, hd).transpose(1, 2)
        got = _arr(_call(split_heads, x.clone(), H, name="split_heads"), "split_heads(x)")
        _shape(got, (B, H, T, hd), "split_heads(x)", "(B, num_heads, T, head_dim)")
        if not _close(got, ref.numpy()):
            _diagnose(got, [
                ("you reshaped straight to (B, H, T, head_dim), which mixes tokens and heads: "
                 "view as (B, T, H, head_dim) first, then swap dims 1 and 2 (.transpose(1, 2))",
                 x.reshape(B, H, T, hd).numpy()),
                ("head h must own the contiguous columns h*head_dim:(h+1)*head_dim: view as "
                 "(B, T, H, head_dim), not (B, T, head_dim, H)",
                 x.view(B, T, hd, H).permute(0, 3, 1, 2).numpy()),
            ])
            raise _Wrong(f"split_heads(x) differs from x.view(B, T, H, head_dim).transpose(1, 2) "
                         f"by up to {_maxdiff(got, ref.numpy())}")
        merged = _arr(_call(merge_heads, ref.contiguous(), name="merge_heads",
                            on_error="hint: after transpose the tensor is not contiguous; use "
                                     ".contiguous().view(...) or .reshape(...)"),
                      "merge_heads(y)")
        _shape(merged, (B, T, H * hd), "merge_heads(y)", "(B, T, num_heads * head_dim)")
        if not _close(merged, x.numpy()):
            _diagnose(merged, [
                ("transpose back to (B, T, H, head_dim) before reshaping to (B, T, d): "
                 "y.transpose(1, 2).reshape(B, T, d)", ref.reshape(B, T, H * hd).numpy()),
            ])
            raise _Wrong("merge_heads(split_heads(x)) does not give x back")
    return "(B, T, d) -> (B, H, T, head_dim) -> (B, T, d) round-trips exactly."


def _mha_count(d_model: int, num_heads: int, bias: bool) -> int:
    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)
    return sum(p.numel() for p in mha.parameters())


@_checker
def check_parameter_count(count_mha_parameters):
    """``count_mha_parameters(d_model, num_heads, bias=True)`` -> the number of parameters of
    ``torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)``: W_q, W_k, W_v and W_o
    (each d_model x d_model), plus one bias vector of d_model per projection when ``bias``."""
    for d, H, bias in ((768, 12, True), (64, 4, False), (10, 2, True), (12, 3, False)):
        ans = _call(count_mha_parameters, d, H, bias=bias, name="count_mha_parameters")
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a whole number; got {type(ans).__name__}") from None
        if got != int(got):
            raise _Wrong(f"return a whole number of parameters; got {got}")
        got = int(got)
        ref = _mha_count(d, H, bias)
        if got == ref:
            continue
        b = d if bias else 0
        hd = d // H
        for value, hint in (
            (3 * (d * d + b), "forgot the output projection W_o (another d_model x d_model "
                              "matrix, plus its bias)"),
            (4 * d * d, "forgot the biases: each of the 4 projections has d_model of them"),
            (4 * (d * d + d), "with bias=False there are no bias vectors"),
            (H * 4 * (d * d + b), "the heads split d_model into num_heads slices of "
                                  "head_dim; they don't multiply the parameters"),
            (H * 3 * (d * d + b) + d * d + b, "the heads split d_model into num_heads slices of "
                                              "head_dim; they don't multiply the parameters"),
            (4 * (d * hd + (hd if bias else 0)),
             "each projection maps d_model to num_heads * head_dim = d_model, not to head_dim"),
        ):
            if got == value:
                raise _Wrong(hint)
        raise _Wrong(f"for d_model = {d}, num_heads = {H}, bias = {bias} the count is "
                     f"{ref:,}; got {got:,} (4 matrices of d_model x d_model, plus biases)")
    return f"GPT-2 small's attention (d_model = 768, 12 heads) has {_mha_count(768, 12, True):,} " \
           "parameters per layer."


def _entropy_inputs():
    rng = _rng(403)
    T = 5
    causal = _softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), rng.normal(size=(T, T)),
                               -np.inf))
    return [_softmax(rng.normal(size=(4, 6))), _softmax(rng.normal(size=(2, 3, 4))), causal,
            np.full((3, 4), 0.25)]


@_checker
def check_row_entropy(row_entropy):
    """``row_entropy(weights)`` -> the entropy (nats) of every row, shape ``weights.shape[:-1]``;
    a zero weight contributes 0 (0 * log 0 = 0). Torch tensors ``(..., T_q, T_k)``."""
    for w in _entropy_inputs():
        got = _arr(_call(row_entropy, _t(w.copy()), name="row_entropy"), "the entropies")
        ref = _entropy(w)
        if got.size == 1 and ref.size > 1:
            raise _Wrong(f"return one entropy per row, shape {ref.shape}, not a single number")
        if got.shape == w.shape[:-2] + (w.shape[-1],) and got.shape != ref.shape:
            raise _Wrong(f"sum over the last axis (the keys), one entropy per query row: expected "
                         f"shape {ref.shape}, got {got.shape}")
        _shape(got, ref.shape, "the entropies", "(one per query row: weights.shape[:-1])")
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            raise _Wrong("nan: a masked weight is exactly 0 and 0 * log(0) = 0 * (-inf) = nan; "
                         "count it as 0 (torch.special.xlogy(p, p) or torch.where(p > 0, ...))")
        _diagnose(got, [
            ("the entropy is -sum(p * log p): you lost the minus sign", -ref),
            ("use the natural log (torch.log): the course measures entropy in nats",
             ref / math.log(2)),
            ("sum over the last axis (the keys of each query), not over the queries",
             _entropy(w, axis=-2) if w.shape[-1] == w.shape[-2] else None),
        ])
        raise _Wrong(f"the entropies differ from -sum(p log p) by up to {_maxdiff(got, ref)}")
    return "uniform weights over n keys have entropy log(n); a one-hot row has 0."


@_checker
def check_attention_patterns(make_patterns):
    """``make_patterns(T)`` -> ``{"uniform": ..., "peaked": ..., "local": ...}``, three ``(T, T)``
    weight matrices whose rows sum to 1: uniform (every weight 1/T), peaked (each query puts at
    least 0.9 on one key) and local (each query spreads its weight over keys j with |i - j| <= 1,
    every one of them > 0, and nothing elsewhere)."""
    notes = []
    for T in (6, 9):
        pats = _call(make_patterns, T, name="make_patterns")
        if not isinstance(pats, dict):
            raise _Wrong(f"return a dict with the keys 'uniform', 'peaked', 'local'; got "
                         f"{type(pats).__name__}")
        missing = [k for k in ("uniform", "peaked", "local") if k not in pats]
        if missing:
            raise _Wrong(f"the dict is missing {missing}; expected the keys 'uniform', 'peaked', "
                         "'local'")
        todo = [k for k in ("uniform", "peaked", "local") if pats[k] is None]
        if todo:
            raise _NotAttempted(f"make_patterns: {', '.join(repr(k) for k in todo)} still None")
        ent = {}
        for name in ("uniform", "peaked", "local"):
            w = _arr(pats[name], f"the {name} pattern")
            _shape(w, (T, T), f"the {name} pattern", "(T, T): one row per query")
            if (w < 0).any():
                raise _Wrong(f"the {name} pattern has negative weights")
            sums = w.sum(axis=-1)
            if not np.allclose(sums, 1.0):
                r = int(np.argmax(np.abs(sums - 1)))
                raise _Wrong(f"row {r} of the {name} pattern sums to {sums[r]:.4f}, not 1")
            ent[name] = float(_entropy(w).mean())
            if name == "uniform" and not np.allclose(w, 1.0 / T):
                raise _Wrong(f"uniform means every weight is 1/T = {1 / T:.4f}")
            if name == "peaked" and not (w.max(axis=-1) >= 0.9).all():
                r = int(np.argmin(w.max(axis=-1)))
                raise _Wrong(f"peaked: row {r}'s largest weight is {w[r].max():.4f}; each query "
                             "should put at least 0.9 on one key")
            if name == "local":
                i, j = np.indices((T, T))
                band = np.abs(i - j) <= 1
                if (w[~band] > 1e-9).any():
                    raise _Wrong("local: a query may only attend to keys j with |i - j| <= 1 "
                                 "(its neighbours and itself); weights outside that band must "
                                 "be 0")
                if (w[band] <= 0).any():
                    raise _Wrong("local: give every key with |i - j| <= 1 some weight (e.g. "
                                 "split it equally), not only one of them")
        if not ent["peaked"] < ent["local"] < ent["uniform"]:
            raise _Wrong("expected entropies peaked < local < uniform")
        notes.append(ent)
    e = notes[0]
    return (f"mean row entropy for T = 6: uniform {e['uniform']:.4f} > local {e['local']:.4f} > "
            f"peaked {e['peaked']:.4f} nats.")


# --------------------------------------------------------------------------------------------
# 05 Attention on the GPU (PyTorch)
# --------------------------------------------------------------------------------------------
class _FakeGPU:
    """A simulated asynchronous device with a virtual clock.

    ``launch()`` costs the host 5 microseconds and queues a kernel (50 ms the first time: warm-up,
    then 2 ms); ``sync()`` waits until the queue is empty; ``clock()`` reads the host time."""

    LAUNCH, FIRST, KERNEL = 5e-6, 50e-3, 2e-3

    def __init__(self):
        self.now = 0.0
        self.busy_until = 0.0
        self.calls = self.syncs = self.reads = 0
        self.calls_at_first_read = None
        self.busy_at_first_read = None

    def launch(self, *args, **kwargs):
        self.now += self.LAUNCH
        start = max(self.now, self.busy_until)
        self.busy_until = start + (self.FIRST if self.calls == 0 else self.KERNEL)
        self.calls += 1

    def sync(self):
        self.now = max(self.now, self.busy_until)
        self.syncs += 1

    def clock(self):
        if self.reads == 0:
            self.calls_at_first_read = self.calls
            self.busy_at_first_read = self.busy_until > self.now
        self.reads += 1
        return self.now


@_checker
def check_time_call(time_call):
    """``time_call(f, sync, clock=time.perf_counter)`` -> seconds per call of ``f()``, measured
    right: a few untimed warm-up calls, ``sync()`` before starting the clock, ``sync()`` before
    reading it again, the mean over several calls. The checker passes a simulated GPU."""
    gpu = _FakeGPU()
    ans = _call(time_call, gpu.launch, sync=gpu.sync, clock=gpu.clock, name="time_call")
    try:
        got = float(ans)
    except (TypeError, ValueError):
        raise _Wrong(f"return the seconds per call as a number; got {type(ans).__name__}") from None
    k = gpu.KERNEL
    if gpu.calls == 0:
        raise _Wrong("time_call never called f")
    if gpu.reads == 0:
        raise _Wrong("read the time with the clock you are given (clock()), so the checker's "
                     "simulated GPU can follow along")
    if abs(got - k) <= 0.05 * k:
        return (f"{got * 1e3:.2f} ms per call on the checker's simulated GPU (its first call "
                "takes 50 ms, then 2 ms per kernel).")
    if got < 0.5 * k:
        raise _Wrong(f"you measured {got * 1e6:.1f} microseconds per call, but each kernel runs "
                     "2 ms: the GPU works asynchronously, so call sync() before reading the clock "
                     "at the end (you timed only the kernel launches)")
    if gpu.calls_at_first_read == 0:
        raise _Wrong("the first call is slow (memory allocation, kernel selection, caches): make "
                     "a few untimed warm-up calls before starting the clock")
    if gpu.busy_at_first_read:
        raise _Wrong("synchronise before starting the clock too (after the warm-up): otherwise "
                     "unfinished warm-up work is counted in your timing")
    ratio = got / k
    if abs(ratio - round(ratio)) < 0.05 * ratio and round(ratio) >= 2:
        raise _Wrong(f"you returned {got * 1e3:.2f} ms, about {round(ratio)} calls' worth: return "
                     "the time per call (divide by the number of timed calls)")
    if abs(got - k * 1e3) <= 0.05 * k * 1e3:
        raise _Wrong("return seconds, not milliseconds")
    raise _Wrong(f"expected about {k * 1e3:.2f} ms per call (as seconds: {k}); got {got:.6f} s")


def _online_ref(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v


@_checker
def check_online_softmax_step(online_softmax_step):
    """``online_softmax_step(m, l, acc, s, v)`` -> ``(m_new, l_new, acc_new)`` after one block of
    scores ``s`` ``(n, b)`` and values ``v`` ``(b, d_v)``: running max ``m`` ``(n, 1)``, running
    sum ``l`` ``(n, 1)``, unnormalised ``acc`` ``(n, d_v)``; the output is ``acc / l`` at the end.
    Torch float64 tensors; start from ``m = -inf``, ``l = 0``, ``acc = 0``."""
    rng = _rng(501)
    n, d_v, b = 3, 2, 4
    V_all = rng.normal(size=(3 * b, d_v))
    S_all = rng.normal(size=(n, 3 * b)) * 2
    S_all[:, b:2 * b] += 3.0  # the second block raises the maximum: rescaling matters

    def step(m, l, acc, s, v):
        out = _call(online_softmax_step, _t(m.copy()), _t(l.copy()), _t(acc.copy()), _t(s.copy()),
                    _t(v.copy()), name="online_softmax_step")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise _Wrong("return the three updated quantities as a tuple (m_new, l_new, acc_new)")
        m_new, l_new, acc_new = (_arr(x, nm) for x, nm in zip(out, ("m_new", "l_new", "acc_new"),
                                                          strict=True))
        for x, nm in ((m_new, "m_new"), (l_new, "l_new")):
            if x.size != n:
                raise _Wrong(f"{nm} has shape {x.shape}; expected (n, 1) = {(n, 1)}")
        _shape(acc_new, (n, d_v), "acc_new", "(n, d_v)")
        return m_new.reshape(n, 1), l_new.reshape(n, 1), acc_new

    # one step from a state whose maximum is overtaken by the new block
    m0 = S_all[:, :b].max(axis=-1, keepdims=True)
    p0 = np.exp(S_all[:, :b] - m0)
    state = (m0, p0.sum(axis=-1, keepdims=True), p0 @ V_all[:b])
    s, v = S_all[:, b:2 * b], V_all[b:2 * b]
    got = step(*state, s, v)
    ref = _online_ref(*state, s, v)
    if not all(_close(g, r) for g, r in zip(got, ref, strict=True)):
        m, l, acc = state
        m_new = ref[0]
        p_new, p_old = np.exp(s - m_new), np.exp(s - m)
        alpha = np.exp(m - m_new)
        if np.isnan(np.concatenate([x.ravel() for x in got])).any():
            raise _Wrong("nan in your update: use exp(m_old - m_new) for the rescale factor (it is "
                         "0 on the first step, when m_old = -inf)")
        if not _close(got[0], m_new):
            if _close(got[0], s.max(axis=-1, keepdims=True)) or _close(got[0], s.max()):
                raise _Wrong("m_new must be the larger of the old maximum m and this block's "
                             "maximum: torch.maximum(m, s.amax(dim=-1, keepdim=True))")
            raise _Wrong("m_new should be torch.maximum(m, s.amax(dim=-1, keepdim=True))")
        cands = [
            ("forgot to rescale: when the maximum grows, multiply the old l and acc by "
             "exp(m_old - m_new) before adding the new block",
             (l + p_new.sum(-1, keepdims=True), acc + p_new @ v)),
            ("the rescale factor is exp(m_old - m_new) (at most 1), not exp(m_new - m_old)",
             (l / alpha + p_new.sum(-1, keepdims=True), acc / alpha + p_new @ v)),
            ("exponentiate the new scores relative to the NEW maximum: exp(s - m_new)",
             (alpha * l + p_old.sum(-1, keepdims=True), alpha * acc + p_old @ v)),
            ("keep acc unnormalised (a running sum of p @ v); divide by l only once, after the "
             "last block", (ref[1], ref[2] / ref[1])),
        ]
        for hint, (l_c, acc_c) in cands:
            if _close(got[1], l_c) and _close(got[2], acc_c):
                raise _Wrong(hint)
        if not _close(got[1], ref[1]):
            raise _Wrong("l_new should be exp(m - m_new) * l + "
                         "exp(s - m_new).sum(-1, keepdim=True)")
        raise _Wrong("acc_new should be exp(m - m_new) * acc + exp(s - m_new) @ v")
    # the whole online pass, from the initial state, must give softmax(S) @ V
    m, l, acc = np.full((n, 1), -np.inf), np.zeros((n, 1)), np.zeros((n, d_v))
    for j in range(0, 3 * b, b):
        m, l, acc = step(m, l, acc, S_all[:, j:j + b], V_all[j:j + b])
    out = acc / l
    full = _softmax(S_all) @ V_all
    if not _close(out, full):
        if np.isnan(out).any():
            raise _Wrong("nan on the first step (m = -inf): compute m_new first, then the "
                         "rescale factor exp(m - m_new), which is exactly 0 there")
        raise _Wrong(f"after all blocks acc / l differs from softmax(S) @ V by up to "
                     f"{_maxdiff(out, full)}")
    return "three blocks, one running max/sum/accumulator, the same result as softmax(S) @ V."


def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@_checker
def check_score_memory(score_memory_bytes):
    """``score_memory_bytes(B, H, T, block_size=None, dtype=torch.float32)`` -> bytes of scores
    held at once: the full ``B*H*T*T`` matrix for naive attention (``block_size=None``), or one
    ``min(block_size, T) x min(block_size, T)`` tile per (batch, head) for tiled attention."""
    cases = ((1, 1, 4, None, torch.float32), (2, 12, 1024, None, torch.float16),
             (2, 12, 1024, 256, torch.float32), (1, 8, 100, 256, torch.float32),
             (4, 16, 4096, 64, torch.bfloat16), (3, 2, 50, None, torch.float64))
    for B, H, T, bs, dtype in cases:
        ans = _call(score_memory_bytes, B, H, T, block_size=bs, dtype=dtype,
                    name="score_memory_bytes")
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a number of bytes; got {type(ans).__name__}") from None
        e = _dtype_bytes(dtype)
        side = T if bs is None else min(bs, T)
        ref = B * H * side * side * e
        if got == ref:
            continue
        what = f"B={B}, H={H}, T={T}, block_size={bs}, {dtype}"
        for value, hint in (
            (ref / e, "you returned the number of elements: multiply by the bytes per element "
                      "(4 for float32, 2 for float16/bfloat16, 8 for float64)"),
            (ref / B, "every batch entry has its own scores: multiply by B"),
            (ref / H, "every head has its own scores: multiply by H"),
            (ref / (B * H), "every (batch, head) pair has its own scores: multiply by B * H"),
            (B * H * T * side * e if bs is not None else None,
             "one tile is block_size x block_size, not T x block_size"),
            (B * H * bs * bs * e if bs is not None else None,
             "a block larger than T is clipped to T: use min(block_size, T)"),
            (B * H * T * T * e if bs is not None else None,
             "with a block_size only one block_size x block_size tile exists at a time, not the "
             "whole T x T matrix"),
            (ref * 8, "you counted bits: one byte is 8 bits (float32 = 4 bytes per element)"),
        ):
            if value is not None and got == value:
                raise _Wrong(f"{hint} (case {what})")
        raise _Wrong(f"for {what} expected {ref:,} bytes; got {got:,.0f}")
    return "naive attention's scores grow as T^2; a tile's do not grow with T at all."


@_checker
def check_block_size(choose_block_size):
    """``choose_block_size(B, H, budget_bytes, dtype=torch.float32)`` -> the largest power of two
    ``b`` (1, 2, 4, ...) whose score tiles, ``B * H * b * b`` elements, fit in ``budget_bytes``."""
    cases = ((1, 1, 64, torch.float32), (2, 12, 2 ** 20, torch.float32),
             (2, 12, 2 ** 20, torch.float16), (1, 1, 100, torch.float32),
             (8, 32, 2 ** 30, torch.bfloat16))
    for B, H, budget, dtype in cases:
        ans = _call(choose_block_size, B, H, budget, dtype=dtype, name="choose_block_size")
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a block size (an int); got {type(ans).__name__}") from None
        e = _dtype_bytes(dtype)
        ref = 1
        while B * H * (2 * ref) ** 2 * e <= budget:
            ref *= 2
        if got == ref:
            continue
        what = f"B={B}, H={H}, budget={budget:,} bytes, {dtype}"
        tile = B * H * got * got * e
        if got > 0 and got == int(got) and int(got) & (int(got) - 1):
            raise _Wrong(f"block sizes are powers of two: round down to one ({what}: got "
                         f"{got:g}, expected {ref})")
        if got == 2 * ref:
            raise _Wrong(f"a block of {got:g} needs {tile:,.0f} bytes, more than the budget: pick "
                         f"the largest block that still fits ({what})")
        if got > ref:
            raise _Wrong(f"a block of {got:g} needs {tile:,.0f} bytes of scores: did you forget "
                         f"B * H or the bytes per element? ({what})")
        raise _Wrong(f"a larger block still fits: {what} allows {ref}; got {got:g}")
    return "the largest power-of-two tile that fits the budget."
