"""Exercise checkers for notebook 02 Self-attention with trainable weights.

As in ``nb01``: references come from the checker's own copies, made before the learner's code
runs; float32 answers are accepted; strings and booleans are not numbers.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import (
    _call,
    _checker,
    _close,
    _grade_option,
    _maxdiff,
    _NotAttempted,
    _rng,
    _shape,
    _softmax,
    _unless_unanswered,
    _Wrong,
)
from .nb01 import _numbers, _scalar

__all__ = [
    "check_attend_to_one",
    "check_score_scale",
    "check_init_variance",
    "check_shift_matrix",
    "check_recover_permutation",
    "check_attention_bug_fix",
]


# --------------------------------------------------------------------------------------------
# Predictions typed inside sections 2, 5 and appendix A (not exercises, so not in __all__: the
# notebook imports them from here): silent while still `...`, graded once the learner types one
# --------------------------------------------------------------------------------------------
@_unless_unanswered
@_checker
def grade_entropy_prediction(pred_half_dk, d_ks, entropies, T=16):
    """Section 2: ``pred_half_dk`` is the predicted smallest head size in the sweep ``d_ks`` at
    which the mean entropy of unscaled weight rows over ``T`` keys falls below half of ln T;
    ``entropies`` holds the measured mean entropies, one per entry of ``d_ks``. Right only when
    it is the measured head size; one step of the sweep off is "close", not a pass."""
    p = _scalar(pred_half_dk, "pred_half_dk")
    grid = [int(d) for d in d_ks]
    if len(entropies) != len(grid):
        raise ValueError(f"expected one entropy per d_k ({len(grid)}); got {len(entropies)}")
    half = math.log(T) / 2
    first = next((n for n, h in enumerate(entropies) if float(h) < half), None)
    if first is None:
        raise ValueError(f"no measured entropy falls below ln {T} / 2 = {half:.2f}")
    if p not in grid:
        raise _Wrong(f"pred_half_dk = {p:g} is not a head size of the sweep: choose one of "
                     f"{', '.join(map(str, grid))}")
    truth, steps = grid[first], grid.index(p) - first
    measured = (f"measured: the mean entropy first falls below ln {T} / 2 = {half:.2f} nats at "
                f"d_k = {truth} ({float(entropies[first]):.2f} nats)")
    said = f"you predicted d_k = {p:g}"
    if steps == 0:
        return f"{said}; {measured} too"
    if abs(steps) == 1:
        raise _Wrong(f"close: {said}, one step of the sweep off; {measured}")
    if steps > 0:
        raise _Wrong(f"{said}; {measured}. The softmax saturates sooner than that: scores "
                     "spread over a few units already give the top key e^(a few) times the "
                     "weight of a typical key")
    raise _Wrong(f"{said}; {measured}. At d_k = {p:g} the scores have standard deviation "
                 f"{math.sqrt(p):.0f}, too close together to pile the weight onto one of {T} keys")


_WEAK_OPTIONS = {"10": 10.0, "1": 1.0, "0.01": 0.01, "1e-05": 1e-5}


@_unless_unanswered
@_checker
def grade_gradient_prediction(pred_weak, measured):
    """Appendix A: ``pred_weak``, the predicted ratio of the unscaled median row of
    dL/dS to the scaled one (10, 1, 0.01 or 1e-5), is right when it is the option nearest (by
    ratio) to ``measured``."""
    p = _scalar(pred_weak, "pred_weak")
    return _grade_option(p, float(measured), _WEAK_OPTIONS,
                         "the unscaled median row / the scaled median row", log=True)


_ROLES = ("query", "key", "value")
_ROLE_ALIASES = {"q": "query", "k": "key", "v": "value"}


def _role(name, what: str) -> str:
    """"W_value", "W_v", "Wv", "value", "values", "V" ... -> "value"; anything else -> _Wrong."""
    if not isinstance(name, str):
        raise _Wrong(f"{what} should name a parameter, e.g. \"W_query\"; got {type(name).__name__}")
    n = name.strip().lower().replace(" ", "_").removeprefix("model.").removeprefix("self.")
    n = n.removesuffix(".grad").removeprefix("w_").removeprefix("w")
    n = _ROLE_ALIASES.get(n, n.removesuffix("s"))
    if n not in _ROLES:
        raise _Wrong(f"{what} = {name!r}: name one of the three parameters, W_query, W_key or "
                     "W_value")
    return n


@_unless_unanswered
@_checker
def grade_no_grad_prediction(pred_no_grad, model):
    """Section 5: ``pred_no_grad``, the parameter(s) of ``model`` (a ``SelfAttentionV1`` right
    after ``loss.backward()``) predicted to keep ``.grad`` None: a name such as ``"W_value"``, or
    a set of names (an empty set for "none of them")."""
    if isinstance(pred_no_grad, str):
        guess = {_role(pred_no_grad, "pred_no_grad")}
    elif isinstance(pred_no_grad, (set, frozenset, list, tuple)):
        guess = {_role(n, "each name in pred_no_grad") for n in pred_no_grad}
    else:
        raise _Wrong(f"pred_no_grad should be a set of names, e.g. {{\"W_query\"}}, or set() for "
                     f"none; got {type(pred_no_grad).__name__}")
    names = {_role(n, "a parameter"): n for n, _ in model.named_parameters()}
    truth = {role for role, n in names.items() if model.get_parameter(n).grad is None}
    said = ", ".join(names[r] for r in _ROLES if r in guess) or "none of them"
    measured = ", ".join(names[r] for r in _ROLES if r in truth) or "none of them"
    if guess != truth:
        raise _Wrong(f"you predicted {said}; measured: .grad is None for {measured}")
    return f"you predicted {said}; measured: .grad is None for {measured} too"


# --------------------------------------------------------------------------------------------
# 2.1 Choose W_q and W_k by hand
# --------------------------------------------------------------------------------------------
_TARGET, _MIN_WEIGHT = "one", 0.5


@_checker
def check_attend_to_one(W_q, W_k=None):
    """Exercise 2.1: ``W_q``, ``W_k`` of shape ``(3, d_k)`` such that, for the six embeddings of
    "Your journey starts with one step", every query of ``softmax(Q K^T / sqrt(d_k))`` gives its
    largest weight, and at least 0.5, to "one"."""
    from shared.data import load_embeddings

    tokens, X = load_embeddings()
    X = np.asarray(X, dtype=np.float64)
    if W_q is None or W_k is None:
        which = "W_q" if W_q is None else "W_k"
        raise _NotAttempted(f"{which} is still None: choose both matrices")
    W_q = _numbers(W_q, "W_q").copy()
    W_k = _numbers(W_k, "W_k").copy()
    d_in = X.shape[1]
    for name, W in (("W_q", W_q), ("W_k", W_k)):
        if W.ndim == 1 and W.shape[0] == d_in:
            raise _Wrong(f"{name} should be 2-D (d_in, d_k); for d_k = 1 write it as a column, "
                         f"shape (3, 1), e.g. np.array([[a], [b], [c]])")
        if W.ndim != 2 or W.shape[0] != d_in:
            flipped = " (that is (d_k, d_in): transpose it)" if W.ndim == 2 and \
                W.shape[1] == d_in else ""
            raise _Wrong(f"{name} should have shape (d_in, d_k) = (3, d_k), so that X @ {name} "
                         f"works on the (6, 3) embeddings; got {W.shape}{flipped}")
        if not np.isfinite(W).all():
            raise _Wrong(f"{name} contains inf or nan")
    if W_q.shape != W_k.shape:
        raise _Wrong(f"W_q {W_q.shape} and W_k {W_k.shape} need the same number of columns d_k: "
                     "a query and a key are compared with a dot product")
    d_k = W_q.shape[1]
    S = (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k)
    A = _softmax(S)
    target = tokens.index(_TARGET)
    for i, token in enumerate(tokens):
        best = int(np.argmax(A[i]))
        if best != target:
            raise _Wrong(f"query {token!r} attends most to {tokens[best]!r} ({A[i, best]:.4f}), "
                         f"not to {_TARGET!r} ({A[i, target]:.4f}): the keys must single out "
                         f"{_TARGET!r} (which coordinate is largest for it alone?), and every "
                         "query must ask for that direction")
    weakest = int(np.argmin(A[:, target]))
    if A[weakest, target] < _MIN_WEIGHT:
        raise _Wrong(f"every query's top key is {_TARGET!r}, but query {tokens[weakest]!r} gives "
                     f"it only {A[weakest, target]:.4f} (at least {_MIN_WEIGHT} needed): larger "
                     "scores make a sharper softmax, so scale W_q or W_k up")
    return (f"every token now gives at least {A[:, target].min():.4f} of its attention to "
            f"{_TARGET!r}: W_k measures what makes it special, W_q asks every token for it.")


# --------------------------------------------------------------------------------------------
# 2.2 The scale for non-unit variances
# --------------------------------------------------------------------------------------------
_SCALE_CASES = ((64, 1.0, 1.0), (16, 2.0, 3.0), (10, 0.5, 0.2), (1, 3.0, 1.0), (256, 0.1, 0.1),
                (9, 2.0, 0.5))


def _scale_reference(d_k, s_q, s_k):
    return math.sqrt(d_k) * s_q * s_k


# (hint, the wrong divisor): each differs from every other on at least one of _SCALE_CASES
_SCALE_MISTAKES = (
    ("you returned sqrt(d_k) as in section 2, which assumed standard deviations of 1: "
     "Var(q_i k_i) = sigma_q^2 sigma_k^2", lambda d_k, s_q, s_k: math.sqrt(d_k)),
    ("you used the variances sigma_q^2 and sigma_k^2; the divisor is a standard deviation",
     lambda d_k, s_q, s_k: math.sqrt(d_k) * s_q ** 2 * s_k ** 2),
    ("that is the variance of q . k itself; the divisor is a standard deviation",
     lambda d_k, s_q, s_k: d_k * s_q ** 2 * s_k ** 2),
    ("d_k needs a square root: the variance of a sum of d_k independent terms grows like d_k, "
     "its standard deviation like sqrt(d_k)", lambda d_k, s_q, s_k: d_k * s_q * s_k),
    ("sigma_q and sigma_k went under the square root too; they are standard deviations already",
     lambda d_k, s_q, s_k: math.sqrt(d_k * s_q * s_k)),
    ("that is the factor to MULTIPLY by; return the number to divide by",
     lambda d_k, s_q, s_k: 1.0 / _scale_reference(d_k, s_q, s_k)),
    ("the standard deviations multiply (Var(q_i k_i) = sigma_q^2 sigma_k^2 for independent, "
     "zero-mean factors); they do not add", lambda d_k, s_q, s_k: math.sqrt(d_k) * (s_q + s_k)),
)


@_checker
def check_score_scale(score_scale):
    """Exercise 2.2: ``score_scale(d_k, sigma_q, sigma_k)`` -> the divisor that gives ``q . k``
    variance 1 when the entries of q and k are independent, mean 0, standard deviations
    ``sigma_q`` and ``sigma_k``: ``sqrt(d_k) * sigma_q * sigma_k``."""
    gots = [(_scalar(_call(score_scale, *case, name="score_scale"), "the scale"), case)
            for case in _SCALE_CASES]
    wrong = [(got, case) for got, case in gots
             if not math.isclose(got, _scale_reference(*case), rel_tol=1e-5)]
    if not wrong:
        return ("divide by sqrt(d_k) * sigma_q * sigma_k; with unit variances that is the "
                "familiar sqrt(d_k).")
    got, (d_k, s_q, s_k) = wrong[0]
    where = f"for d_k = {d_k}, sigma_q = {s_q}, sigma_k = {s_k}"
    for hint, mistake in _SCALE_MISTAKES:  # named only if it explains every hidden case
        if all(math.isclose(g, mistake(*case), rel_tol=1e-5) for g, case in gots):
            raise _Wrong(f"{where}: {hint}")
    ref = _scale_reference(d_k, s_q, s_k)
    leaves = f"a variance of {(ref / got) ** 2:.4f}" if got != 0 else "an infinite variance"
    raise _Wrong(f"{where} you returned {got:.4f}: dividing q . k by it leaves {leaves}, not 1. "
                 "What is Var(q_i k_i), and how do d_k such terms add up?")


# --------------------------------------------------------------------------------------------
# 2.2, second part: predict the variance of a fresh nn.Linear head's scaled scores, then measure
# --------------------------------------------------------------------------------------------
_INIT_VARIANCE = 1.0 / 9.0  # Var(W) = 1/(3 d_in) -> Var(q_i) = 1/3 -> Var(q . k / sqrt(d_k)) = 1/9
_PREDICTION_TOL = 1e-3
# (d_in, d_k, T): large enough that one fresh head measures 1/9 to within 2-3.5% (one standard
# deviation; the worst of 100 seeds was 10% off), every d_k different so that each wrong scale
# gives a different number
_INIT_CASES = ((256, 64, 256), (512, 16, 256), (128, 32, 512))
_MEASURE_TOL = 0.25  # relative: over 7 standard deviations; the nearest mistake (1/3) is 3x away


def _prediction_hint(p: float) -> str | None:
    """The mistake behind a predicted variance, if it is a typical one."""
    for value, hint in (
        (1.0, "1 would need every entry of q and k to have variance 1 (section 2's assumption); "
              "nn.Linear's weights are uniform on [-1/sqrt(d_in), 1/sqrt(d_in)], so first work "
              "out Var(q_i) = d_in * Var(W)"),
        (1.0 / 3.0, "1/3 is Var(q_i), the variance of one entry of a query (or of a key), but a "
                    "score term is a product of a q entry and a k entry: what is the variance of "
                    "a product of two independent, mean-0 numbers?"),
        (1.0 / 144.0, "a uniform distribution on [-a, a] has variance (2a)^2/12 = a^2/3 (its "
                      "width is 2a, not a)"),
        (1.0 / 81.0, "you squared once too often: Var(q_i) is already a variance (a sum of d_in "
                     "variances), and the variance of a product of two independent zero-mean "
                     "factors is the product of their variances, not of their squares"),
        (1.0 / 3.0 ** 0.5, "that is a standard deviation; the question asks for a variance"),
    ):
        if math.isclose(p, value, rel_tol=1e-3):
            return hint
    return None


@_checker
def check_init_variance(predicted_variance, score_variance=None):
    """Exercise 2.2, second part: ``predicted_variance``, the variance of ``Q K^T / sqrt(d_k)``
    for freshly initialised ``nn.Linear(d_in, d_k, bias=False)`` query and key layers on inputs
    with independent standard-normal entries (1/9, derived by hand), and
    ``score_variance(d_in, d_k, T)`` -> that variance, measured (a float) on T random tokens."""
    import torch

    if predicted_variance is None:
        raise _NotAttempted("predicted_variance is still None: derive the number first")
    p = _scalar(predicted_variance, "predicted_variance")
    if abs(p - _INIT_VARIANCE) > _PREDICTION_TOL:
        hint = _prediction_hint(p)
        if hint is None and abs(p - _INIT_VARIANCE) < 0.02:
            hint = ("close, but a derivation gives an exact value (a fraction is fine): "
                    "Var(W) -> Var(q_i) -> Var(q_i k_i) -> the sum over d_k -> the scale")
        raise _Wrong(f"predicted_variance = {p:.4f}: " + (hint or (
            "derive it in steps: the variance of one weight of nn.Linear (uniform on "
            "[-1/sqrt(d_in), 1/sqrt(d_in)]), then Var(q_i), then Var(q_i k_i), then the sum over "
            "d_k terms divided by d_k")))
    if score_variance is None:
        raise _NotAttempted("your prediction is right; now write score_variance to measure it")
    measured = []
    for seed, (d_in, d_k, T) in enumerate(_INIT_CASES):
        torch.manual_seed(seed)
        got = _scalar(_call(score_variance, d_in, d_k, T, name="score_variance"),
                      "the measured variance")
        measured.append(got)
        where = f"for d_in = {d_in}, d_k = {d_k}, T = {T} you measured {got:.4f}"
        if abs(got / _INIT_VARIANCE - 1.0) <= _MEASURE_TOL:
            continue
        for value, hint in (
            (d_k / 9.0, f"that is about d_k / 9 = {d_k / 9:.4f}: the scores were not divided by "
                        "sqrt(d_k)"),
            (1.0 / (9.0 * d_k), "that is about 1 / (9 d_k): you divided the scores by d_k; divide "
                                "by sqrt(d_k)"),
            (1.0 / 3.0, "that is about 1/3: the standard deviation of the scores (take .var(), "
                        "not .std()), or the variance of Q's entries rather than of Q K^T"),
            (float(d_in) ** 2, f"that is about d_in^2 = {d_in ** 2}: weights of variance 1 "
                               "(torch.randn?); use nn.Linear's own initialisation, variance "
                               "1/(3 d_in)"),
        ):
            if abs(got / value - 1.0) <= _MEASURE_TOL:
                raise _Wrong(f"{where}; {hint}")
        raise _Wrong(f"{where}, far from your prediction 1/9 = {_INIT_VARIANCE:.4f}: build fresh "
                     "nn.Linear(d_in, d_k, bias=False) layers for the queries and keys, X = "
                     "torch.randn(T, d_in), and return the variance of all T * T entries of "
                     "Q @ K.T / sqrt(d_k)")
    if len(set(measured)) == 1:
        raise _Wrong(f"score_variance returned {measured[0]:.4f} for every size: that is not a "
                     "measurement; build the layers and the inputs inside the function")
    return ("1/9, measured for three head sizes: nn.Linear's initialisation gives Var(q_i) = 1/3, "
            "so dividing by sqrt(d_k) alone leaves the scaled scores at variance 1/9, whatever "
            "d_in and d_k.")


# --------------------------------------------------------------------------------------------
# 2.3 A shift of k positions is one matrix
# --------------------------------------------------------------------------------------------
def _shift_reference(k: int, d_model: int, base: float, exponent: float = 2.0,
                     sign: float = 1.0, same_angle: bool = False) -> np.ndarray:
    M = np.zeros((d_model, d_model))
    for i in range(d_model // 2):
        omega = 1.0 if same_angle else base ** (-exponent * i / d_model)
        c, s = math.cos(k * omega), sign * math.sin(k * omega)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
    return M


def _blocked_layout(M: np.ndarray) -> np.ndarray:
    """The same rotation written for a (sin block | cos block) column layout."""
    order = _blocked_order(M.shape[0])
    return M[np.ix_(order, order)]


def _blocked_order(d_model: int) -> np.ndarray:
    """Column order of the figure's layout: the sines (columns 0, 2, 4, ...), then the cosines."""
    return np.r_[np.arange(0, d_model, 2), np.arange(1, d_model, 2)]


