"""Exercise checkers for notebook 01 Simplified self-attention (NumPy).

Every checker computes its reference from its own copy of the inputs *before* the learner's code
runs (so an answer that modifies its input in place cannot move the target), compares with
tolerances that accept float32 answers, and rejects values that are not numbers (a string such as
``"0.5"`` is not a number). The small helpers at the top are shared with ``nb02`` and ``nb03``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

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
    _unless_unanswered,
    _Wrong,
)

__all__ = [
    "check_invariance_prediction",
    "check_log_softmax",
    "check_cosine_attention",
    "check_design_embeddings",
    "check_spot_the_bug",
]


# --------------------------------------------------------------------------------------------
# Helpers shared by the checkers of notebooks 01-03
# --------------------------------------------------------------------------------------------
def _numbers(x, what: str) -> np.ndarray:
    """A learner's *value* (list, array, tensor) as float64: no functions, strings or booleans."""
    if callable(x) and not isinstance(x, (np.ndarray, torch.Tensor)):
        raise _Wrong(f"{what}: give the numbers themselves (a list or an array), not a function")
    if isinstance(x, (str, bytes)):
        text = repr(x) if len(x) <= 40 else repr(x[:37]) + "..."
        raise _Wrong(f"{what} should be numbers, not the text {text}")
    a = _arr(x, what)
    if a.dtype == np.bool_:
        raise _Wrong(f"{what} should be numbers, not True/False values")
    return a


def _scalar(x, what: str) -> float:
    """A learner's single number (int, float, 0-d or 1-element array/tensor) as a float."""
    if isinstance(x, (bool, np.bool_)):
        raise _Wrong(f"{what} should be a number, not {x!r}")
    if isinstance(x, (str, bytes)):
        raise _Wrong(f"{what} should be a number, not the text {x!r}: return it without quotes")
    a = _numbers(x, what)
    if a.size != 1:
        raise _Wrong(f"{what} should be one number; got an array of shape {a.shape}")
    value = float(a.reshape(()))
    if not math.isfinite(value):
        raise _Wrong(f"{what} is {value}, not a finite number")
    return value


def _rows_permuted(got: np.ndarray, ref: np.ndarray, atol: float = 1e-6) -> bool:
    """True when ``got`` holds exactly the rows of ``ref`` (a 2-D array), in a different order."""
    if got.shape != ref.shape or got.ndim != 2 or _close(got, ref, atol):
        return False
    used = np.zeros(len(ref), dtype=bool)
    for row in got:
        match = [j for j in range(len(ref)) if not used[j] and _close(row, ref[j], atol)]
        if not match:
            return False
        used[match[0]] = True
    return True


def _row_order_hint(got: np.ndarray, ref: np.ndarray) -> None:
    if _rows_permuted(got, ref):
        raise _Wrong("your output has the right rows in the wrong order: row i must be the "
                     "output of query i (did you sort, reverse or shuffle something?)")


# --------------------------------------------------------------------------------------------
# The prediction typed inside section 5 (not an exercise, so not in __all__: the notebook imports
# it from this module): silent while still `...`, graded once the learner types one
# --------------------------------------------------------------------------------------------
def _weight_name(answer, i: int, j: int) -> str:
    """"A[1, 4]", "a[1,4]", "equal", "same" ... -> "A[i, j]", "A[j, i]" or "equal"."""
    options = f'"A[{i}, {j}]", "A[{j}, {i}]" or "equal"'
    if not isinstance(answer, str):
        raise _Wrong(f"pred_larger should be text in quotes, one of {options}; got "
                     f"{type(answer).__name__}")
    text = answer.strip().lower().replace(" ", "")
    if text in ("equal", "same", "="):
        return "equal"
    for a, b in ((i, j), (j, i)):
        if text == f"a[{a},{b}]":
            return f"A[{a}, {b}]"
    raise _Wrong(f"pred_larger = {answer!r}: type one of {options}")


@_unless_unanswered
@_checker
def grade_mirror_prediction(pred_larger, A, i: int = 1, j: int = 4):
    """Section 5: ``pred_larger`` names the larger of ``A[i, j]`` and ``A[j, i]`` (``"A[1, 4]"``,
    ``"A[4, 1]"``, or ``"equal"`` for a symmetric pair) in the weights ``A`` (``(T, T)``, rows
    from a softmax of a symmetric score matrix)."""
    guess = _weight_name(pred_larger, i, j)
    A = np.asarray(A, dtype=np.float64)
    a_ij, a_ji = float(A[i, j]), float(A[j, i])
    fwd, back = f"A[{i}, {j}]", f"A[{j}, {i}]"
    if abs(a_ij - a_ji) <= 1e-9 * max(abs(a_ij), abs(a_ji)):
        truth, measured = "equal", f"{fwd} = {back} = {a_ij:.4f}"
    else:
        truth = fwd if a_ij > a_ji else back
        small = back if truth == fwd else fwd
        measured = f"{truth} = {max(a_ij, a_ji):.4f} > {small} = {min(a_ij, a_ji):.4f}"
    said = (f"you predicted {fwd} = {back}" if guess == "equal" else
            f"you predicted {guess} > {back if guess == fwd else fwd}")
    if guess == truth:
        return f"{said}; measured: {measured} too"
    if guess == "equal":
        raise _Wrong(f"{said}; measured: {measured}. Both weights come from the same score "
                     f"Omega[{i}, {j}] = Omega[{j}, {i}]: what else enters a weight, and is it the "
                     f"same in rows {i} and {j}?")
    if truth == "equal":
        raise _Wrong(f"{said}; measured: {measured}. The two share the score; here rows {i} and "
                     f"{j} also divide it by the same sum")
    raise _Wrong(f"{said}; measured: {measured}. Both weights are e^Omega[{i}, {j}] divided by "
                 f"the sum of e^score over a row: which of rows {i} and {j} has the larger sum?")


