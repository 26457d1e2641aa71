"""Exercise checkers for notebook 04 Multi-head attention (PyTorch).

Every reference is computed before the learner's code runs, from inputs the learner never sees
(the learner gets copies), so changing an input in place cannot change what it is judged
against. Answers computed in float32 are accepted (the tolerances are float32's).

* 4.1 ``check_bug_prediction``: the learner first commits to whether the buggy function agrees
  with correct multi-head attention at one head and at three; only then does the checker measure
  it (float64, on hidden inputs) and say which guess was off.
* 4.1 ``check_fixed_multi_head``: fix three silent bugs in a multi-head attention function. Every
  combination the checker can name (each planted bug, every wrong scaling, no mask, softmax over
  the keys' columns) gives a different output on every hidden case, so a hint names exactly the
  mistakes left; an inverted mask is the only one that gives nan, and has its own hint.
* 4.2 ``check_duplicate_token_head``: design ``W_q``, ``W_k`` for a head that attends to the most
  recent earlier occurrence of the current token (else to ``BOS``). Graded hints: the first time a
  kind of mistake shows, the hint names it; when it shows again, a more specific pointer follows.
* 4.3 ``check_attention_parameters``: the parameter count of one attention layer from a
  Hugging-Face-style config (grouped-query attention, an explicit ``head_dim``, biases); on the
  hidden configs every named mistake gives its own set of numbers. ``check_gqa_prediction``
  grades the predicted Llama 3 8B and Gemma 7B counts over 4 d^2 first, then shows the counts.
* 4.4 ``check_padding_changes``: which outputs of self-attention change when a
  ``key_padding_mask`` is added, for right or left padding, with or without a causal mask; every
  named wrong way of reasoning gives its own answers on the hidden batches.

Two predictions inside the sections are graded too (not exercises, not in ``__all__``):
``grade_matmul_prediction`` (section 2, matrix products per forward pass with 12 heads) and
``grade_flop_prediction`` (section 6, what grows from 1 head to 48). The notebook hands each the
measurement; they say "not attempted yet" while the prediction is still ``...``, then grade it
(a hint names the mistake). The notebook prints the counts in the cell after the grader.
"""

from __future__ import annotations

import itertools
import math
import numbers

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _maxdiff,
    _NotAttempted,
    _rng,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_bug_prediction",
    "check_fixed_multi_head",
    "check_duplicate_token_head",
    "check_attention_parameters",
    "check_gqa_prediction",
    "check_padding_changes",
]

# float32 answers to float64 questions: ~1e-7 relative error per operation, a few operations deep
ATOL, RTOL = 1e-5, 1e-4


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=ATOL, rtol=RTOL))


def _whole_number(ans, what: str) -> int:
    """A learner's count as an int: ints, whole floats, NumPy scalars and 0-d tensors are fine;
    text (even text that reads as a number), booleans and containers are not."""
    if isinstance(ans, torch.Tensor) and ans.numel() == 1:
        ans = ans.item()
    if isinstance(ans, np.generic):
        ans = ans.item()
    if isinstance(ans, str):
        raise _Wrong(f"you returned the text {ans!r}: return the number itself (an int), not a "
                     "string")
    if isinstance(ans, bool) or not isinstance(ans, numbers.Real):
        raise _Wrong(f"return {what} as a whole number (an int); got {type(ans).__name__}")
    if not math.isfinite(ans) or ans != int(ans):
        raise _Wrong(f"return {what} as a whole number; got {ans}")
    return int(ans)


# --------------------------------------------------------------------------------------------
# Predictions typed inside sections 2 and 6 (not exercises, so not in __all__: the notebook
# imports them from this module): "not attempted yet" while still `...`, graded once typed
# --------------------------------------------------------------------------------------------
def _typed(prediction: dict, keys: tuple, name: str, what: str):
    """The learner's dict of predictions; ``_NotAttempted`` while any entry is still ``...``
    (or the whole dict is), ``_Wrong`` for another shape."""
    if prediction is ... or prediction is None:
        raise _NotAttempted(f"type {what} into {name} to have them graded")
    if not isinstance(prediction, dict) or set(prediction) != set(keys):
        raise _Wrong(f"{name} must be a dict with the keys {', '.join(map(repr, keys))}; got "
                     f"{prediction!r}")
    missing = [k for k in keys if prediction[k] is ... or prediction[k] is None]
    if len(missing) == len(keys):
        raise _NotAttempted(f"type {what} into {name} to have them graded")
    if missing:
        raise _NotAttempted(f"type a prediction for {', '.join(map(repr, missing))} in {name} too")
    return prediction


_CALL_KEYS = ("wrapper", "MultiHeadAttention")


def _calls(count) -> int:
    """One version's number of matrix products: an int, or a dict of counts by operator name."""
    return int(sum(count.values())) if isinstance(count, dict) else int(count)