# The prediction typed before writing shift_matrix: which statements hold for every k, j, p
# (d_model >= 4)? The verdict and a question that points at the reason without giving it. As in
# 2.4, a first wrong answer gets the count only; the same wrong answer again, one letter.
_SHIFT_STATEMENTS = {
    "a": (True, "what does a move of j positions followed by a move of k positions add up to?"),
    "b": (False, "transpose a 2x2 rotation by the angle b: by which angle does the result turn?"),
    "c": (True, "which matrix undoes a move of k positions, and what is the inverse of a "
                "rotation?"),
    "d": (False, "does k enter M_k as a factor, or inside cos and sin?"),
    "e": (True, "PE_b[p] @ M_k is PE_b[p + k], and pair i of any row is (sin a, cos a): what is "
                "its squared length?"),
    "f": (True, "into how many columns of PE_b[p + k] does one column of PE_b[p] feed?"),
    "g": (False, "which two columns of PE_b hold pair i: are they neighbours?"),
}
_UNSET = object()  # holds left out (older callers): grade the function only


def _grade_shift_prediction(holds) -> None:
    """Raise ``_NotAttempted`` or ``_Wrong`` unless ``holds`` is the set {"a", "c", "e", "f"}."""
    if holds is None:
        raise _NotAttempted("holds is still None: predict which statements hold before you write "
                            "shift_matrix")
    chosen = _letters(holds, "holds", _SHIFT_STATEMENTS)
    misjudged = [s for s in sorted(_SHIFT_STATEMENTS) if (s in chosen) != _SHIFT_STATEMENTS[s][0]]
    if not misjudged:
        return
    key = "2.3:" + "".join(sorted(chosen))
    seen = _MISSES.get(key, 0)
    _MISSES[key] = seen + 1
    verb = "is" if len(misjudged) == 1 else "are"
    head = f"{len(misjudged)} of the {len(_SHIFT_STATEMENTS)} statements in holds {verb} misjudged."
    if seen == 0:  # the first time: the count and a way to decide, no letter
        raise _Wrong(f"{head} Decide each on d_model = 4, where you can write M_k out by hand: "
                     "one pair turning at omega_0 = 1, one at omega_1 = base^(-1/2)")
    raise _Wrong(f"{head} Think ({misjudged[0]}) through again: "
                 f"{_SHIFT_STATEMENTS[misjudged[0]][1]}")