# --------------------------------------------------------------------------------------------
# 1.1 Which changes leave the weights alone? (a prediction, graded before the learner measures)
# --------------------------------------------------------------------------------------------
# How often each staged hint has been given in this kernel: the first miss gets a count and one
# question, a later miss the measurement (1.1 and 1.3).
_MISSES: dict[str, int] = {}


def _miss(kind: str) -> int:
    """Count one more miss of ``kind`` and return how many came before it."""
    before = _MISSES.get(kind, 0)
    _MISSES[kind] = before + 1
    return before


_CHANGE_LETTERS = "abcdefg"
# The question each letter gets when its prediction is wrong: it names what was overlooked
# without saying which way the answer goes.
_CHANGE_QUESTIONS = {
    "a": "(a) adds one constant to every score: what did subtracting a constant from a whole row "
         "do to the stable softmax's weights in section 4?",
    "b": "(b) adds a different constant to each row, but the same one across a row: the softmax "
         "normalises each row on its own, so which constants can it see?",
    "c": "(c) adds 5 to the scores of one key only, so the added constant is not the same across "
         "a row: what happens to that key's share of each row?",
    "d": "(d) doubles X, which multiplies every score by 4: is that a shift of the scores or a "
         "temperature?",
    "e": "(e) flips every embedding: what is (-x_i)·(-x_j)?",
    "f": "(f) adds 1 to every coordinate: write out (x_i + 1)·(x_j + 1); is the extra term the "
         "same for every key j of row i?",
    "g": "(g) rotates every embedding by the same R: what does a rotation do to lengths and "
         "angles, and so to every dot product?",
}


def _changed_weights() -> dict[str, float]:
    """Per letter of exercise 1.1, the largest change of ``softmax(X X^T)`` on notebook 01's six
    tokens (measured here, not assumed)."""
    from shared.data import load_embeddings

    _, X = load_embeddings()
    T = X.shape[0]
    Q, R = np.linalg.qr(_rng(101).normal(size=(3, 3)))
    R = Q * np.sign(np.diag(R))  # an orthogonal matrix
    if np.linalg.det(R) < 0:
        R[:, 0] = -R[:, 0]  # a rotation: det = +1
    S = X @ X.T
    A = _softmax(S)
    key0 = (np.arange(T) == 0).astype(float)
    changed = {"a": S + 5, "b": S + np.arange(T)[:, None], "c": S + 5 * key0,
               "d": (2 * X) @ (2 * X).T, "e": (-X) @ (-X).T, "f": (X + 1) @ (X + 1).T,
               "g": (X @ R) @ (X @ R).T}
    return {k: float(np.abs(_softmax(v) - A).max()) for k, v in changed.items()}


def _letters(answer) -> set[str]:
    """A learner's set (list, tuple, or a string such as "a, b") of the letters a-g."""
    if isinstance(answer, str):
        answer = [c for c in answer.lower() if c.isalpha()]
    if isinstance(answer, dict) or not isinstance(answer, (set, frozenset, list, tuple)):
        raise _Wrong("predicted_unchanged should be a set of letters such as {\"a\", \"c\"} (or "
                     f"set() for none); got {type(answer).__name__}")
    letters = set()
    for x in answer:
        if not isinstance(x, str) or x.strip().lower() not in _CHANGE_LETTERS:
            raise _Wrong(f"predicted_unchanged contains {x!r}: use the letters a to g of the "
                         "changes")
        letters.add(x.strip().lower())
    return letters


