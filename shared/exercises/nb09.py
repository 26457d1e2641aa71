"""Exercise checkers for notebook 09 Inside a pretrained model (PyTorch)."""

from __future__ import annotations

import numpy as np

from shared.pretrained import hf_to_ours

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
    _t,
    _Wrong,
)

__all__ = [
    "check_weight_name",
    "check_punctuation_score",
    "check_padding_mask",
]


# --------------------------------------------------------------------------------------------
# 9.1 Map a weight name
# --------------------------------------------------------------------------------------------
_LAYER_SUFFIXES = [
    f"{part}.{kind}"
    for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                 "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                 "output.dense", "output.LayerNorm")
    for kind in ("weight", "bias")
]
_EMBEDDING_NAMES = [
    "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
    "embeddings.LayerNorm.bias",
]
_UNUSED_NAMES = ["pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids"]


def _weight_name_cases() -> list[str]:
    """Every kind of name, from layers 0, 3 and 5 (as in the file) and 11 (two digits, hidden)."""
    layer_names = [f"encoder.layer.{i}.{s}" for i in (0, 3, 5, 11) for s in _LAYER_SUFFIXES]
    return _EMBEDDING_NAMES + layer_names + _UNUSED_NAMES


def _name_hint(name: str, got, expected) -> str:
    """A hint for the first name ``map_name`` got wrong."""
    shown = f"map_name({name!r}) returned {got!r}; expected {expected!r}"
    if expected is None:
        return (f"{shown}: the [CLS] pooler and the position ids are not used by the encoder or "
                "by mean pooling, so return None for them")
    if got is None:
        return f"{shown}: every name except pooler.* and embeddings.position_ids is used"
    if got.rsplit(".", 1)[-1] != expected.rsplit(".", 1)[-1]:
        return f"{shown}: keep the last part of the name (.weight or .bias)"
    if expected.startswith("layers."):
        layer = expected.split(".")[1]
        got_layer = got.split(".")[1] if got.startswith("layers.") and got.count(".") >= 2 else None
        if got_layer != layer:
            two = " (it can have two digits)" if len(layer) > 1 else ""
            return (f"{shown}: keep the layer index{two}: encoder.layer.{layer}... -> "
                    f"layers.{layer}...")
        if "attention.output.dense" in name and ".ff_out." in got:
            return (f"{shown}: attention.output.dense is the attention's output projection "
                    "(out_proj, W_o); the feed-forward's second layer is output.dense without "
                    "'attention.'")
        if "attention.output.LayerNorm" in name and ".norm2." in got:
            return (f"{shown}: attention.output.LayerNorm is the LayerNorm right after attention "
                    "(norm1); output.LayerNorm follows the feed-forward block (norm2)")
        if ".output.LayerNorm" in name and ".norm1." in got:
            return (f"{shown}: output.LayerNorm (without 'attention.') follows the feed-forward "
                    "block: norm2")
        if ".output.dense" in name and ".out_proj." in got:
            return (f"{shown}: output.dense without 'attention.' is the feed-forward's second "
                    "layer, ff_out (1536 -> 384)")
        if "intermediate.dense" in name or "output.dense" in name:
            return (f"{shown}: intermediate.dense is the feed-forward's first layer (ff_in, "
                    "384 -> 1536) and output.dense its second (ff_out)")
        if ".attention.self." in name:
            return f"{shown}: query, key and value are W_query, W_key and W_value of the attention"
    return shown


@_checker
def check_weight_name(map_name):
    """``map_name(hf_name)`` -> our parameter name (as ``shared.pretrained.hf_to_ours``), or
    ``None`` for the names the encoder does not use (``pooler.*``, ``embeddings.position_ids``).
    Hidden cases: every kind of name, from several layers (one with a two-digit index)."""
    cases = _weight_name_cases()
    answers = {name: _call(map_name, name, name="map_name", none_ok=True) for name in cases}
    used = [n for n in cases if hf_to_ours(n) is not None]
    if all(answers[n] is None for n in used):
        raise _NotAttempted("map_name returns None for every name: fill in the TODO")
    for name in cases:
        expected, got = hf_to_ours(name), answers[name]
        if not (got is None or isinstance(got, str)):
            raise _Wrong(f"map_name({name!r}) returned a value of type {type(got).__name__}: "
                         "return our parameter name as a string, or None")
        if got != expected:
            raise _Wrong(_name_hint(name, got, expected))
    return (f"all {len(cases)} test names map right (layers 0, 3, 5 and 11, the embeddings, "
            "and pooler.* -> None).")