@_checker
def check_shift_matrix(shift_matrix, holds=_UNSET):
    """Exercise 2.3: ``holds``, the set of letters of the statements (a)-(g) of the notebook that
    hold for every k, j and p, predicted first: {"a", "c", "e", "f"} (graded before the function;
    leave it out to grade the function only). ``shift_matrix(k, d_model, base=10000.0)`` ->
    ``(d_model, d_model)`` matrix ``M_k`` with ``PE_b[p + k] = PE_b[p] @ M_k`` for every position
    p, where ``PE_b`` is the encoding in the figure's column layout: the d_model/2 sine columns
    first, then the cosine columns (``sinusoidal_positional_encoding(T, d_model, base)[:, order]``,
    with ``order`` the even columns followed by the odd ones)."""
    from shared.positional import sinusoidal_positional_encoding

    if holds is not _UNSET:
        _grade_shift_prediction(holds)  # before the function: a stub still gets its message

    for k, d_model, base in ((1, 8, 10000.0), (5, 16, 10000.0), (0, 4, 10000.0),
                             (-3, 8, 10000.0), (7, 6, 100.0), (2, 2, 10000.0)):
        interleaved = _shift_reference(k, d_model, base)
        ref = _blocked_layout(interleaved)
        got = _numbers(_call(shift_matrix, k, d_model, base=base, name="shift_matrix"),
                       "the matrix")
        _shape(got, (d_model, d_model), f"for k = {k}, d_model = {d_model} the matrix",
               "(d_model, d_model)")
        pe = sinusoidal_positional_encoding(40, d_model, base=base)[:, _blocked_order(d_model)]
        rows = np.arange(max(0, -k), 40 - max(0, k))
        if _close(pe[rows] @ got, pe[rows + k], atol=1e-6):
            continue
        where = f"for k = {k}, d_model = {d_model}, base = {base:g}"
        if k and _close(got, ref.T):
            raise _Wrong(f"{where}: your matrix moves the encoding k positions BACK (PE[p] @ M = "
                         "PE[p - k]): the sin and cos signs are swapped. Positions are rows, so "
                         "PE[p] @ M: write sin(a + b) = sin a cos b + cos a sin b as a row "
                         "vector times a matrix to fix the signs")
        if d_model > 2 and _close(got, interleaved):
            raise _Wrong(f"{where}: that is the matrix for section 7's interleaved columns (2x2 "
                         "blocks on the diagonal). Here the sines come first: which two columns "
                         "of PE_b hold pair i, and so where must its four entries go?")
        for hint, value in (
            ("every pair of columns turns at its own speed omega_i = base^(-2i / d_model); you "
             "rotated every pair by the same angle k", _shift_reference(k, d_model, base,
                                                                       same_angle=True)),
            ("the exponent is 2i / d_model, where i counts column PAIRS (0, 1, 2, ...)",
             _shift_reference(k, d_model, base, exponent=1.0)),
            ("use the base you are given (the argument `base`), not a fixed 10000",
             _shift_reference(k, d_model, 10000.0) if base != 10000.0 else None),
        ):
            if value is not None and _close(got, _blocked_layout(value)):
                raise _Wrong(f"{where}: {hint}")
        if k == 0 and not _close(got, np.eye(d_model)):
            raise _Wrong("for k = 0 nothing moves: M_0 must be the identity")
        raise _Wrong(f"{where}: PE[p] @ M differs from PE[p + k] by up to "
                     f"{_maxdiff(pe[rows] @ got, pe[rows + k])}; each pair must turn by its own "
                     "k * omega_i, and nothing else may mix")
    if holds is not _UNSET:
        return ("(a), (c), (e) and (f) hold: each pair turns by its own angle, so moves add up, "
                "the transpose moves back and lengths stay; in this layout pair i sits in columns "
                "i and i + d_model/2, so M_k has no 2x2 blocks on its diagonal.")
    return ("one fixed matrix per offset k moves every position p to p + k, in any column layout: "
            "offsets are linear.")