@_checker
def grade_matmul_prediction(pred_calls, counted):
    """Section 2: ``pred_calls``, ``{"wrapper": n, "MultiHeadAttention": m}``, the predicted
    numbers of matrix products (``mm``, ``addmm``, ``bmm``) in one forward pass with 12 heads;
    ``counted``, ``{H: {"wrapper": calls, "MultiHeadAttention": calls}}`` as the profiler counted
    them (``calls`` an int or a dict of counts by operator), with 12 among the ``H``. Only grades:
    the notebook prints the counts in the next cell."""
    _typed(pred_calls, _CALL_KEYS, "pred_calls", "two whole numbers")
    guess = {k: _whole_number(pred_calls[k], f"pred_calls[{k!r}]") for k in _CALL_KEYS}
    totals = {n: {k: _calls(counted[n][k]) for k in _CALL_KEYS} for n in sorted(counted)}
    truth = totals[12]
    said = "you predicted " + ", ".join(f"{k} {guess[k]}" for k in _CALL_KEYS)
    notes = []
    if guess["wrapper"] != truth["wrapper"]:
        g = guess["wrapper"]
        notes.append("the wrapper's loop runs each of the 12 heads in turn: your count is one "
                     "head's" if g * 12 == truth["wrapper"] else
                     "count one head's products again: 5 per head, 3 projections + 2 attention "
                     "products" if g > 0 and g % 12 == 0 else
                     "the wrapper's loop runs every head's own projections and attention "
                     "products, so its count is a multiple of the number of heads")
    if guess["MultiHeadAttention"] != truth["MultiHeadAttention"]:
        m, t = guess["MultiHeadAttention"], truth["MultiHeadAttention"]
        notes.append("MultiHeadAttention runs each product once for all heads together: its "
                     "count does not grow with the heads" if m > t + 1 else
                     "MultiHeadAttention also has an output projection, out_proj, which the "
                     "wrapper lacks" if m == t - 1 else
                     "count MultiHeadAttention's products: three projections, QK^T, weights @ V "
                     "and out_proj")
    if notes:
        raise _Wrong(f"{said}: " + "; ".join(notes) + ". The counts are in the next cell.")
    return f"{said}: both right. The counts are in the next cell."


_FACTOR_KEYS = ("matmul FLOPs", "weights")


def _positive_numbers(answer: dict, keys, name: str, example: str) -> dict[str, float]:
    """``{key: float}`` from the learner's dict ``answer``; a hint naming the entry if one is not a
    finite positive number (a one-element tensor counts as its number)."""
    guess = {}
    for k in keys:
        v = answer[k]
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
            raise _Wrong(f"{name}[{k!r}] must be a positive number (e.g. {example}); got {v!r}")
        guess[k] = float(v)
    return guess


@_checker
def grade_flop_prediction(pred_factor, counted):
    """Section 6: ``pred_factor``, ``{"matmul FLOPs": a, "weights": b}``, the predicted factors
    by which the FLOPs of ``QK^T`` and ``weights @ V`` and the size of the ``(B, H, T, T)``
    weights grow from the fewest heads counted to the most (1 to 48) at the same ``d``;
    ``counted``, ``{H: {"projections": FLOPs, "matmul FLOPs": FLOPs, "weights": numbers}}``. A
    factor within 10 % (by ratio) is right. Only grades: the notebook prints the counts in the
    next cell."""
    _typed(pred_factor, _FACTOR_KEYS, "pred_factor", "two factors")
    guess = _positive_numbers(pred_factor, _FACTOR_KEYS, "pred_factor", "2 for twice as many")
    few, many = min(counted), max(counted)
    truth = {k: float(counted[many][k]) / float(counted[few][k]) for k in _FACTOR_KEYS}
    said = "you predicted " + ", ".join(f"{k} x{guess[k]:g}" for k in _FACTOR_KEYS)
    off = [k for k in _FACTOR_KEYS if abs(math.log(guess[k] / truth[k])) > math.log(1.1)]
    if not off:
        return f"{said}: both right. The counts are in the next cell."
    notes = {
        "matmul FLOPs": "48 heads each work on d_head = d / 48 features: per head QK^T costs "
                        "2 T^2 d_head and weights @ V another 2 T^2 d_head, 4 T^2 d_head in all, "
                        "and H d_head = d whatever H",
        "weights": "every head has its own (T, T) weights: the tensor holds B * H * T * T numbers",
    }
    raise _Wrong(f"{said}: " + "; ".join(notes[k] for k in off)
                 + ". The counts are in the next cell.")


# --------------------------------------------------------------------------------------------
# 4.1 Find the bugs in a multi-head attention function
# --------------------------------------------------------------------------------------------
# What each way of computing a piece means, and the hint for each wrong way. The planted bugs are
# V_SPLIT "view", SCALE "H*d_k" and MERGE "mean" (per-head W_o blocks, averaged over heads).
_V_SPLIT = {
    "transpose": None,
    "view": "V is still cut into heads with .view(B, H, T, d_v): that hands each head a slab of "
            "consecutive numbers from different tokens; view it as (B, T, H, d_v) and "
            ".transpose(1, 2), like Q and K",
}
_SCALE = {
    "sqrt(d_k)": None,
    "sqrt(H*d_k)": "the scores are divided by sqrt(W_q.shape[1]) = sqrt(num_heads * d_k), the "
                   "width of all heads together: each head's score is a dot product of d_k "
                   "numbers, so divide by sqrt(d_k)",
    "sqrt(d_in)": "the scores are divided by sqrt(d_in), the width of X: divide by sqrt(d_k), "
                  "the size of one head's query and key",
    "sqrt(d_v)": "the scores are divided by sqrt(d_v), the size of one head's value: divide by "
                 "sqrt(d_k), the size of one head's query and key",
    "d_k": "the scores are divided by d_k without the square root: divide by sqrt(d_k)",
    "1": "the scores are not scaled at all: divide them by sqrt(d_k)",
}
_MASK = {
    "causal": None,
    "none": "the causal mask is gone: every query must see only itself and earlier tokens",
}
# An inverted mask (masked_fill with may_attend instead of ~may_attend) leaves the last query no
# key at all: nan. No other variant gives nan, so a nan output gets this hint of its own.
_NAN_HINT = ("your output has nan{where}: a query whose every key is masked gets -inf scores only. "
             "masked_fill writes -inf where its mask is True, so give it the blocked positions "
             "(~may_attend); with may_attend itself each query sees only the future and the last "
             "one sees nothing")