# --------------------------------------------------------------------------------------------
# 9.2 Score a new head pattern: attention to punctuation
# --------------------------------------------------------------------------------------------
def _is_punct(token: str) -> bool:
    """Punctuation: no character is a letter or a digit ('.', ',', "'"; not [CLS], [SEP], '##s')."""
    return not any(c.isalnum() for c in token)


def _punct_reference(w, tokens, is_punct=_is_punct, *, keys=True, reduce="mean"):
    """``w`` ``(..., n, n)`` -> ``(...)``: the mean over queries of the weight on punctuation
    keys (or one of the mistakes the arguments name)."""
    p = np.array([is_punct(t) for t in tokens])
    if not keys:  # the mistake: rows and columns swapped
        w = np.swapaxes(w, -1, -2)
    if reduce == "keys-mean":  # the mistake: mean over the punctuation keys instead of their sum
        return w[..., p].mean(-1).mean(-1)
    on_punct = w[..., p].sum(-1)  # (..., n): each query's total weight on punctuation
    return on_punct.sum(-1) if reduce == "sum" else on_punct.mean(-1)


_PUNCT_TOKENS = (
    ["[CLS]", "the", "animal", "didn", "'", "t", "cross", ",", "it", "was", "tired", ".", "[SEP]"],
    ["[CLS]", "cat", "##s", "sat", "?", "yes", "!", "[SEP]"],
    ["[CLS]", "a", "-", "b", "'", "s", "[SEP]"],
)


def _known_heads(n):
    """Heads whose score one can work out by hand: uniform, previous-token (query 0 on itself),
    and all weight on [CLS]."""
    uniform = np.full((n, n), 1.0 / n)
    previous = np.eye(n, k=-1)
    previous[0, 0] = 1.0
    cls = np.zeros((n, n))
    cls[:, 0] = 1.0
    return np.stack([uniform, previous, cls])  # (3, n, n)


@_checker
def check_punctuation_score(punctuation_score):
    """``punctuation_score(weights, tokens)``: weights ``(layers, heads, n, n)`` of one sentence
    (queries down, keys across), tokens its ``n`` token strings -> ``(layers, heads)``: for each
    head, the mean over the ``n`` queries of the total weight on punctuation keys (tokens without
    any letter or digit)."""
    rng = _rng(902)
    for case, tokens in enumerate(_PUNCT_TOKENS):
        n = len(tokens)
        L, H = (2, 3) if case != 1 else (1, 3)
        w = _softmax(rng.normal(size=(L, H, n, n)) * 2.0)
        w[0] = _known_heads(n)  # layer 0: three heads with scores known by hand
        got = _arr(_call(punctuation_score, _t(w.copy()), list(tokens), name="punctuation_score",
                         on_error="weights is (layers, heads, n, n) and tokens a list of n "
                                  "strings"), "the scores")
        if got.shape == (L, H, n):
            raise _Wrong("you returned one number per query: average over the queries too, to "
                         "get one score per head, shape (layers, heads)")
        _shape(got, (L, H), "the scores", "(layers, heads): one score per head")
        ref = _punct_reference(w, tokens)
        if _close(got, ref, atol=1e-6):
            continue
        _diagnose(got, [
            ("[CLS], [SEP] and word pieces like '##s' start with a punctuation character but "
             "contain letters: a token is punctuation only when none of its characters is a "
             "letter or digit (not any(c.isalnum() for c in token))",
             _punct_reference(w, tokens, lambda t: not t[0].isalnum())),
            ("rows are queries and columns keys: add each query's weights in the punctuation "
             "COLUMNS (w[..., is_punct].sum(-1)), then average over the queries",
             _punct_reference(w, tokens, keys=False)),
            ("average over the queries (divide by n), so that a head that puts all its weight on "
             "punctuation scores 1", _punct_reference(w, tokens, reduce="sum")),
            ("add the weights on the punctuation keys (a query's total weight on punctuation); "
             "you averaged them", _punct_reference(w, tokens, reduce="keys-mean")),
        ], atol=1e-6)
        known = _punct_reference(_known_heads(n), tokens)
        if not _close(got[0], known, atol=1e-6):
            raise _Wrong(f"on heads whose scores are known by hand ({' '.join(tokens)}) you gave "
                         f"{np.round(got[0], 4).tolist()}: a uniform head scores the share of "
                         f"punctuation tokens {known[0]:.4f}, a previous-token head "
                         f"{known[1]:.4f}, a [CLS] head 0")
        raise _Wrong(f"scores differ from the mean over queries of the weight on punctuation keys "
                     f"by up to {_maxdiff(got, ref)} (tokens {' '.join(tokens)})")
    return ("on hidden heads and on three with known scores (uniform, previous token, [CLS]) the "
            "scores match; now point it at the model.")