# --------------------------------------------------------------------------------------------
# 2.4 Recover the permutation from the outputs
# --------------------------------------------------------------------------------------------
def _attention_outputs(X: np.ndarray, W: tuple) -> np.ndarray:
    W_q, W_k, W_v = W
    S = (X @ W_q) @ (X @ W_k).T / math.sqrt(W_k.shape[1])
    return _softmax(S) @ (X @ W_v)


# Which changes to the layer (or its input) stop Z_shuffled from being a reordering of Z's rows?
# The verdict, the principle the option turns on, and a question that points at the reason without
# spelling it out. A first wrong answer gets the count and the principles only; the same wrong
# answer again gets one letter and its question (never a verdict: flipping letters until it passes
# teaches nothing). The solutions notebook and the "correct!" message give the reasons.
_PRINCIPLES = {
    "position": "does the change depend on a token's position (the slot it sits in), or does it "
                "travel with the token?",
    "chance": "does the change depend on chance, drawn afresh on every call?",
    "map": "does section 6's argument (one map applied to each token on its own, a softmax row "
           "by row) use anything the change touches?",
    "stack": "what does a further layer receive when a layer's output rows are only reordered?",
}
_CHANGES = {
    "a": (False, "map", "does section 6's argument use any property of W_q, W_k and W_v?"),
    "b": (False, "map", "with a bias, is x W + b still one map applied to each token on its own?"),
    "c": (True, "position", "with a causal mask, does a token see the same set of tokens before "
                            "and after the shuffle?"),
    "d": (True, "chance", "are the weights that dropout zeroes tied to tokens, or drawn afresh on "
                          "every call?"),
    "e": (False, "stack", "what does the second layer receive when the first one gets X[perm]?"),
    "f": (False, "map", "where did section 6's argument use the size of the scale?"),
    "g": (True, "position", "after the shuffle, are two given tokens still the same distance "
                            "i - j apart?"),
    "h": (False, "position", "if the padding mask moves with its tokens, which keys does each "
                             "query see after the shuffle?"),
    "i": (True, "position", "if the mask stays on the last two positions, are the same tokens "
                            "hidden before and after the shuffle?"),
}
_MISSES: dict[str, int] = {}  # wrong breaks_it answers seen so far, by their sorted letters