@_checker
def check_invariance_prediction(predicted_unchanged):
    """Exercise 1.1: ``predicted_unchanged``, the set of letters (a to g) of the changes that
    leave notebook 01's weights ``softmax(X X^T)`` unchanged, typed before measuring. The truth is
    measured on the six tokens (a change counts as harmless below 1e-12). A first miss gets the
    count of letters right and one question about the first wrong letter; a later miss gets the
    measurement."""
    if predicted_unchanged is None:
        raise _NotAttempted("predicted_unchanged is still None: type the letters of the changes "
                            "that leave A unchanged, before you measure")
    guess = _letters(predicted_unchanged)
    change = _changed_weights()
    truth = {k for k, v in change.items() if v < 1e-12}
    if guess == truth:
        return ("the softmax sees only differences within a row, so a constant per row (a, b) "
                "cancels and a per-key one (c) does not; XX^T sees only lengths and angles, so a "
                "flip (e) or a rotation (g) leaves every score, while 2X (d) is a temperature of "
                "1/4.")
    right = sum((k in guess) == (k in truth) for k in _CHANGE_LETTERS)
    if _miss("1.1 prediction") == 0:
        first_wrong = next(k for k in _CHANGE_LETTERS if (k in guess) != (k in truth))
        raise _Wrong(f"{right} of the 7 letters right. One to rethink: "
                     f"{_CHANGE_QUESTIONS[first_wrong]} The next run of this cell shows the "
                     "measurement")
    measured = ", ".join(f"({k}) {'below 1e-12' if v < 1e-12 else f'{v:.4f}'}"
                         for k, v in change.items())
    raise _Wrong(f"measured largest change of A: {measured}; your prediction had {right} of the "
                 "7 right. Before you retype it, explain each letter you got wrong")


# --------------------------------------------------------------------------------------------
# 1.2 Log-softmax without overflow or underflow
# --------------------------------------------------------------------------------------------
def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def _logsm_close(got: np.ndarray, ref: np.ndarray) -> bool:
    # float32 answers are fine: about 7 significant digits of values up to ~1000
    return got.shape == ref.shape and bool(np.all(np.isfinite(got))) and \
        bool(np.allclose(got, ref, rtol=1e-5, atol=1e-5))


@_checker
def check_log_softmax(log_softmax):
    """Exercise 1.2: ``log_softmax(x)`` -> ``log(softmax(x))`` along the last axis of ``(..., n)``,
    finite for every finite input (no overflow for scores like 1000, no ``-inf`` for a row that
    spans more than ~745), ``x`` left unchanged. Hidden rows whose maximum lies more than 709
    above their minimum and their mean defeat shifting by anything but the maximum."""
    rng = _rng(102)
    cases = [
        ("small", rng.normal(size=(4, 5))),
        ("vector", np.array([1.0, 2.0, 3.0])),
        ("batch", rng.normal(size=(2, 3, 4))),
        ("square", rng.normal(size=(4, 4)) * 2),
        ("large", np.array([[1000.0, 1001.0, 1002.0], [1002.0, 1000.0, 1001.5]])),
        ("mixed", np.array([[1000.0, 1001.0, 999.0], [-2.0, 0.0, 1.0]])),
        ("span", np.array([[0.0, 1000.0], [-800.0, 5.0]])),
        # the maximum sits more than 709 above the mean and the minimum: only max works
        ("span", np.array([[0.0, 0.0, 0.0, 0.0, 1500.0], [3.0, 1.0, -2.0, 0.0, -1500.0]])),
    ]
    for kind, x in cases:
        ref = _log_softmax(x)  # from the checker's own array, before the learner's code runs
        x_in = x.copy()
        got = _numbers(_call(log_softmax, x_in, name="log_softmax", copy=False,
                             on_error=f"on an x of shape {x.shape}"), "the log-softmax")
        _shape(got, x.shape, "the log-softmax", "(the same shape as x)")
        if not np.array_equal(x_in, x):
            raise _Wrong("your function changed its input x in place (e.g. x -= ...): work on a "
                         "new array, `z = x - x.max(axis=-1, keepdims=True)` makes one")
        if _logsm_close(got, ref):
            continue
        finite = np.isfinite(got)
        with np.errstate(all="ignore"):
            log_of_softmax = np.log(_softmax(x))
            shift_min = x - x.min(axis=-1, keepdims=True)
            via_min = shift_min - np.log(np.exp(shift_min).sum(axis=-1, keepdims=True))
            shift_all = x - x.max()
            via_global = shift_all - np.log(np.exp(shift_all).sum(axis=-1, keepdims=True))
            no_keepdims = None
            if x.ndim == 2 and x.shape[0] == x.shape[1]:
                z = x - x.max(axis=-1)  # broadcasts the row maxima along the rows
                no_keepdims = z - np.log(np.exp(z).sum(axis=-1))
        if not finite.all():
            if kind == "span" and np.array_equal(finite, np.isfinite(log_of_softmax)):
                raise _Wrong(f"-inf for the row {x[0].tolist()}: you took the log of the softmax, "
                             "but a weight like e^-1000 underflows to exactly 0 and log(0) = "
                             "-inf. Take the logarithm of the shifted fraction on paper first "
                             "(log of a quotient, log of an exponential): then no weight is "
                             "ever formed")
            if kind == "span":
                raise _Wrong(f"inf or nan for the row {x[0].tolist()}, which spans more than 709: "
                             "shifting by the minimum (or the mean) still overflows exp; shift "
                             "each row by its maximum")
            if kind == "mixed":
                raise _Wrong("inf or nan for [[1000, 1001, 999], [-2, 0, 1]]: subtract each row's "
                             "own maximum (x.max(axis=-1, keepdims=True)), not the maximum of the "
                             "whole array")
            if kind == "large":
                raise _Wrong("overflow: for scores like 1000, exp(1000) is inf; subtract the row "
                             "maximum before exponentiating")
            raise _Wrong("your log-softmax returns nan or inf even for small scores")
        _diagnose(got, [
            ("these are the softmax weights, not their logarithms: return log(softmax(x)), "
             "and compute it without forming the weights", _softmax(x)),
            ("you subtracted the maximum but forgot the denominator of the fraction: the result "
             "must be the log of weights that sum to 1 (np.exp of your rows does not sum to 1)",
             x - x.max(axis=-1, keepdims=True)),
            ("wrong axis: each slice along the LAST axis is one softmax; use axis=-1 with "
             "keepdims=True", _log_softmax(x, axis=0) if x.ndim > 1 else None),
            ("use the natural logarithm (np.log), not log2", _log_softmax(x) / math.log(2)),
            ("use the natural logarithm (np.log), not log10", _log_softmax(x) / math.log(10)),
            ("subtract each row's own maximum, not the maximum of the whole array",
             via_global if np.isfinite(via_global).all() else None),
            ("shifting by the minimum is not enough (a row spanning more than 709 overflows): "
             "shift by the maximum", via_min if np.isfinite(via_min).all() else None),
            ("keepdims=True is missing: without it the row maxima (or sums) of a square input "
             "broadcast along the wrong axis", no_keepdims),
        ], atol=1e-5)
        if kind == "span":
            raise _Wrong(f"for the row {x[0].tolist()} your values are off by up to "
                         f"{_maxdiff(got, ref)}: clipping the weights or adding a small epsilon "
                         "before the log hides the underflow but gives the wrong number (log of "
                         "e^-1000 is -1000): take the logarithm of the fraction on paper, so that "
                         "no weight is formed at all")
        raise _Wrong(f"for x = {x.tolist()} your values differ from log(softmax(x)) by up to "
                     f"{_maxdiff(got, ref)}")
    return "finite for scores like 1000 and for rows spanning more than 709."