_SOFTMAX = {
    -1: None,
    -2: "softmax over the wrong dim: each query's weights over the keys (a row, dim=-1) must sum "
        "to 1, not each key's column (dim=-2)",
}
_MERGE = {
    "transpose": None,
    "reshape": "the heads are merged with context.reshape(B, T, -1) straight from "
               "(B, H, T, d_v), which interleaves tokens and heads: .transpose(1, 2) back to "
               "(B, T, H, d_v) first, then reshape",
    "mean": "each head's block of W_o is applied and the heads' terms are then averaged over the "
            "head axis: the output comes out exactly num_heads times too small. concat @ W_o is "
            "the SUM of one term per head (section 4), not their mean",
}
_VARIANTS = list(itertools.product(_V_SPLIT, _SCALE, _MASK, _SOFTMAX, _MERGE))
_RIGHT = ("transpose", "sqrt(d_k)", "causal", -1, "transpose")
_PLANTED = ("view", "sqrt(H*d_k)", "causal", -1, "mean")
# softmax over columns without the mask is what the learner would get by also deleting the mask
# line; every (v_split, scale, mask, dim, merge) combination gives a different output

# (B, T, d_in, H, d_k, d_v, d_out): d_k, H * d_k, d_in, d_v all different, so every scaling is
# a different number; T > 2 and several heads, so every split and merge mistake moves values
_MH_CASES = ((2, 5, 7, 3, 4, 2, 6), (1, 6, 5, 2, 3, 4, 4), (3, 4, 6, 4, 2, 3, 5))


def _split(t: np.ndarray, H: int, how: str = "transpose") -> np.ndarray:
    B, T, D = t.shape
    if how == "view":
        return t.reshape(B, H, T, D // H)
    return t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)


def _multi_head_variant(X, W_q, W_k, W_v, W_o, H, v_split, scale, mask, dim, merge):
    """Causal multi-head attention in float64 NumPy, with each piece done one of the ways above."""
    B, T, d_in = X.shape
    d_k, d_v = W_q.shape[1] // H, W_v.shape[1] // H
    Q, K = _split(X @ W_q, H), _split(X @ W_k, H)
    V = _split(X @ W_v, H, v_split)
    div = {"sqrt(d_k)": math.sqrt(d_k), "sqrt(H*d_k)": math.sqrt(H * d_k),
           "sqrt(d_in)": math.sqrt(d_in), "sqrt(d_v)": math.sqrt(d_v), "d_k": d_k,
           "1": 1.0}[scale]
    S = Q @ np.swapaxes(K, -1, -2) / div
    if mask == "causal":
        S = np.where(np.tril(np.ones((T, T), dtype=bool)), S, -np.inf)
    A = _softmax(S, axis=dim)
    ctx = A @ V  # (B, H, T, d_v)
    if merge == "mean":  # head h's term ctx_h @ W_o(h), then the mean over heads
        return (ctx @ W_o.reshape(H, d_v, -1)).mean(axis=1)
    if merge == "reshape":
        merged = ctx.reshape(B, T, H * d_v)
    else:
        merged = ctx.transpose(0, 2, 1, 3).reshape(B, T, H * d_v)
    return merged @ W_o


def _multi_head_case(rng: np.random.Generator, case: tuple):
    B, T, d_in, H, d_k, d_v, d_out = case
    X = rng.normal(size=(B, T, d_in))
    W_q, W_k = rng.normal(size=(d_in, H * d_k)), rng.normal(size=(d_in, H * d_k))
    W_v, W_o = rng.normal(size=(d_in, H * d_v)), rng.normal(size=(H * d_v, d_out))
    return X, W_q, W_k, W_v, W_o


_STEPS = ("how V is cut into heads", "the scaling of the scores", "the mask", "the softmax",
          "how the heads are joined again")


def _multi_head_hint(variant: tuple) -> str:
    """Graded: the first run with a given set of mistakes names only the steps that are wrong (the
    bugs are the learner's to find); running the same code again names each mistake and its fix."""
    tables = (_V_SPLIT, _SCALE, _MASK, _SOFTMAX, _MERGE)
    wrong = [k for k, (table, way) in enumerate(zip(tables, variant, strict=True)) if table[way]]
    planted = sum(v == p != r for v, p, r in zip(variant, _PLANTED, _RIGHT, strict=True))
    lead = (f"{planted} of the 3 planted bugs {'is' if planted == 1 else 'are'} still there; "
            if planted else "")
    kind = "4.1 " + repr(variant)
    seen = _HINTS_GIVEN.get(kind, 0)
    _HINTS_GIVEN[kind] = seen + 1
    if seen == 0:
        return (lead + "look again at " + " and at ".join(_STEPS[k] for k in wrong)
                + " (run the same code again for a more specific hint)")
    return lead + "; ".join(tables[k][variant[k]] for k in wrong)


def _planted_bugs_agree(num_heads: int) -> bool:
    """Does the buggy function of exercise 4.1 agree with correct multi-head attention at
    ``num_heads`` heads, on every hidden case (float64; the difference is 0 or of order 1)?"""
    rng = _rng(411)
    for B, T, d_in, _, d_k, d_v, d_out in _MH_CASES:
        args = _multi_head_case(rng, (B, T, d_in, num_heads, d_k, d_v, d_out))
        planted = _multi_head_variant(*args, num_heads, *_PLANTED)
        if np.abs(planted - _multi_head_variant(*args, num_heads, *_RIGHT)).max() > 1e-6:
            return False
    return True


_PREDICTION_HINTS = {
    1: "with one head there is nothing to cut apart or join together, and all heads together "
       "are as wide as one head: which of the bugs can still change a number?",
    3: "with three heads, every step that cuts the heads apart, scales their scores or joins "
       "them again has a way to go wrong that one head cannot show",
}