def _letters(answer, what: str, options=None) -> set[str]:
    """A learner's set (list, tuple, or a string such as "ac") of option letters (of 2.4's
    ``_CHANGES`` unless ``options`` is given)."""
    options = _CHANGES if options is None else options
    if isinstance(answer, str):
        answer = [ch for ch in answer if not (ch.isspace() or ch in ",;")]
    if isinstance(answer, dict) or not isinstance(answer, (set, frozenset, list, tuple)):
        raise _Wrong(f"{what} should be a set of letters such as {{\"a\", \"b\"}} (or set() for "
                     f"none); got {type(answer).__name__}")
    letters = set()
    for a in answer:
        if not (isinstance(a, str) and a.strip().lower() in options):
            raise _Wrong(f"{what} contains {a!r}; the options are the letters "
                         f"{', '.join(sorted(options))}")
        letters.add(a.strip().lower())
    return letters


@_checker
def check_recover_permutation(recover_permutation, breaks_it=None):
    """Exercise 2.4: ``recover_permutation(Z, Z_shuffled)`` -> integer array ``perm`` with
    ``Z_shuffled[i] = Z[perm[i]]`` (up to rounding), where ``Z_shuffled`` are the outputs of a
    self-attention layer for the shuffled tokens ``X[perm]``; ``breaks_it``: the set of letters
    of the changes (options a-i of the notebook) after which that no longer holds,
    {"c", "d", "g", "i"}."""
    rng = _rng(204)
    for T, d in ((6, 4), (9, 3), (5, 5), (1, 2)):
        X = rng.normal(size=(T, d))
        W = tuple(rng.normal(size=(d, 4)) for _ in range(3))
        perm = rng.permutation(T)
        if T == 5:
            perm = np.arange(T)  # the identity is a permutation too
        Z = _attention_outputs(X, W)
        # Different order of summation: equal only up to rounding. Make that explicit.
        Z_shuffled = _attention_outputs(X[perm], W) + 1e-12 * rng.standard_normal((T, 4))
        Z_in, Zs_in = Z.copy(), Z_shuffled.copy()
        raw = _call(recover_permutation, Z_in, Zs_in, name="recover_permutation", copy=False,
                    on_error="rows agree only up to rounding: match each row of Z_shuffled to "
                             "the NEAREST row of Z")
        changed = [n for n, a, b in (("Z", Z_in, Z), ("Z_shuffled", Zs_in, Z_shuffled))
                   if not np.array_equal(a, b)]
        if changed:
            raise _Wrong(f"your function changed {' and '.join(changed)} in place (e.g. "
                         "`Z -= ...`, `Z.sort(...)` or writing into a row): leave the inputs as "
                         "they are and compute into new arrays")
        got = _numbers(raw, "perm")
        if got.size == T and got.ndim != 1:
            got = got.reshape(T)
        _shape(got, (T,), "perm", "(T,): one index per row of Z_shuffled")
        if not np.all(got == np.round(got)):
            raise _Wrong(f"perm should hold whole numbers (row indices); got {got.tolist()}")
        got = got.astype(int)
        if sorted(got.tolist()) != list(range(T)):
            raise _Wrong(f"{got.tolist()} is not a permutation of 0..{T - 1}: each row of "
                         "Z_shuffled matches exactly one row of Z (compare with a tolerance, not "
                         "==)")
        if np.allclose(Z_shuffled, Z[got], atol=1e-9):
            continue
        if np.array_equal(np.argsort(got), perm):
            raise _Wrong("that is the inverse permutation: you returned q with Z[i] = "
                         "Z_shuffled[q[i]]; perm must satisfy Z_shuffled[i] = Z[perm[i]]")
        raise _Wrong(f"Z[perm] differs from Z_shuffled by up to "
                     f"{_maxdiff(Z[got], Z_shuffled)}: row i of Z_shuffled must be row perm[i] "
                     "of Z")
    if breaks_it is None:
        raise _NotAttempted("recover_permutation works; now answer breaks_it: which changes "
                            "would make it fail?")
    chosen = _letters(breaks_it, "breaks_it")
    misjudged = [letter for letter in sorted(_CHANGES) if (letter in chosen) != _CHANGES[letter][0]]
    if misjudged:
        key = "".join(sorted(chosen))
        seen = _MISSES.get(key, 0)
        _MISSES[key] = seen + 1
        verb = "is" if len(misjudged) == 1 else "are"
        head = (f"your function works, but {len(misjudged)} of the {len(_CHANGES)} options {verb} "
                "misjudged.")
        if seen == 0:  # the first time: the principles at stake, no letter
            asks = dict.fromkeys(_PRINCIPLES[_CHANGES[letter][1]] for letter in misjudged)
            raise _Wrong(f"{head} Ask of each option: {' And: '.join(asks)}")
        letter = misjudged[0]  # the same wrong answer again: one letter and its question
        raise _Wrong(f"{head} Think ({letter}) through again: {_CHANGES[letter][2]}")
    return ("each output depends on its own token and the SET of all tokens, so a shuffle only "
            "reorders the rows; only something tied to positions (a causal mask, a bias by "
            "distance, a mask on fixed positions) or to chance (dropout) breaks that.")


