"""Exercise checkers for notebook 06 What attention learns (PyTorch)."""

from __future__ import annotations

import copy

import numpy as np
import torch

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
    _t,
    _Wrong,
)

__all__ = [
    "check_previous_token_score",
    "check_ablate_head",
    "check_find_induction_head",
]


def _causal_weights(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Random causal attention weights ``(..., T, T)``: rows sum to 1, zero above the diagonal."""
    T = shape[-1]
    scores = rng.normal(scale=2.0, size=shape)
    return _softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf))


def _offset_diagonal_mean(w: np.ndarray, offset: int, rows: int) -> np.ndarray:
    """Sum of ``w``'s diagonal at ``offset`` over the last two axes, divided by ``rows``."""
    return np.diagonal(w, offset=offset, axis1=-2, axis2=-1).sum(axis=-1) / rows


# --------------------------------------------------------------------------------------------
# 6.1 The previous-token score
# --------------------------------------------------------------------------------------------
def _prev_cases():
    rng = _rng(601)
    T = 5
    perfect = np.zeros((T, T))
    perfect[0, 0] = 1.0
    perfect[np.arange(1, T), np.arange(T - 1)] = 1.0  # every query on the token before it
    return [
        _causal_weights(rng, (3, 6, 6)),  # three heads
        np.stack([perfect, np.eye(T)]),  # a perfect previous-token head, a "look at myself" head
        _causal_weights(rng, (2, 2, 7, 7)),  # (B, heads, T, T)
        _causal_weights(rng, (4, 4)),  # one head: a single number
    ]


@_checker
def check_previous_token_score(previous_token_score):
    """``previous_token_score(weights)`` -> the mean of ``weights[..., i, i - 1]`` over the
    queries ``i = 1 .. T - 1``, one score per leading index. Torch tensors ``(..., T, T)``."""
    for w in _prev_cases():
        T = w.shape[-1]
        got = _arr(_call(previous_token_score, _t(w.copy()), name="previous_token_score"),
                   "the score")
        ref = _offset_diagonal_mean(w, -1, T - 1)
        if got.shape != ref.shape:
            if got.size == 1 and ref.size > 1:
                raise _Wrong(f"return one score per head: for weights of shape {w.shape} the "
                             f"result should have shape {ref.shape} (average over the queries "
                             "only, the last-but-one axis)")
            raise _Wrong(f"for weights of shape {w.shape} the scores should have shape "
                         f"{ref.shape} (weights.shape[:-2]); got {got.shape}. Note that "
                         "torch.diagonal uses dims 0 and 1 unless you pass dim1=-2, dim2=-1")
        if _close(got, ref):
            continue
        _diagnose(got, [
            ("that is attention to the query itself (the main diagonal, key i); the previous "
             "token of query i is key i - 1: the diagonal at offset -1",
             _offset_diagonal_mean(w, 0, T)),
            ("that is attention to the query itself (the main diagonal, key i); the previous "
             "token of query i is key i - 1: the diagonal at offset -1",
             _offset_diagonal_mean(w[..., 1:, :], 1, T - 1)),
            ("key i + 1 is the *next* token, which a causal mask hides (always 0 here): the "
             "previous token of query i is key i - 1, the diagonal at offset -1",
             _offset_diagonal_mean(w, 1, T - 1)),
            ("query 0 has no previous token: average over the T - 1 queries 1 .. T - 1, not "
             "over all T rows", _offset_diagonal_mean(w, -1, T)),
            ("average over the queries instead of summing: a perfect previous-token head "
             "should score 1", _offset_diagonal_mean(w, -1, 1)),
        ])
        raise _Wrong(f"the scores differ from the mean of weights[..., i, i - 1] over i = 1 .. "
                     f"T - 1 by up to {_maxdiff(got, ref)}")
    return ("a perfect previous-token head scores 1.0, a head that looks only at itself 0.0.")


# --------------------------------------------------------------------------------------------
# 6.2 Ablate a head
# --------------------------------------------------------------------------------------------
def _mha_reference(params: dict, x: np.ndarray, num_heads: int, silence=(),
                   uniform=()) -> np.ndarray:
    """Causal multi-head attention from raw (float64) parameters, with the context of the heads
    in ``silence`` set to zero and the heads in ``uniform`` averaging over the keys they may see.

    ``params`` holds nn.Linear-layout weights ``Wq, Wk, Wv, Wo`` (out, in) and biases."""
    B, T, d = x.shape
    hd = d // num_heads

    def split(a):  # (B, T, d) -> (B, H, T, hd)
        return a.reshape(B, T, num_heads, hd).transpose(0, 2, 1, 3)

    Q = split(x @ params["Wq"].T + params["bq"])
    K = split(x @ params["Wk"].T + params["bk"])
    V = split(x @ params["Wv"].T + params["bv"])
    scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(hd)
    for h in uniform:
        scores[:, h] = 0.0
    causal = np.tril(np.ones((T, T), dtype=bool))
    ctx = _softmax(np.where(causal, scores, -np.inf)) @ V  # (B, H, T, hd)
    for h in silence:
        ctx[:, h] = 0.0
    concat = ctx.transpose(0, 2, 1, 3).reshape(B, T, d)
    return concat @ params["Wo"].T + params["bo"]


def _params(mha) -> dict:
    def get(lin, what):
        t = getattr(lin, what)
        return (t.detach().double().numpy().copy() if t is not None
                else np.zeros(lin.weight.shape[0]))

    return {"Wq": get(mha.W_query, "weight"), "bq": get(mha.W_query, "bias"),
            "Wk": get(mha.W_key, "weight"), "bk": get(mha.W_key, "bias"),
            "Wv": get(mha.W_value, "weight"), "bv": get(mha.W_value, "bias"),
            "Wo": get(mha.out_proj, "weight"), "bo": get(mha.out_proj, "bias")}


@_checker
def check_ablate_head(ablate_head):
    """``ablate_head(mha, head)`` -> a copy of the ``shared.modules.MultiHeadAttention`` ``mha``
    in which head ``head`` contributes nothing to the output (the other heads and the output
    bias unchanged); ``mha`` itself must stay as it was."""
    from ..modules import MultiHeadAttention

    rng = _rng(602)
    torch.manual_seed(602)  # the checker runs inside a forked RNG: the notebook's stream is safe
    for d, H, head, bias in ((8, 2, 1, False), (12, 3, 0, True), (12, 4, 2, True)):
        mha = MultiHeadAttention(d, d, context_length=6, dropout=0.0, num_heads=H,
                                 qkv_bias=bias).double().eval()
        with torch.no_grad():  # a visible output bias, so dropping it is detectable
            mha.out_proj.bias.normal_()
        given = copy.deepcopy(mha)
        before = {k: v.clone() for k, v in given.state_dict().items()}
        x = rng.normal(size=(2, 5, d))
        p = _params(mha)
        ref = _mha_reference(p, x, H, silence=[head])
        ablated = _call(ablate_head, given, head, name="ablate_head")
        if not isinstance(ablated, torch.nn.Module):
            raise _Wrong(f"return the ablated module (a copy of mha); got "
                         f"{type(ablated).__name__}")
        with torch.no_grad():
            out = _call(ablated, _t(x.copy()), name="the module you returned")
        if isinstance(out, tuple):
            out = out[0]
        got = _arr(out, "the ablated module's output")
        _shape(got, ref.shape, "the ablated module's output", "(B, T, d_out)")
        if not _close(got, ref):
            hd = d // H
            cols = slice(head * hd, (head + 1) * hd)
            rows_zeroed = dict(p, Wo=p["Wo"].copy(), bo=p["bo"].copy())
            rows_zeroed["Wo"][cols] = 0.0
            rows_zeroed["bo"][cols] = 0.0
            rows_only = dict(p, Wo=rows_zeroed["Wo"])
            value_weight_only = dict(p, Wv=p["Wv"].copy())
            value_weight_only["Wv"][cols] = 0.0
            no_out_bias = dict(p, bo=np.zeros_like(p["bo"]))
            _diagnose(got, [
                ("nothing changed: the output is the full module's output. Zero the head's "
                 f"columns {head * hd}:{(head + 1) * hd} of out_proj.weight",
                 _mha_reference(p, x, H)),
                ("you zeroed *rows* of out_proj.weight (some output features of every head); the "
                 f"head's own contribution goes through the *columns* {head * hd}:"
                 f"{(head + 1) * hd}: out_proj.weight[:, cols] = 0",
                 _mha_reference(rows_only, x, H)),
                ("you zeroed *rows* of out_proj.weight (some output features of every head); the "
                 f"head's own contribution goes through the *columns* {head * hd}:"
                 f"{(head + 1) * hd}: out_proj.weight[:, cols] = 0",
                 _mha_reference(rows_zeroed, x, H)),
                ("zeroing the head's queries or keys makes all its scores 0, so its attention "
                 "becomes a plain average over the keys it may see: the head still adds to the "
                 "output. Silence its output instead (its columns of out_proj.weight)",
                 _mha_reference(p, x, H, uniform=[head])),
                ("the head's value bias is still there (V = x W_v + b_v, so its output is b_v, "
                 "not 0); zero the head's columns of out_proj.weight instead",
                 _mha_reference(value_weight_only, x, H) if bias else None),
                ("out_proj.bias is shared by all heads: keep it, remove only the head's columns "
                 "of out_proj.weight",
                 _mha_reference(no_out_bias, x, H, silence=[head])),
                ("you removed every head; remove only head "
                 f"{head}", _mha_reference(p, x, H, silence=range(H))),
                *((f"you silenced head {g}, not head {head} (head h owns the columns "
                   "h*head_dim:(h+1)*head_dim)", _mha_reference(p, x, H, silence=[g]))
                  for g in range(H) if g != head),
            ])
            raise _Wrong(f"the ablated module's output differs from the module without head "
                         f"{head} by up to {_maxdiff(got, ref)}")
        after = given.state_dict()
        if any(not torch.equal(before[k], after[k]) for k in before):
            raise _Wrong("the module you were given has changed: ablate a copy "
                         "(copy.deepcopy(mha)) and leave the original intact, so you can still "
                         "compare with it")
    return "the head's output is gone; its attention weights and the other heads are untouched."


# --------------------------------------------------------------------------------------------
# 6.3 Find the induction head
# --------------------------------------------------------------------------------------------
_KINDS = ("induction", "duplicate", "previous", "bos", "self", "uniform")


def _pattern(kind: str, tokens: np.ndarray) -> np.ndarray:
    """An idealised ``(T, T)`` pattern of one kind of head on one sequence."""
    T = len(tokens)
    i, k = np.indices((T, T))
    causal = k <= i
    earlier = (tokens[k] == tokens[i]) & (k < i)  # an earlier occurrence of the query's token
    after = np.zeros((T, T), dtype=bool)
    after[:, 1:] = (tokens[None, :-1] == tokens[:, None]) & causal[:, 1:]  # the key after it
    target = {"induction": after, "duplicate": earlier, "previous": k == i - 1,
              "bos": k == 0, "self": k == i, "uniform": causal}[kind]
    target = target & causal
    rows = target.any(axis=1)
    target[~rows, 0] = True  # a query with nothing to look at rests on BOS
    return target / target.sum(axis=1, keepdims=True)


def _induction_cases():
    rng = _rng(603)
    cases = []
    for period, H, sharp in ((6, 5, 0.6), (8, 6, 0.55), (5, 4, 0.65)):
        tokens = np.concatenate([[0], np.tile(rng.permutation(np.arange(1, 27))[:period], 2)])
        T = len(tokens)
        kinds = ["induction", *rng.permutation(_KINDS[1:])[:H - 1]]
        if "duplicate" not in kinds:
            kinds[-1] = "duplicate"  # always include the off-by-one decoy
        order = rng.permutation(H)
        kinds = [kinds[j] for j in order]
        heads = []
        for kind in kinds:
            mix = sharp if kind == "induction" else 0.92  # the induction head is not the sharpest
            heads.append(mix * _pattern(kind, tokens) +
                         (1 - mix) * _causal_weights(rng, (T, T)))
        cases.append((np.stack(heads), tokens, kinds))
    return cases


def _hint_for(kind: str, h: int) -> str:
    return {
        "duplicate": f"head {h} attends to the earlier occurrence of the current token itself; an "
                     "induction head attends to the key right *after* it (key k with "
                     "tokens[k - 1] == tokens[i])",
        "previous": f"head {h} is a previous-token head (query i on key i - 1); an induction head "
                    "attends to the token after an earlier occurrence of the current token",
        "bos": f"head {h} is the sharpest head, but it rests on BOS (key 0): sharp is not the same "
               "as useful. Score each head on the induction pattern",
        "self": f"head {h} is sharp, but it looks at the query itself (the main diagonal); score "
                "each head on the induction pattern",
        "uniform": f"head {h} spreads its weight evenly over all keys it can see; score each head "
                   "on the induction pattern",
    }[kind]


@_checker
def check_find_induction_head(find_induction_head):
    """``find_induction_head(weights, tokens)`` -> the index (an int) of the induction head among
    one layer's heads. weights ``(H, T, T)``, tokens ``(T,)``: torch tensors of one sequence that
    repeats a segment. The other heads are decoys (previous-token, duplicate-token, BOS, ...)."""
    for w, tokens, kinds in _induction_cases():
        ans = _call(find_induction_head, _t(w.copy()), torch.from_numpy(tokens.copy()),
                    name="find_induction_head")
        if isinstance(ans, torch.Tensor) and ans.numel() == 1:
            ans = ans.item()
        if isinstance(ans, np.ndarray) and ans.size == 1:
            ans = ans.item()
        if isinstance(ans, (torch.Tensor, np.ndarray, list, tuple)):
            raise _Wrong("return the index of one head (an int), e.g. int(scores.argmax()), not "
                         "the scores of all heads")
        if isinstance(ans, (bool, np.bool_)) or not isinstance(ans, (int, np.integer)):
            raise _Wrong(f"return the index of a head as an int; got {type(ans).__name__}")
        h = int(ans)
        if not 0 <= h < len(kinds):
            raise _Wrong(f"there are {len(kinds)} heads (0 .. {len(kinds) - 1}); got {h}")
        if kinds[h] != "induction":
            raise _Wrong(_hint_for(kinds[h], h))
    return "in every hidden layer the induction head was found among the decoys."