@_checker
def check_bug_prediction(my_prediction):
    """``my_prediction``: ``{1: bool, 3: bool}``, whether ``buggy_multi_head_attention`` agrees
    with correct causal multi-head attention at ``num_heads`` = 1 and 3. The checker measures this
    itself against a float64 reference, on hidden inputs, once both guesses are filled in."""
    if not isinstance(my_prediction, dict) or set(my_prediction) != {1, 3}:
        raise _Wrong("my_prediction must be a dict with the keys 1 and 3 (the numbers of heads), "
                     f"e.g. {{1: True, 3: True}}; got {my_prediction!r}")
    if any(v is None for v in my_prediction.values()):
        raise _NotAttempted("write True or False for num_heads = 1 and 3 in my_prediction; the "
                            "measurement is shown once both are filled in")
    for heads, guess in my_prediction.items():
        if not isinstance(guess, (bool, np.bool_)):
            raise _Wrong(f"write True or False for num_heads = {heads}; got {guess!r}")
    measured = {heads: _planted_bugs_agree(heads) for heads in (1, 3)}
    shown = ", ".join(f"num_heads = {h} {'agrees' if measured[h] else 'differs'}"
                      for h in (1, 3))
    off = [h for h in (1, 3) if bool(my_prediction[h]) != measured[h]]
    if off:
        raise _Wrong(f"measured: {shown}; your guess for num_heads = "
                     f"{' and '.join(map(str, off))} {'was' if len(off) == 1 else 'were'} off: "
                     + "; ".join(_PREDICTION_HINTS[h] for h in off))
    return (f"measured: {shown}. A multi-head function must be tested with several heads "
            "(and T > 1): with one head all three bugs vanish.")


@_checker
def check_fixed_multi_head(mha_fixed):
    """``mha_fixed(X, W_q, W_k, W_v, W_o, num_heads)`` -> ``(B, T, d_out)``: causal
    multi-head attention with X ``(B, T, d_in)``, W_q and W_k ``(d_in, H * d_k)``, W_v
    ``(d_in, H * d_v)``, W_o ``(H * d_v, d_out)``; head h owns columns ``h*d_k:(h+1)*d_k``."""
    rng = _rng(401)
    for case in _MH_CASES:
        B, T, d_in, H, d_k, d_v, d_out = case
        args = _multi_head_case(rng, case)
        ref = _multi_head_variant(*args, H, *_RIGHT)
        where = (f"X {(B, T, d_in)}, num_heads = {H}, d_k = {d_k}, d_v = {d_v}, "
                 f"W_o {(H * d_v, d_out)}")
        mine = [_t(a.copy()) for a in args]  # tensors handed over as they are, then inspected
        ans = _call(mha_fixed, *mine, H, name="mha_fixed", copy=False,
                    on_error=f"on {where}")
        if any(not np.array_equal(m.numpy(), a) for m, a in zip(mine, args, strict=True)):
            changed = [n for n, m, a in zip(("X", "W_q", "W_k", "W_v", "W_o"), mine, args,
                                            strict=True) if not np.array_equal(m.numpy(), a)]
            raise _Wrong(f"your function changed {', '.join(changed)} in place (on {where}): "
                         "compute new tensors instead of writing into the inputs")
        if isinstance(ans, (tuple, list)):
            raise _Wrong("return only the output tensor (B, T, d_out), not a tuple or list")
        got = _arr(ans, "the output")
        if got.shape != (B, T, d_out):
            raise _Wrong(f"the output has shape {got.shape}; expected (B, T, d_out) = "
                         f"{(B, T, d_out)} (on {where})")
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            b, t = (int(k) for k in np.argwhere(np.isnan(got))[0][:2])
            raise _Wrong(_NAN_HINT.format(where=f" (batch {b}, token {t}, on {where})"))
        for variant in _VARIANTS:
            if variant != _RIGHT and _close(got, _multi_head_variant(*args, H, *variant)):
                raise _Wrong(_multi_head_hint(variant))
        raise _Wrong(f"the output differs from causal multi-head attention by up to "
                     f"{_maxdiff(got, ref)} (on {where}), and not in a way the checker "
                     "recognises: compare each step's shape with the comments")
    return ("three silent bugs fixed: V's split, the scaling by sqrt(d_k), and the heads' terms "
            "summed, not averaged.")


# --------------------------------------------------------------------------------------------
# 4.2 Design a duplicate-token head
# --------------------------------------------------------------------------------------------
def duplicate_token_inputs(tokens, vocab_size: int) -> np.ndarray:
    """``(T, vocab_size + T)``: row i is ``[onehot(tokens[i]) | onehot(i)]``."""
    tokens = np.asarray(tokens)
    T = len(tokens)
    return np.concatenate([np.eye(vocab_size)[tokens], np.eye(T)], axis=1)


def duplicate_token_target(tokens) -> np.ndarray:
    """For each query i, the key it should attend to: the latest j < i with the same token, else
    0 (BOS); query 0 can only attend to itself (0)."""
    target = np.zeros(len(tokens), dtype=int)
    for i in range(1, len(tokens)):
        earlier = [j for j in range(1, i) if tokens[j] == tokens[i]]
        target[i] = earlier[-1] if earlier else 0
    return target


def _duplicate_sequences(rng: np.random.Generator, V: int, T: int) -> list[list[int]]:
    """Sequences starting with BOS (0): one with a token three times (the most recent must win)
    and a repeat far back behind recent other tokens; then random ones with repeats."""
    words = list(range(1, V))
    a, b, c = words[0], words[1], words[-1]
    first = [0, a, b, a, c, a] + [words[(k % (V - 1))] for k in range(T - 6)]
    far = [0, c] + [w for w in words if w != c][: T - 3] + [c]
    far += [words[k % (V - 1)] for k in range(T - len(far))]
    seqs = [first[:T], far[:T]]
    seqs += [[0, *rng.integers(1, V, size=T - 1).tolist()] for _ in range(4)]
    return seqs