# --------------------------------------------------------------------------------------------
# 2.5 Find the bugs in a plausible attention function
# --------------------------------------------------------------------------------------------
def _buggy_reference(X, W_q, W_k, W_v, divisor: float, axis: int = -1) -> np.ndarray:
    """softmax(Q K^T / divisor) V with the softmax over ``axis`` (-1 is right, 0 a bug)."""
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return _softmax(Q @ K.T / divisor, axis=axis) @ V


def _scale_mistakes(T: int, d_in: int, d_k: int, d_v: int) -> list[tuple[str | None, float]]:
    """(hint, divisor) for the right scale (hint None) and each wrong one."""
    return [
        (None, math.sqrt(d_k)),
        (f"you divided the scores by sqrt(d_in) = sqrt({d_in}), the width of the embeddings "
         "X.shape[-1] (d_model in a transformer); a score is the dot product of two "
         f"{d_k}-dimensional vectors, q and k, so divide by sqrt(d_k) = sqrt(K.shape[-1]) = "
         f"sqrt({d_k})", math.sqrt(d_in)),
        (f"you divided the scores by sqrt(d_v) = sqrt({d_v}), the width of the values; the "
         f"scores are dot products of queries and keys: divide by sqrt(d_k) = sqrt({d_k})",
         math.sqrt(d_v)),
        (f"you divided the scores by d_k = {d_k} itself; divide by its square root, "
         f"sqrt(d_k) = {math.sqrt(d_k):.4f}: the standard deviation of q . k, not its variance",
         float(d_k)),
        (f"you divided the scores by d_in = {d_in}; the scale is sqrt(d_k) = sqrt({d_k}), from "
         "the width of q and k", float(d_in)),
        (f"you divided the scores by sqrt(T) = sqrt({T}), the number of tokens (K.shape[0]); "
         f"the scale is sqrt(d_k) = sqrt(K.shape[-1]) = sqrt({d_k})", math.sqrt(T)),
        ("the scores are not scaled at all: divide Q @ K.T by sqrt(d_k)", 1.0),
    ]