# --------------------------------------------------------------------------------------------
# 1.3 Cosine-similarity attention
# --------------------------------------------------------------------------------------------
def _cosine_weights(X: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(X, axis=-1, keepdims=True)
    U = X / n
    return _softmax(U @ U.T)


_ASKED_ROWS = ("journey", "one")  # 1.3 asks about these two rows only


def _sharper_rows() -> tuple[list[str], np.ndarray, np.ndarray]:
    """The six tokens of notebook 01, and per row the span (largest minus smallest score) of the
    dot-product scores and of the cosines: largest / smallest weight = e^span."""
    from shared.data import load_embeddings

    tokens, X = load_embeddings()
    S = X @ X.T
    n = np.linalg.norm(X, axis=-1, keepdims=True)
    cos = S / (n * n.T)
    return tokens, np.ptp(S, axis=-1), np.ptp(cos, axis=-1)


def _names(names: set[str]) -> str:
    """{'one'} -> "'one'"; {'a', 'b'} -> "'a' and 'b'" (sorted, so the text is stable)."""
    quoted = [repr(n) for n in sorted(names)] or ["no row"]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _token_set(answer, tokens: list[str], what: str) -> set[str]:
    """A learner's set (list, tuple) of token names or 0-based indices as a set of names."""
    if isinstance(answer, (str, int, np.integer)) and not isinstance(answer, bool):
        answer = [answer]
    if isinstance(answer, dict) or not isinstance(answer, (set, frozenset, list, tuple)):
        raise _Wrong(f"{what} should be a set of token names such as {{\"Your\", \"step\"}} "
                     f"(or set() for none); got {type(answer).__name__}")
    names = set()
    for a in answer:
        if isinstance(a, (int, np.integer)) and not isinstance(a, bool) and 0 <= a < len(tokens):
            names.add(tokens[int(a)])
        elif isinstance(a, str) and a.strip() in tokens:
            names.add(a.strip())
        else:
            raise _Wrong(f"{what} contains {a!r}, which is not one of the six tokens "
                         f"{tokens} (names, or indices 0 to {len(tokens) - 1})")
    return names


@_checker
def check_cosine_attention(cosine_attention_weights, predicted_sharper_rows=None):
    """Exercise 1.3: ``cosine_attention_weights(X)`` -> ``softmax(cos)`` row by row, ``(T, T)``,
    where ``cos[i, j] = x_i . x_j / (|x_i| |x_j|)``. X: NumPy ``(T, d)``, no zero rows, left
    unchanged (the learner's function gets the checker's array itself, so ``X /= ...`` shows).
    Then ``predicted_sharper_rows``: which of the rows "journey" and "one" of notebook 01 get
    sharper (a larger ratio of largest to smallest weight) with cosines than with dot products,
    made before measuring (a set of names or 0-based indices). A first wrong prediction gets the
    question to think through; a later one is shown the measurement."""
    rng = _rng(103)
    lengths = np.array([[1.0], [100.0], [0.01], [7.0], [0.3]])
    cases = [rng.uniform(0.05, 1, (6, 3)), rng.normal(size=(4, 5)),
             rng.normal(size=(5, 2)) * lengths]  # rows of very different lengths
    for X in cases:
        ref = _cosine_weights(X)
        T = X.shape[0]
        x_in = X.copy()
        got = _numbers(_call(cosine_attention_weights, x_in, name="cosine_attention_weights",
                             copy=False, on_error=f"on an X of shape {X.shape}"), "the weights")
        if got.shape != (T, T) and got.ndim == 2 and got.shape[1] == X.shape[1]:
            raise _Wrong(f"return the weights (T, T) = {(T, T)}, not context vectors "
                         f"{got.shape}")
        _shape(got, (T, T), "the weights", "(T, T): one row per query, one column per key")
        if not np.array_equal(x_in, X):
            raise _Wrong("your function changed X in place (e.g. X /= ...): divide into a new "
                         "array instead")
        if _close(got, ref):
            continue
        n = np.linalg.norm(X, axis=-1, keepdims=True)
        S = X @ X.T
        cos = S / (n * n.T)
        _diagnose(got, [
            ("these are the cosine similarities themselves: apply softmax to each row", cos),
            ("you used the plain dot product: divide each score by BOTH vector lengths, "
             "|x_i| |x_j|", _softmax(S)),
            ("you divided only by the query's length |x_i|; divide by the key's length |x_j| too",
             _softmax(S / n)),
            ("you divided only by the key's length |x_j|; divide by the query's length |x_i| too",
             _softmax(S / n.T)),
            ("you divided by the squared lengths (|x|^2 = x . x); the cosine divides by the "
             "lengths themselves, |x_i| |x_j|", _softmax(S / (n * n.T) ** 2)),
            ("you divided by the norm of the whole matrix; use each row's length "
             "(np.linalg.norm(X, axis=1, keepdims=True))", _softmax(S / np.linalg.norm(X) ** 2)),
            ("you took the norms of the columns (axis=0); each token is a row, so use axis=1",
             _softmax((X / np.linalg.norm(X, axis=0)) @ (X / np.linalg.norm(X, axis=0)).T)),
            ("softmax over the wrong axis: each query's row must sum to 1 (axis=-1)",
             _softmax(cos, axis=0)),
            ("notebook 01 does not scale: no division by sqrt(d)", _softmax(cos / math.sqrt(
                X.shape[1]))),
        ])
        raise _Wrong(f"the weights differ from softmax(cos) by up to {_maxdiff(got, ref)}")
    if predicted_sharper_rows is None:
        raise _NotAttempted("the function is right; now type predicted_sharper_rows, your "
                            "prediction of which of 'journey' and 'one' get sharper")
    tokens, span_dot, span_cos = _sharper_rows()
    guess = _token_set(predicted_sharper_rows, tokens, "predicted_sharper_rows")
    if guess - set(_ASKED_ROWS):
        raise _Wrong(f"only the rows {_names(set(_ASKED_ROWS))} are asked; "
                     f"predicted_sharper_rows contains {_names(guess - set(_ASKED_ROWS))}")
    asked = [(t, a, b) for t, a, b in zip(tokens, span_dot, span_cos, strict=True)
             if t in _ASKED_ROWS]
    truth = {t for t, a, b in asked if b > a}
    if guess != truth:
        # The prediction is committed before the measurement, so a second miss is shown it.
        # With two rows (four possible answers) a count would hand the answer over, so the first
        # miss gets the question to think through; the why is left to the learner.
        if _miss("1.3 prediction") == 0:
            raise _Wrong("not yet. A row's largest / smallest weight is e^(largest score - "
                         "smallest score). In each of the two rows, which keys give the largest "
                         "and the smallest dot-product score, how long are they (section 3 "
                         "printed the lengths), and what happens to each score when it is "
                         "divided by both lengths? The next run of this cell shows the "
                         "measurement")
        measured = "; ".join(f"{t} {math.exp(a):.2f} -> {math.exp(b):.2f} "
                             f"({'sharper' if b > a else 'flatter'})" for t, a, b in asked)
        raise _Wrong(f"measured largest / smallest weight, dot product -> cosine: {measured}. "
                     "Before you retype your prediction, explain each row: what happens to its "
                     "largest and to its smallest score when every score is divided by both "
                     "lengths?")
    return ("cos(x_i, x_i) = 1 is the largest possible cosine, so every query now attends most "
            "to itself. 'journey' gets flatter: its top keys are long and its bottom key short, so "
            "dropping the lengths narrows its gap; 'one' gets sharper: its own score, which lost "
            "to longer keys, rises to the maximum 1.")


# --------------------------------------------------------------------------------------------
# 1.4 Design embeddings: from weights back to scores
# --------------------------------------------------------------------------------------------
_MIN_LENGTH = 0.5  # rules out x2 = 0, which scores 0 with every key for free
_RATIO_RTOL = 1e-6  # "exactly e": typed decimals such as 0.333 for 1/3 do not pass


@_checker
def check_design_embeddings(X):
    """Exercise 1.4: an ``X`` of shape ``(3, 2)`` such that in ``softmax(X X^T)`` query 0 gives key
    1 exactly ``e`` times the weight it gives key 2 (so ``x0 . x1 - x0 . x2 = 1``), and query 2's
    weights are all 1/3, with ``|x2| >= 0.5`` (so not the zero vector: x2 must score
    ``x2 . x0 = x2 . x1 = x2 . x2``)."""
    if X is None:
        raise _NotAttempted("X is still None: type a (3, 2) array of numbers")
    X = _numbers(X, "X").copy()
    if X.shape != (3, 2):
        raise _Wrong(f"X should have shape (3, 2): three tokens with two numbers each; got "
                     f"{X.shape}")
    if not np.isfinite(X).all():
        raise _Wrong("X contains inf or nan: use ordinary numbers")
    S = X @ X.T
    A = _softmax(S)
    ratio = A[0, 1] / A[0, 2] if A[0, 2] > 0 else math.inf
    if not abs(ratio - math.e) <= _RATIO_RTOL * math.e:
        scores = f"x0·x1 = {S[0, 1]:.4f}, x0·x2 = {S[0, 2]:.4f}"
        if abs(ratio - math.e) <= 1e-3 * math.e:
            raise _Wrong(f"nearly: query 0 gives key 1 {ratio:.6f} times key 2's weight, not e = "
                         f"{math.e:.6f} ({scores}). Type exact values (fractions, np.sqrt) "
                         "instead of rounded decimals")
        if abs(ratio - 1 / math.e) <= 1e-3 / math.e:
            raise _Wrong(f"the other way round: key 2 gets e times key 1's weight ({scores})")
        if S[0, 2] != 0 and abs(S[0, 1] / S[0, 2] - math.e) <= 1e-3 * math.e:
            raise _Wrong(f"your scores are in the ratio e ({scores}), but the weights are in the "
                         f"ratio {ratio:.4f}: what does the softmax turn into a ratio of weights?")
        if abs(S[0, 1] - S[0, 2] - math.e) <= 1e-3:
            raise _Wrong(f"your scores differ by e ({scores}), so the weights are in the ratio "
                         f"e^e = {ratio:.4f}: by how much must two scores differ for their weights "
                         "to be in the ratio e?")
        raise _Wrong(f"query 0 gives key 1 {ratio:.4f} times the weight of key 2, not e "
                     f"({scores}): how does a ratio of two weights in one row depend on the "
                     "scores?")
    length = float(np.linalg.norm(X[2]))
    if length < _MIN_LENGTH:
        raise _Wrong(f"x2 has length {length:.4f}; it must be at least {_MIN_LENGTH} (the zero "
                     "vector would score 0 with every key for free). Find an x2 whose scores "
                     "with x0 and x1 both equal its own score x2·x2")
    if not np.allclose(A[2], 1 / 3, atol=1e-6):
        scores = (f"x2·x0 = {S[2, 0]:.4f}, x2·x1 = {S[2, 1]:.4f}, x2·x2 = {S[2, 2]:.4f}")
        if np.allclose(A[2], 1 / 3, atol=1e-3):
            raise _Wrong(f"nearly: query 2's weights are within 0.001 of 1/3, but not equal "
                         f"({scores}). Type exact values (fractions such as 1/3, or np.sqrt) "
                         "instead of rounded decimals")
        cross = X[0, 0] * X[1, 1] - X[0, 1] * X[1, 0]  # 0 when x0 and x1 are parallel
        if abs(cross) < 1e-9 * max(1.0, float(np.abs(X).max())) ** 2:
            raise _Wrong(f"x0 and x1 lie on one line through the origin, so x2·x0 = x2·x1 forces "
                         f"x2·x0 = 0 (x2 perpendicular to both), and then x2·x2 > 0 cannot match: "
                         f"no x2 of length >= {_MIN_LENGTH} works. Tilt x1 away from x0's "
                         f"direction ({scores})")
        raise _Wrong(f"query 2's weights are {np.round(A[2], 4).tolist()}, not 1/3 each: softmax "
                     f"gives equal weights only to equal scores, and yours are {scores}: all three "
                     "must be equal, x2's score with itself included")
    return ("a score difference of 1 is a weight ratio of e, and x2 scores the same with every "
            "key, itself included, so its weights are uniform.")


# --------------------------------------------------------------------------------------------
# 1.5 Find the bug (one that no linter flags): softmax without keepdims
# --------------------------------------------------------------------------------------------
def _bug_cases():
    rng = _rng(105)
    big = rng.normal(size=(4, 3))
    big /= np.linalg.norm(big, axis=1, keepdims=True)
    big *= np.array([[29.0], [0.1], [1.0], [3.0]])  # scores up to 841; row 1 all below 3
    # T != d in every case, so weights (T, T) can never pass for context vectors (T, d)
    return [rng.uniform(-1, 1, (6, 3)), rng.normal(size=(4, 5)), rng.uniform(0, 1, (5, 2)),
            big]


def _keepdims_variants(S: np.ndarray):
    """The weights with the shift and/or the division missing keepdims (row maxima and sums
    broadcast along the columns: column j gets row j's maximum or sum)."""
    m_row, m_col = S.max(axis=-1, keepdims=True), S.max(axis=-1)[None, :]
    with np.errstate(all="ignore"):
        e_ok, e_bad = np.exp(S - m_row), np.exp(S - m_col)
        both = e_bad / e_bad.sum(axis=-1)[None, :]
        shift_only = e_ok / e_ok.sum(axis=-1)[None, :]  # the shift fixed, the division not
        division_only = e_bad / e_bad.sum(axis=-1, keepdims=True)  # the division fixed only
    return both, shift_only, division_only


def _six_token_symptoms() -> dict:
    """What the keepdims variants do to the notebook's six tokens, for hints a learner can
    reproduce: their row sums, and (for the variant whose rows do sum to 1) the ratio of the
    weights 'Your' gives 'journey' and itself."""
    from shared.data import load_embeddings

    _, X = load_embeddings()
    S = X @ X.T
    both, shift_only, division_only = _keepdims_variants(S)
    return {"both_sums": np.round(both.sum(axis=-1), 4).tolist(),
            "shift_only_sums": np.round(shift_only.sum(axis=-1), 4).tolist(),
            "ratio": float(division_only[0, 1] / division_only[0, 0]),
            "true_ratio": float(np.exp(S[0, 1] - S[0, 0]))}


_LUCKY_TOL = 1e-4  # "exactly right": typed decimals such as 0.866 for sqrt(3)/2 still pass
_LUCKY_SPREAD = 0.05  # some weight must lie this far from 1/3, so the bug could show


def _check_lucky_x(X_lucky) -> None:
    """The design half of exercise 1.5: an ``X`` ``(3, 2)`` whose weights are not all (nearly)
    1/3 and on which ``buggy_attention``'s weights equal the softmax. That happens exactly when
    every row of ``X X^T`` has the same maximum and the same sum of ``exp(score - max)``."""
    X = _numbers(X_lucky, "X_lucky").copy()
    if X.shape != (3, 2):
        raise _Wrong(f"X_lucky should have shape (3, 2): three tokens with two numbers each; got "
                     f"{X.shape}")
    if not np.isfinite(X).all():
        raise _Wrong("X_lucky contains inf or nan: use ordinary numbers")
    S = X @ X.T
    A = _softmax(S)
    if np.abs(A - 1 / 3).max() < _LUCKY_SPREAD:
        raise _Wrong(f"on your X_lucky every weight is within {_LUCKY_SPREAD} of 1/3 (all rows "
                     "equal, zero or tiny), so the bug has nothing to spoil: choose an X whose "
                     "scores differ within a row")
    buggy = _keepdims_variants(S)[0]
    if np.isfinite(buggy).all() and np.abs(buggy - A).max() <= _LUCKY_TOL:
        return
    m = S.max(axis=-1)
    sums = np.exp(S - m[:, None]).sum(axis=-1)
    if np.ptp(m) > 1e-3:
        raise _Wrong(f"the rows of X_lucky @ X_lucky.T have the maxima "
                     f"{np.round(m, 4).tolist()}: the buggy shift subtracts row j's maximum from "
                     "column j, which cancels in the softmax only if every row has the same "
                     "maximum")
    if np.ptp(sums) > 1e-3:
        raise _Wrong(f"the row maxima agree ({m[0]:.4f}), but the sums of exp(score - max) differ "
                     f"from row to row ({np.round(sums, 4).tolist()}): the buggy division divides "
                     "column j by row j's sum, harmless only if every row has the same sum")
    raise _Wrong(f"nearly: the buggy weights differ from the softmax by "
                 f"{_maxdiff(buggy, A)} on your X_lucky; type exact values (np.sqrt(3) / 2, not "
                 "0.87) so that the row maxima and sums agree exactly")


@_checker
def check_spot_the_bug(fixed_attention, X_lucky=None):
    """Exercise 1.5: the fixed version of ``buggy_attention`` in notebook 01, whose softmax lines
    lack ``keepdims=True``: ``fixed_attention(X)``, X NumPy ``(T, d)`` -> ``softmax(X X^T) @ X``
    ``(T, d)``, X left unchanged. The last hidden X has rows of lengths 29 and 0.1 (scores up to
    841): only a shift by each row's own maximum stays finite there. Then ``X_lucky``: an X
    ``(3, 2)`` with weights not all near 1/3 on which ``buggy_attention`` is exactly right (so
    the learner must know *when* the bug is harmless, not only how to fix it)."""
    name = "fixed_attention"
    six = _six_token_symptoms()
    for X in _bug_cases():
        T, d = X.shape
        S = X @ X.T
        weights = _softmax(S)
        ref = weights @ X  # from the checker's own arrays, before the learner's code runs
        x_in = X.copy()
        got = _numbers(_call(fixed_attention, x_in, name=name, copy=False,
                             on_error=f"on an X of shape {X.shape}"), "the context vectors")
        if not np.array_equal(x_in, X):
            raise _Wrong("your function changed X in place (e.g. X -= ... or X /= ...): compute "
                         "the scores and weights in new arrays and leave X as it was")
        if got.shape == (T, T):
            raise _Wrong(f"you returned a (T, T) = {(T, T)} array, the weights; return the "
                         f"context vectors weights @ X, shape (T, d) = {(T, d)}")
        _shape(got, (T, d), "the context vectors", "(T, d): one context vector per token")
        scale = max(1.0, float(np.abs(ref).max()))
        tol = 1e-4 * scale  # float32 answers are fine (scores up to 841 carry ~1e-4 relative)
        if _close(got, ref, tol):
            continue
        both, shift_only, division_only = _keepdims_variants(S)
        if not np.isfinite(got).all():
            with np.errstate(all="ignore"):
                naive = np.exp(S) / np.exp(S).sum(axis=-1, keepdims=True)
                e_glob = np.exp(S - S.max())
                global_max = e_glob / e_glob.sum(axis=-1, keepdims=True)
            pattern = np.isfinite(got).all(axis=-1)
            if np.array_equal(pattern, np.isfinite(global_max).all(axis=-1)):
                raise _Wrong("nan for the rows of the short vectors when other scores reach "
                             f"{S.max():.0f}: you subtracted the maximum of the whole score "
                             "matrix, so a row whose scores all lie more than ~745 below it "
                             "underflows to 0 / 0. Subtract each row's own maximum, from that "
                             "row only")
            if np.array_equal(pattern, np.isfinite(naive).all(axis=-1)):
                raise _Wrong(f"inf or nan for scores up to {S.max():.0f}: without the shift, "
                             "exp overflows above 709. Keep the shift, and make it subtract each "
                             "row's own maximum from that row")
            raise _Wrong(f"your context vectors contain inf or nan for an X of shape {X.shape} "
                         f"whose scores reach {S.max():.0f}: shift each row of scores by its "
                         "own maximum before exp")
        _row_order_hint(got, ref)
        _diagnose(got, [
            # The three keepdims variants get symptoms, measured on the notebook's own six tokens,
            # never the fix: finding it is the exercise.
            (f"your function still computes what buggy_attention computes: on the notebook's six "
             f"tokens the rows of its weights sum to {six['both_sums']}, not 1. Print the weights "
             "and their row sums, and the shape of every intermediate array", both @ X),
            (f"closer: your shift now cancels in the softmax, but on the notebook's six tokens the "
             f"rows of your weights still sum to {six['shift_only_sums']}, not 1: look again at "
             "the line that should make each row sum to 1", shift_only @ X),
            (f"each row of your weights sums to 1 now, but they are still not the softmax: on the "
             f"notebook's six tokens, 'Your' gives 'journey' {six['ratio']:.4f} times the weight "
             f"it gives itself, not e^(0.9544 - 0.9995) = {six['true_ratio']:.4f}. Only a "
             "constant subtracted from a whole row cancels in the softmax: what does your shift "
             "subtract from each entry?", division_only @ X),
            ("softmax over the wrong axis (or weights.T @ X): each query's weights are a ROW of "
             "the weights and must sum to 1, so normalise along axis=-1",
             _softmax(S, axis=0) @ X),
            ("you divided the scores by their row sum instead of taking the softmax",
             (S / S.sum(axis=-1, keepdims=True)) @ X),
            ("notebook 01 does not scale the scores: no division by sqrt(d)",
             _softmax(S / math.sqrt(d)) @ X),
            ("you combined the inputs with the raw scores; use the softmax weights",
             S @ X),
            ("every row is the same: did you compute one query's context vector and copy it to "
             "every row?", np.broadcast_to(ref[0], ref.shape)),
        ], atol=tol)
        raise _Wrong(f"for an X of shape {X.shape} your context vectors differ from "
                     f"softmax(X @ X.T) @ X by up to {_maxdiff(got, ref)}")
    if X_lucky is None:
        raise _NotAttempted("fixed_attention is right; now design X_lucky, a (3, 2) X on which "
                            "buggy_attention happens to be exactly right")
    _check_lucky_x(X_lucky)
    return ("a (T, T) array minus a (T,) array broadcasts along the rows; keepdims=True keeps "
            "each row's maximum and sum in its own row. The bug hides only when every row has "
            "the same maximum and the same sum.")