_DUP_CASES = ((5, 10), (4, 12), (7, 9))  # (vocab_size, T): BOS is token 0

# Graded hints: the first time a kind of mistake shows, the hint names it; if the same kind shows
# again in a later run, the hint adds a more specific pointer (never the weights themselves).
_HINTS_GIVEN: dict[str, int] = {}


def _graded(kind: str, first: str, more: str) -> str:
    seen = _HINTS_GIVEN.get(kind, 0)
    _HINTS_GIVEN[kind] = seen + 1
    if seen == 0:
        return first + " (the same mistake again gets a more specific hint)"
    return f"{first}; more specifically: {more}"


@_checker
def check_duplicate_token_head(duplicate_token_head):
    """``duplicate_token_head(vocab_size, T)`` -> ``(W_q, W_k)``, each ``(vocab_size + T, d_k)``.
    On inputs ``[onehot(token) | onehot(position)]`` with ``BOS`` = token 0 at position 0, causal
    scaled attention must put at least 0.9 of query i's weight on the latest earlier position with
    the same token, or on position 0 when there is none."""
    rng = _rng(402)
    for V, T in _DUP_CASES:
        ans = _call(duplicate_token_head, V, T, name="duplicate_token_head",
                    on_error=f"on vocab_size = {V}, T = {T}")
        if not isinstance(ans, (tuple, list)) or len(ans) != 2:
            raise _Wrong(f"return the pair (W_q, W_k); got {type(ans).__name__}")
        W_q, W_k = (_arr(w, name) for w, name in zip(ans, ("W_q", "W_k"), strict=True))
        d_x = V + T
        for name, W in (("W_q", W_q), ("W_k", W_k)):
            if W.ndim != 2 or W.shape[0] != d_x:
                flip = (" (it looks transposed)" if W.ndim == 2 and W.shape[1] == d_x else "")
                raise _Wrong(f"{name} has shape {W.shape}; expected (vocab_size + T, d_k) = "
                             f"({d_x}, d_k) for vocab_size = {V}, T = {T}{flip}")
        if W_q.shape[1] != W_k.shape[1]:
            raise _Wrong(f"W_q {W_q.shape} and W_k {W_k.shape} need the same number of columns "
                         "d_k: a score is a dot product of a query and a key")
        if not (np.isfinite(W_q).all() and np.isfinite(W_k).all()):
            raise _Wrong("W_q or W_k holds inf or nan: use large finite numbers (50, 100), "
                         "not inf")
        d_k = W_q.shape[1]
        for tokens in _duplicate_sequences(rng, V, T):
            X = duplicate_token_inputs(tokens, V)
            S = (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k)
            if not np.isfinite(S).all():
                raise _Wrong(f"on tokens {tokens} (vocab_size = {V}) some scores overflow to inf "
                             "or nan: scores of a few hundred are already decisive; use smaller "
                             "numbers")
            A = _softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), S, -np.inf))
            target = duplicate_token_target(tokens)
            for i in range(1, T):
                t, a = target[i], int(A[i].argmax())
                if A[i, t] >= 0.9:
                    continue
                tok = tokens[i]
                where = (f"on tokens {tokens} (vocab_size = {V}), query {i} (token {tok}) puts "
                         f"{A[i, t]:.2f} on key {t}")
                if a == t:
                    ties = [j for j in range(i + 1) if j != t and abs(S[i, j] - S[i, t]) < 1e-9]
                    if ties and t == 0:
                        raise _Wrong(_graded(
                            "tie-bos", f"{where} (BOS), but key {ties[0]} scores exactly as much, "
                            "so no scaling can separate them: nothing in your scores sets BOS "
                            "apart when no token matches",
                            "BOS needs a score term of its own (a bonus on key 0): a score can be "
                            "a sum of terms, each built from its own columns of W_q and W_k"))
                    if ties:
                        raise _Wrong(_graded(
                            "tie", f"{where}, the right key, but key {ties[0]} scores exactly as "
                            "much, so no scaling can separate them",
                            "some term must differ between those two keys: what do they not "
                            "share? A score can be a sum of terms, each built from its own "
                            "columns of W_q and W_k"))
                    raise _Wrong(_graded(
                        "weak", f"{where}, the right key, but not 0.9: the scores are too close "
                        "together", "make every score larger (scale W_q or W_k up)"))
                if a == i:
                    raise _Wrong(_graded(
                        "self", f"{where} and {A[i, a]:.2f} on itself: its own key always holds "
                        "the same token as the query",
                        "some term must score the key at the query's own position low; the "
                        "one-hot positions can name it, in columns of W_q and W_k of their own"))
                if tokens[a] == tok and a < t:
                    raise _Wrong(_graded(
                        "recency", f"{where} and {A[i, a]:.2f} on key {a}, an older occurrence "
                        f"of token {tok}: among equal tokens the most recent must win",
                        "nothing in your scores prefers a later key; the key's one-hot position "
                        "can add a score that grows with it, in columns of W_q and W_k of their "
                        "own, smaller than the token match"))
                if a == 0 and t != 0:
                    raise _Wrong(_graded(
                        "bos-wins", f"{where} and {A[i, 0]:.2f} on BOS (key 0), though token "
                        f"{tok} appeared at position {t}: a same-token key must score higher "
                        "than BOS",
                        "compare your token-match term with BOS's bonus: the match must be "
                        "the larger"))
                if t == 0:
                    raise _Wrong(_graded(
                        "rest-on-bos", f"{where} (BOS) and {A[i, a]:.2f} on key {a}: token {tok} "
                        "has not appeared before, so the query should rest on BOS",
                        "when no token matches, BOS's key must outscore every other key, "
                        "including what your position terms give the latest one"))
                raise _Wrong(_graded(
                    "other-token", f"{where} and {A[i, a]:.2f} on key {a} (token {tokens[a]}), "
                    f"which is not token {tok}: the same-token score must beat every other term",
                    "compare the size of your token-match term with your largest position or "
                    "BOS term"))
    return "every query finds the latest earlier copy of its token, or BOS: a duplicate-token head."