# --------------------------------------------------------------------------------------------
# 9.3 Apply a padding mask
# --------------------------------------------------------------------------------------------
def _padding_cases():
    rng = _rng(902)
    cases = []
    for lengths, H in (([5, 3, 1], 2), ([2, 4], 3)):
        B, T = len(lengths), max(lengths)
        real = np.arange(T)[None, :] < np.array(lengths)[:, None]  # (B, T)
        scores = rng.normal(size=(B, H, T, T))
        scores[:, :, :, ~real.all(0)] += 3.0  # padded keys look attractive
        cases.append((scores, real))
    return cases


def _masked(scores, real, *, keys=True, queries=True, inverted=False, fill=-np.inf,
            after=False):
    """The masked softmax, and (with the options) the typical ways to get it wrong."""
    r = ~real if inverted else real
    allowed = np.ones(scores.shape, dtype=bool)
    if keys:
        allowed &= r[:, None, None, :]
    if queries:
        allowed &= r[:, None, :, None]
    if after:
        return np.where(allowed, _softmax(scores), 0.0)
    return _softmax(np.where(allowed, scores, fill))  # fully masked rows: zeros


@_checker
def check_padding_mask(masked_softmax):
    """``masked_softmax(scores, attention_mask)`` -> weights ``(B, H, T, T)``: scores
    ``(B, H, T, T)``, attention_mask ``(B, T)`` bool (True = a real token). A query may attend to
    a key only when both are real tokens: weights on padded keys are 0, each real query's row sums
    to 1, and a padded query's row is all zeros (not NaN)."""
    for scores, real in _padding_cases():
        got = _arr(_call(masked_softmax, _t(scores.copy()), _t(real.copy()),
                         name="masked_softmax",
                         on_error="hint: attention_mask is (B, T); index it as "
                                  "attention_mask[:, None, None, :] for the keys"),
                   "the weights")
        _shape(got, scores.shape, "the weights", "(B, H, T, T), like the scores")
        ref = _masked(scores, real)
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            raise _Wrong("your weights contain nan: a padded query may attend to nothing, so its "
                         "row is all -inf and softmax divides 0 by 0; turn those rows into zeros "
                         "(torch.nan_to_num(weights, 0.0) or torch.where)")
        pad_rows = np.broadcast_to(~real[:, None, :, None], scores.shape)
        zero_fill = _masked(scores, real, fill=0.0)
        _diagnose(got, [
            ("the padded keys still get weight: set the scores of padded keys (the last axis, "
             "attention_mask[:, None, None, :]) to -inf before the softmax",
             _masked(scores, real, keys=False)),
            ("the mask is inverted: attention_mask is True for REAL tokens (PyTorch's "
             "key_padding_mask uses the opposite convention)",
             _masked(scores, real, inverted=True)),
            ("masked after softmax without renormalising: the real keys' weights no longer sum "
             "to 1; set the scores to -inf before the softmax", _masked(scores, real, after=True)),
            ("a score of 0 does not remove a key (exp(0) = 1): use -inf, not 0, for padded "
             "positions", zero_fill),
            ("a score of 0 does not remove a key (exp(0) = 1): use -inf, not 0, for padded "
             "positions", np.where(pad_rows, 0.0, zero_fill)),
        ])
        if _close(np.where(pad_rows, 0.0, got), ref) and np.allclose(
                got.sum(-1)[pad_rows[..., 0]], 1.0):
            raise _Wrong("the padded queries' rows should be all zeros (a padding token attends to "
                         "nothing), not spread over the keys: mask the queries too (a large "
                         "negative number instead of -inf also spreads a fully masked row evenly)")
        raise _Wrong(f"the weights differ from the masked softmax by up to {_maxdiff(got, ref)}")
    return "padded keys get 0, real rows sum to 1, padded queries get zeros, no NaN."