_AXIS_HINT = ("softmax over dim=0 normalises each key's column over the queries; each query's "
              "ROW of weights must sum to 1: softmax over the last dim (dim=-1)")


@_checker
def check_attention_bug_fix(attention_fixed):
    """Exercise 2.5: ``attention_fixed(X, W_q, W_k, W_v)`` -> ``Z = softmax(Q K^T / sqrt(d_k)) V``
    of shape ``(T, d_v)``. X: ``(T, d_in)``; W_q, W_k: ``(d_in, d_k)``; W_v: ``(d_in, d_v)``
    (float64 tensors). The inputs must be left unchanged."""
    import torch

    rng = _rng(205)
    # every size differs from the others, so each wrong scale gives different numbers
    for T, d_in, d_k, d_v in ((5, 7, 3, 2), (6, 5, 4, 3), (4, 6, 9, 5), (1, 4, 2, 3)):
        X = rng.normal(size=(T, d_in))
        W_q, W_k, W_v = (rng.normal(size=(d_in, d)) for d in (d_k, d_k, d_v))
        inputs = [torch.tensor(a) for a in (X, W_q, W_k, W_v)]
        shapes = (f"on X of shape {(T, d_in)}, W_q and W_k of shape {(d_in, d_k)} and W_v of "
                  f"shape {(d_in, d_v)}")
        raw = _call(attention_fixed, *inputs, name="attention_fixed", copy=False)
        changed = [name for name, t, a in zip(("X", "W_q", "W_k", "W_v"), inputs,
                                              (X, W_q, W_k, W_v), strict=True)
                   if t.shape != a.shape or not np.array_equal(t.detach().numpy(), a)]
        if changed:
            raise _Wrong(f"your function changed {', '.join(changed)} in place ({shapes}): "
                         "`W_q /= ...` rescales the caller's own matrix, so every call shrinks it "
                         "again and the same inputs give a different answer the next time. "
                         "Compute a new tensor instead (W_q / ..., or divide the scores)")
        got = _numbers(raw, "the output")
        _shape(got, (T, d_v), f"{shapes}, the output", "(T, d_v): one context vector per token")
        if _close(got, _buggy_reference(X, W_q, W_k, W_v, math.sqrt(d_k))):
            continue
        for axis in (-1, 0):
            for hint, divisor in _scale_mistakes(T, d_in, d_k, d_v):
                if not _close(got, _buggy_reference(X, W_q, W_k, W_v, divisor, axis)):
                    continue
                hints = [h for h in (_AXIS_HINT if axis == 0 else None, hint) if h]
                which = "two bugs left: " if len(hints) == 2 else ""
                raise _Wrong(f"{shapes}: {which}" + "; and ".join(hints))
        raise _Wrong(f"{shapes}, the output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                     f"{_maxdiff(got, _buggy_reference(X, W_q, W_k, W_v, math.sqrt(d_k)))}: "
                     "compare your Q, K, V, scores and weights with the formula one at a time")
    return ("three bugs fixed: the input stays untouched, the scale comes from d_k, and each "
            "query's weights sum to 1.")