# --------------------------------------------------------------------------------------------
# 4.3 Count the parameters of an attention layer from its config
# --------------------------------------------------------------------------------------------
_CONFIG_CASES = (
    # GPT-2 small: no grouped-query attention, head_dim from hidden_size, biases
    {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 12,
     "head_dim": None, "attention_bias": True},
    # grouped-query attention, head_dim from hidden_size, no biases
    {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
     "head_dim": None, "attention_bias": False},
    # an explicit head_dim with H * head_dim != hidden_size (as in Gemma), biases
    {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
     "head_dim": 40, "attention_bias": True},
    # multi-query attention (one key/value head), an explicit head_dim, no biases
    {"hidden_size": 60, "num_attention_heads": 6, "num_key_value_heads": 1,
     "head_dim": 14, "attention_bias": False},
)


def _layer_count(d, H, H_kv, hd, bias, *, kv_heads=None, kv_width=None, o_bias=None, with_o=True,
                 n_kv=2, per_head_square=False, o_rows=None):
    """The parameter count, with the knobs the typical mistakes turn."""
    q = H * hd
    kv = kv_width if kv_width is not None else (kv_heads if kv_heads is not None else H_kv) * hd
    if per_head_square:  # every head a full d x d matrix
        return H * (3 * (d * d + (d if bias else 0))) + d * d + (d if bias else 0)
    n = d * q + n_kv * d * kv + ((o_rows if o_rows is not None else q) * d if with_o else 0)
    if bias:
        n += q + n_kv * kv + ((o_bias if o_bias is not None else d) if with_o else 0)
    return n


def _config_mistakes(cfg: dict) -> list[tuple[str, int]]:
    d, H, H_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["head_dim"] if cfg["head_dim"] is not None else d // H
    bias = cfg["attention_bias"]
    return [
        ("keys and values have num_key_value_heads heads, not num_attention_heads: with "
         "grouped-query attention a group of query heads shares one key/value head, so W_k and "
         "W_v are (hidden_size, num_key_value_heads * head_dim)",
         _layer_count(d, H, H_kv, hd, bias, kv_heads=H)),
        ("W_k and W_v have num_key_value_heads * head_dim columns, not hidden_size // "
         "num_key_value_heads", _layer_count(d, H, H_kv, hd, bias, kv_width=d // H_kv)),
        ("W_k and W_v have num_key_value_heads heads of head_dim features each: you counted "
         "num_key_value_heads columns (multiply by head_dim)",
         _layer_count(d, H, H_kv, hd, bias, kv_width=H_kv)),
        ("when the config gives head_dim, use it: hidden_size // num_attention_heads is only the "
         "default for head_dim = None (here num_attention_heads * head_dim != hidden_size)",
         _layer_count(d, H, H_kv, d // H, bias)),
        ("forgot the output projection W_o (num_attention_heads * head_dim, hidden_size), and its "
         "bias when attention_bias", _layer_count(d, H, H_kv, hd, bias, with_o=False)),
        ("forgot the value projection W_v: keys and values each have their own matrix",
         _layer_count(d, H, H_kv, hd, bias, n_kv=1)),
        ("forgot the biases: with attention_bias = True every projection has one bias per "
         "output feature", _layer_count(d, H, H_kv, hd, False) if bias else None),
        ("attention_bias = False means no bias vectors at all",
         _layer_count(d, H, H_kv, hd, True) if not bias else None),
        ("W_o's bias has one entry per OUTPUT feature, hidden_size of them, not "
         "num_attention_heads * head_dim", _layer_count(d, H, H_kv, hd, bias, o_bias=H * hd)),
        ("W_o maps the concatenated query heads, num_attention_heads * head_dim features, back "
         "to hidden_size: it has num_attention_heads * head_dim rows, not hidden_size "
         "(they differ when the config gives head_dim)",
         _layer_count(d, H, H_kv, hd, bias, o_rows=d)),
        ("your counts are 4 * hidden_size**2 (+ 4 * hidden_size with biases), section 6's formula "
         "for GPT-2, which ignores num_key_value_heads (W_k and W_v have num_key_value_heads * "
         "head_dim columns) and a head_dim given by the config",
         4 * d * d + (4 * d if bias else 0)),
        ("the heads split the projections' columns between them; a head is not a full "
         "hidden_size x hidden_size matrix", _layer_count(d, H, H_kv, hd, bias,
                                                          per_head_square=True)),
    ]


def attention_parameter_count(cfg: dict) -> int:
    """The reference: W_q, W_k, W_v, W_o (and their biases) of one attention layer."""
    d, H, H_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["head_dim"] if cfg["head_dim"] is not None else d // H
    return _layer_count(d, H, H_kv, hd, cfg["attention_bias"])


@_checker
def check_attention_parameters(attention_parameters):
    """``attention_parameters(config)`` -> the number of parameters of one attention layer
    (W_q, W_k, W_v, W_o, and a bias on each when ``attention_bias``) for a config dict with
    ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (None:
    ``hidden_size // num_attention_heads``) and ``attention_bias``."""
    answers = []
    for cfg in _CONFIG_CASES:
        ans = _call(attention_parameters, dict(cfg), name="attention_parameters",
                    on_error=f"on the config {cfg}")
        answers.append(_whole_number(ans, "the number of parameters"))
    refs = [attention_parameter_count(cfg) for cfg in _CONFIG_CASES]
    if answers == refs:
        d, H, H_kv = (_CONFIG_CASES[1][k] for k in ("hidden_size", "num_attention_heads",
                                                    "num_key_value_heads"))
        return (f"GPT-2 small: {refs[0]:,} parameters per attention layer; grouped-query attention "
                f"with d = {d}, H = {H}, H_kv = {H_kv}, head_dim = {d // H} and no biases: "
                f"{refs[1]:,}.")
    if len(set(answers)) == 1:
        raise _Wrong(f"you returned {answers[0]:,} for every config: compute the count from the "
                     "config's numbers")
    mistakes = [_config_mistakes(cfg) for cfg in _CONFIG_CASES]
    for k, (hint, _) in enumerate(mistakes[0]):
        values = [m[k][1] for m in mistakes]
        # a mistake that changes nothing for a config (e.g. GQA when H_kv = H) predicts the
        # right count there; it is named when the answers match it on every config
        values = [v if v is not None else r for v, r in zip(values, refs, strict=True)]
        if answers == values:
            raise _Wrong(hint)
    wrong = next(k for k, (a, r) in enumerate(zip(answers, refs, strict=True)) if a != r)
    raise _Wrong(f"for the config {_CONFIG_CASES[wrong]} you returned {answers[wrong]:,}, which "
                 "is not the count: add up W_q (hidden_size, num_attention_heads * head_dim), "
                 "W_k and W_v (hidden_size, num_key_value_heads * head_dim each), W_o, and the "
                 "biases when attention_bias")


# The prediction of exercise 4.3, graded before the learner counts: two real attention layers,
# each against section 6's 4 d^2 (no biases), the count when H * head_dim = d and H_kv = H.
# Llama 3 8B shrinks W_k and W_v (8 key/value heads); Gemma 7B widens every projection
# (H * head_dim = 4096 > d = 3072).
LLAMA3_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "attention_bias": False}
GEMMA_7B = {"hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16,
            "head_dim": 256, "attention_bias": False}
_PREDICTED = {"Llama 3 8B": LLAMA3_8B, "Gemma 7B": GEMMA_7B}


def _ratio_mistakes(cfg: dict) -> list[tuple[str, float]]:
    """(hint, the ratio that mistake predicts) for a layer's parameters / 4 d^2. A hint names
    the mistake, never the right number."""
    d, H, H_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q, kv = H * cfg["head_dim"], H_kv * cfg["head_dim"]
    full = 4 * d * d
    right = (2 * d * q + 2 * d * kv) / full
    if H_kv < H:  # grouped-query; here q = d
        return [
            ("grouped-query attention has fewer key/value heads: something in the layer shrinks",
             1.0),
            ("you shrank all four matrices by num_key_value_heads / num_attention_heads: which "
             "projections have one head per query head, and which one per key/value head?",
             H_kv / H),
            ("you shrank one of W_k and W_v: keys and values both have num_key_value_heads heads",
             (3 * d * q + d * kv) / full),
            ("you shrank W_q or W_o as well: they keep all num_attention_heads query heads",
             (d * q + 3 * d * kv) / full),
            ("your ratio is upside down: divide the layer's count by 4 d^2", 1 / right),
        ]
    return [  # ordinary heads, but H * head_dim != d
        ("the config gives head_dim, and num_attention_heads * head_dim is not hidden_size: the "
         "projections are as wide as all heads together, so the count is not 4 d^2", 1.0),
        ("you scaled each matrix by the square of num_attention_heads * head_dim / hidden_size: "
         "every projection keeps hidden_size on one side; only its other side is the heads' "
         "total width", (q / d) ** 2),
        ("W_o widens too: it maps the num_attention_heads * head_dim concatenated features back "
         "to hidden_size", (3 * d * q + d * d) / full),
        ("only W_q is wider in your count: W_k and W_v have head_dim features per head too, and "
         "W_o maps all the heads' features back to hidden_size", (d * q + 3 * d * d) / full),
        ("W_o is (num_attention_heads * head_dim, hidden_size), not square in the heads' width",
         (3 * d * q + q * q) / full),
        ("your ratio is upside down: divide the layer's count by 4 d^2", 1 / right),
    ]


@_checker
def check_gqa_prediction(my_ratio):
    """``my_ratio``: ``{"Llama 3 8B": r, "Gemma 7B": s}``, each model's attention parameters per
    layer divided by section 6's ``4 d^2`` (no biases), predicted before counting. Wrong
    predictions get a hint naming the mistake (no numbers); right ones get the counts."""
    keys = tuple(_PREDICTED)
    if my_ratio is None or my_ratio is ...:
        raise _NotAttempted("write your two predicted ratios into my_ratio; the counts are shown "
                            "once both are right")
    _typed(my_ratio, keys, "my_ratio", "your two predicted ratios")
    guess = _positive_numbers(my_ratio, keys, "my_ratio", "0.9")
    notes = []
    for k, cfg in _PREDICTED.items():
        count, full = attention_parameter_count(cfg), 4 * cfg["hidden_size"] ** 2
        if abs(guess[k] - count / full) <= 0.01:
            continue
        hint = next((h for h, value in _ratio_mistakes(cfg) if abs(guess[k] - value) <= 0.01),
                    "write the size of each of W_q, W_k, W_v and W_o from the config, add them, "
                    "then divide by 4 d^2")
        notes.append(f"{k}: {hint}")
    if notes:
        raise _Wrong("; ".join(notes))
    parts = [f"{k} {attention_parameter_count(cfg):,} against 4 d^2 = "
             f"{4 * cfg['hidden_size'] ** 2:,}" for k, cfg in _PREDICTED.items()]
    return ("counted from the configs: " + "; ".join(parts) + ". Llama's W_k and W_v shrink to a "
            "quarter; each of Gemma's four projections is 4096 / 3072 times a d x d matrix.")


# --------------------------------------------------------------------------------------------
# 4.4 Which outputs does a key padding mask change?
# --------------------------------------------------------------------------------------------
# (lengths, T, causal, padding_side): every combination of a causal mask and a padding side, each
# batch with one unpadded sequence and one with a single real token
_PAD_CASES = (
    ([6, 4, 1], 6, True, "right"),
    ([3, 5, 1, 4], 5, False, "right"),
    ([2, 6, 1, 5], 6, True, "left"),
    ([4, 1, 4, 2], 4, False, "left"),
)


def padding_positions(lengths, T: int, padding_side: str) -> np.ndarray:
    """``(B, T)`` bool: True where sequence b holds padding (the ``key_padding_mask``)."""
    pos = np.arange(T)[None, :]
    L = np.asarray(lengths)[:, None]
    return pos >= L if padding_side == "right" else pos < T - L


def _changed_variant(lengths, T, causal, padding_side, how="right"):
    """``(B, T)`` bool: query i's output changes when key_padding_mask is added iff a padding key
    is among the keys it may see; ``how`` names a typical wrong way to reason it out."""
    side = padding_side
    if how == "sides swapped":
        side = {"left": "right", "right": "left"}[padding_side]
    pad = padding_positions(lengths, T, side)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    sees = np.ones((T, T), dtype=bool)
    if causal and how != "ignores causal":
        sees = j < i if how == "strictly earlier" else j <= i
    changed = (pad[:, None, :] & sees[None]).any(-1)  # (B, T)
    if how == "nan unchanged":  # a query that sees only padding (nan once masked) left out
        return changed & ~(pad[:, None, :] | ~sees[None]).all(-1)
    has_pad = pad.any(-1, keepdims=True)
    if how == "padding only":
        return pad
    if how == "real only":
        return ~pad & has_pad
    if how == "every position":
        return np.ones_like(pad)
    if how == "nothing":
        return np.zeros_like(pad)
    return changed


_PAD_MISTAKES = {
    "padding only": "you marked the padding positions, where key_padding_mask is True; the "
                    "question is whose output changes: a query's output changes when a padding "
                    "key was among the keys it could see",
    "real only": "the padding positions are queries too: their outputs change as well",
    "ignores causal": "with a causal mask, query i sees only keys 0..i: can a real token see "
                      "padding that comes after it?",
    "strictly earlier": "the causal mask keeps the diagonal: query i also sees its own key i",
    "sides swapped": "padding_side='right' puts the padding after the real tokens, 'left' "
                     "before them",
    "nan unchanged": "a query whose keys are all padding gets nan from nn.MultiheadAttention once "
                     "the mask is added: count it as changed",
    "every position": "a sequence of full length has no padding: its key_padding_mask row is "
                      "all False, so none of its outputs change",
    "nothing": "the mask removes keys that some queries could see before: their outputs change",
}


@_checker
def check_padding_changes(changed_by_padding_mask):
    """``changed_by_padding_mask(lengths, T, causal, padding_side)`` -> ``(B, T)`` bool: True
    where self-attention's output (random weights) changes when ``key_padding_mask`` is added, for
    a batch of sequences of real lengths ``lengths`` padded to ``T`` on ``padding_side``
    ('right' or 'left'), with a causal mask when ``causal``."""
    answers = []
    for lengths, T, causal, side in _PAD_CASES:
        where = f"lengths = {lengths}, T = {T}, causal = {causal}, padding_side = {side!r}"
        ans = _call(changed_by_padding_mask, list(lengths), T, causal, side,
                    name="changed_by_padding_mask", on_error=f"on {where}")
        got = _arr(ans, "your answer")
        if got.shape != (len(lengths), T):
            raise _Wrong(f"your answer has shape {got.shape}; expected (B, T) = "
                         f"{(len(lengths), T)} (on {where})")
        if got.dtype != bool:
            if not np.isin(got, (0, 1)).all():
                raise _Wrong(f"return True/False (or 1/0) per position; got values like "
                             f"{got.ravel()[~np.isin(got.ravel(), (0, 1))][0]!r} (on {where})")
            got = got.astype(bool)
        answers.append(got)
    refs = [_changed_variant(*case) for case in _PAD_CASES]
    if all(np.array_equal(a, r) for a, r in zip(answers, refs, strict=True)):
        return ("an output changes exactly where its query could see a padding key. With a "
                "causal mask and right padding only the padding rows change; with left padding "
                "or no causal mask every row of a padded sequence does.")
    for how, hint in _PAD_MISTAKES.items():
        if all(np.array_equal(a, _changed_variant(*case, how=how))
               for a, case in zip(answers, _PAD_CASES, strict=True)):
            raise _Wrong(hint)
    k = next(k for k, (a, r) in enumerate(zip(answers, refs, strict=True))
             if not np.array_equal(a, r))
    lengths, T, causal, side = _PAD_CASES[k]
    b = int(np.argwhere((answers[k] != refs[k]).any(-1))[0][0])
    raise _Wrong(f"for lengths = {lengths}, T = {T}, causal = {causal}, padding_side = {side!r}, "
                 f"sequence {b} (length {lengths[b]}) is wrong: for each query, list the keys it "
                 "may see and ask whether one of them is padding")
