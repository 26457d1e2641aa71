"""Exercise checkers for notebook 09 Inside a pretrained model (PyTorch)."""

from __future__ import annotations

import contextlib
import functools
import io
import numbers

import numpy as np
import torch

from shared.pretrained import hf_to_ours

from ._core import (
    CheckResult,
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
    "grade_switch_prediction",
    "check_replace_prediction",
    "check_split_qkv",
    "check_punctuation_score",
    "check_punctuation_guess",
    "check_punctuation_head",
    "check_silenced_heads",
    "check_silencing_prediction",
    "check_random_sets",
    "check_carrier_prediction",
    "check_weights_values_split",
]


# --------------------------------------------------------------------------------------------
# Section 8: a prediction typed in the teaching cell (not an exercise)
# --------------------------------------------------------------------------------------------
_WINS_TOL = 1  # a predicted count of right-way wins within 1 of the measured one is borne out


@_checker
def grade_switch_prediction(pred_right_wins, right, wrong):
    """Section 8: ``pred_right_wins``, a whole number from 0 to 7, the predicted count of Winograd
    pairs in which the best right-way margin beats the best wrong-way one. ``right``, ``wrong``:
    7 numbers each, per pair the best margin over the heads of a switch toward the noun each
    sentence means, and toward the other noun. Borne out within 1 of the measured count; a fair
    coin gives 2 to 5 in 88% of draws, a head that tracked the referent 6 or 7. "not attempted yet"
    while the prediction is still None."""
    if pred_right_wins is None or pred_right_wins is ...:
        raise _NotAttempted("write your predicted count in pred_right_wins (the cell above) and "
                            "run both cells again; it is graded against the margins printed here")
    right, wrong = _arr(right, "right"), _arr(wrong, "wrong")
    _shape(right, (7,), "right", "one best margin per pair")
    _shape(wrong, (7,), "wrong", "one best margin per pair")
    if (not isinstance(pred_right_wins, numbers.Integral) or isinstance(pred_right_wins, bool)
            or not 0 <= pred_right_wins <= 7):
        raise _Wrong("pred_right_wins is a count of pairs, a whole number from 0 to 7; "
                     f"got {pred_right_wins!r}")
    wins = int((right > wrong).sum())
    said = f"you predicted {pred_right_wins} of 7; measured: the right way wins {wins} of 7"
    if pred_right_wins > wins + _WINS_TOL:
        raise _Wrong(f"{said}. Fewer than you expected: a head that tracked the referent would win "
                     "nearly every pair; compare the count with a fair coin's 2 to 5 (88% of "
                     "draws)")
    if pred_right_wins < wins - _WINS_TOL:
        raise _Wrong(f"{said}. More than you expected: the wrong way does not win systematically "
                     "either; compare the count with a fair coin's 2 to 5 (88% of draws)")
    return f"{said}, within {_WINS_TOL} of your count"


# --------------------------------------------------------------------------------------------
# 9.1 Map a weight name
# --------------------------------------------------------------------------------------------
_LAYER_PARTS = ("attention.self.query", "attention.self.key", "attention.self.value",
                "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                "output.dense", "output.LayerNorm")
_REPLACEMENTS = [  # the notebook's tempting mapper: (their part, our part), applied in this order
    ("encoder.layer.", "layers."),
    ("attention.self.query", "attention.W_query"),
    ("attention.self.key", "attention.W_key"),
    ("attention.self.value", "attention.W_value"),
    ("output.dense", "ff_out"),
    ("attention.output.dense", "attention.out_proj"),
    ("intermediate.dense", "ff_in"),
    ("output.LayerNorm", "norm2"),
    ("attention.output.LayerNorm", "norm1"),
    ("embeddings.word_embeddings", "embeddings.token"),
    ("embeddings.position_embeddings", "embeddings.position"),
    ("embeddings.token_type_embeddings", "embeddings.segment"),
    ("embeddings.LayerNorm", "embeddings.norm"),
]  # entry for entry the notebook's REPLACEMENTS (tests/test_exercises_09.py checks)


def _by_replacing(name: str) -> str:
    for theirs, ours in _REPLACEMENTS:
        name = name.replace(theirs, ours)
    return name


def _broken_parts() -> dict[str, tuple[str, str]]:
    """{part: (the name of layer 0's weight, what the replacing mapper makes of it)} for every
    layer part the replacing mapper maps wrong."""
    broken = {}
    for part in _LAYER_PARTS:
        name = f"encoder.layer.0.{part}.weight"
        if _by_replacing(name) != hf_to_ours(name):
            broken[part] = (name, _by_replacing(name))
    return broken


@_checker
def check_replace_prediction(my_broken_parts):
    """``my_broken_parts``: the set of layer parts (from ``attention.self.query`` ...
    ``output.LayerNorm``) whose names the notebook's ``tempting_map_name`` maps wrong, predicted
    before running it on them. Graded against the mapper run on every part."""
    if my_broken_parts is None:
        raise _NotAttempted("write the set of parts you predict tempting_map_name gets wrong in "
                            "my_broken_parts; the names it really gets wrong are shown once it is "
                            "filled in")
    if isinstance(my_broken_parts, str) or not isinstance(my_broken_parts,
                                                        (set, frozenset, list, tuple)):
        raise _Wrong("my_broken_parts must be a set of parts such as {'intermediate.dense'}; "
                     f"got {my_broken_parts!r}")
    unknown = [p for p in my_broken_parts if p not in _LAYER_PARTS]
    if unknown:
        raise _Wrong(f"{unknown[0]!r} is not one of the 8 layer parts: choose from "
                     f"{', '.join(_LAYER_PARTS)}")
    broken, guessed = _broken_parts(), set(my_broken_parts)
    right = sorted(guessed - set(broken))
    if right:
        name = f"encoder.layer.0.{right[0]}.weight"
        raise _Wrong(f"{right[0]!r} maps right ({name!r} -> {_by_replacing(name)!r}): a part "
                     "goes wrong only when a rule meant for another part also fires on it")
    if not guessed:
        raise _Wrong("some parts do go wrong: a replacement can fire inside a longer name it was "
                     "not meant for. Which rule's text also appears inside another part?")
    if guessed != set(broken):
        raise _Wrong(f"you found {len(guessed)} of the {len(broken)} parts it gets wrong; every "
                     "part it gets wrong breaks for the same reason: a shorter part's rule, "
                     "applied first, fires inside a longer part")
    shown = "; ".join(f"{name!r} -> {got!r}" for name, got in broken.values())
    return (f"measured on layer 0: {shown}. 'output.dense' and 'output.LayerNorm' are also the "
            "ends of 'attention.output.dense' and 'attention.output.LayerNorm', and their rules "
            "run first.")


_QKV = ("W_query", "W_key", "W_value")


def _split_reference(weight, bias, order=(0, 1, 2), transpose=True, interleaved=False):
    """A fused GPT-2-style ``weight`` ``(d_in, 3 d_out)`` and ``bias`` ``(3 d_out,)`` -> our six
    tensors (or one of the mistakes the arguments name)."""
    d_in, three_d = weight.shape
    d = three_d // 3
    if interleaved:  # the mistake: q, k, v alternating column by column
        w_parts = [weight[:, i::3] for i in range(3)]
        b_parts = [bias[i::3] for i in range(3)]
    else:
        w_parts = [weight[:, i * d:(i + 1) * d] for i in range(3)]
        b_parts = [bias[i * d:(i + 1) * d] for i in range(3)]
    out = {}
    for name, i in zip(_QKV, order, strict=True):
        out[f"{name}.weight"] = w_parts[i].T if transpose else w_parts[i]
        out[f"{name}.bias"] = b_parts[i]
    return out


def _fused_cases():
    """(weight (d_in, 3 d_out), bias (3 d_out,)): random, one square and one not, then MiniLM's
    layer 0 query, key and value fused GPT-2 style (x @ W + b, q then k then v)."""
    from shared.pretrained import load_weights

    rng = _rng(901)
    cases = [(rng.normal(size=(6, 18)), rng.normal(size=18)),
             (rng.normal(size=(4, 30)), rng.normal(size=30))]
    t = load_weights()
    prefix = "encoder.layer.0.attention.self."
    cases.append((np.concatenate([t[prefix + n + ".weight"].double().numpy().T
                                  for n in ("query", "key", "value")], axis=1),
                  np.concatenate([t[prefix + n + ".bias"].double().numpy()
                                  for n in ("query", "key", "value")])))
    return cases


@_checker
def check_split_qkv(split_qkv):
    """``split_qkv(weight, bias)``: a fused query-key-value projection stored GPT-2 style,
    ``weight`` ``(d_in, 3 d_out)`` used as ``x @ weight + bias`` with q, k, v side by side, ``bias``
    ``(3 d_out,)`` -> ``{"W_query.weight": (d_out, d_in), "W_query.bias": (d_out,), ... W_key ...,
    W_value ...}`` in ``nn.Linear``'s layout. Hidden cases: a square and a non-square projection,
    and MiniLM's own layer 0 fused."""
    keys = [f"{n}.{k}" for n in _QKV for k in ("weight", "bias")]
    for case, (weight, bias) in enumerate(_fused_cases()):
        d_in, three_d = weight.shape
        d = three_d // 3
        got = _call(split_qkv, _t(weight), _t(bias), name="split_qkv",
                    on_error="weight is (d_in, 3 * d_out) and bias (3 * d_out,)")
        if not isinstance(got, dict) or set(got) != set(keys):
            raise _Wrong("return a dict with the six keys " + ", ".join(keys) + "; got "
                         + (f"the keys {sorted(got)}" if isinstance(got, dict)
                            else type(got).__name__))
        got = {k: _arr(v, k) for k, v in got.items()}
        ref = _split_reference(weight, bias)
        for k in keys:
            want = ref[k].shape
            if got[k].shape != want:
                if k.endswith(".weight") and got[k].shape == want[::-1]:
                    raise _Wrong(f"{k} has shape {got[k].shape}, expected {want}: the fused "
                                 "tensor is (d_in, 3 d_out), used as x @ W; nn.Linear stores "
                                 "(d_out, d_in): transpose each block")
                if k.endswith(".bias") and got[k].shape == (three_d,):
                    raise _Wrong(f"{k} is the whole fused bias {got[k].shape}: split it into "
                                 "three like the weight")
                raise _Wrong(f"{k} has shape {got[k].shape}, expected {want} (d_in = {d_in}, "
                             f"d_out = {d})")
        flat = np.concatenate([got[k].ravel() for k in keys])

        def as_flat(r):
            return np.concatenate([r[k].ravel() for k in keys])

        if _close(flat, as_flat(ref), atol=1e-6):
            continue
        orders = [(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
        _diagnose(flat, [
            ("every weight is the right block but not transposed: the blocks are square here, so "
             "the shapes fit, yet x @ W and nn.Linear's x @ W.T differ. Transpose each block",
             as_flat(_split_reference(weight, bias, transpose=False)) if d_in == d else None),
            ("q, k and v alternate column by column in your reading; the fused tensor holds all "
             "of q's columns first, then k's, then v's (three blocks of d_out)",
             as_flat(_split_reference(weight, bias, interleaved=True))),
            *[("the three blocks are right but assigned in another order: the fused tensor "
               "holds q, then k, then v", as_flat(_split_reference(weight, bias, order=o)))
              for o in orders],
        ])
        kind = "MiniLM's layer 0" if case == 2 else f"a ({d_in}, {three_d}) fused weight"
        raise _Wrong(f"on {kind} your tensors differ from the split by up to "
                     f"{_maxdiff(flat, as_flat(ref))}: block i of the columns is "
                     "weight[:, i * d_out:(i + 1) * d_out], transposed for nn.Linear")
    return ("the square and non-square cases split right, and MiniLM's layer 0, fused and split "
            "back by your function, gives back the file's query, key and value.")


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
             "letter or digit; you tested the first character only",
             _punct_reference(w, tokens, lambda t: not t[0].isalnum())),
            ("rows are queries and columns keys: you summed the weights in the punctuation "
             "ROWS (what punctuation queries give out), not the punctuation columns",
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
# 9.3 Silence heads
# --------------------------------------------------------------------------------------------
def _silence_model(seed: int):
    """A small random MiniLM in float64: 4 layers of 4 heads of 4 features, random LayerNorms."""
    from shared.pretrained import MiniLM

    torch.manual_seed(seed)
    model = MiniLM(vocab_size=30, max_positions=12, num_segments=2, d_model=16, num_heads=4,
                   num_layers=4, d_ff=32).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _silence_cases():
    """(model, ids, mask, heads): heads from one layer and from two, one alone, and none."""
    cases = []
    for seed, lengths, heads in ((903, [7, 4], [(0, 1), (2, 3), (2, 0)]),
                                 (904, [6, 6, 3], [(3, 2)]),
                                 (905, [5, 2], [])):
        model = _silence_model(seed)
        T = max(lengths)
        ids = torch.randint(0, 30, (len(lengths), T))
        mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        ids[~mask] = 0  # [PAD]
        cases.append((model, ids, mask, heads))
    return cases


def _head_means(model, ids, mask, how="mean", model_mask=True):
    """Per layer, the mean of out_proj's input (B, T, d_model) in a clean run (no head silenced):
    over the real tokens of all sentences (``how="mean"``), over every position ("pad", a mistake)
    or per sentence ("sentence", a mistake) -> list of tensors broadcastable to (B, T, d_model)."""
    m = mask.to(torch.bool)
    means = [None] * len(model.layers)

    def record(layer):
        def hook(module, args):
            x = args[0]
            if how == "pad":
                means[layer] = x.mean((0, 1))
            elif how == "sentence":
                w = m[..., None].to(x.dtype)
                means[layer] = (x * w).sum(1, keepdim=True) / w.sum(1, keepdim=True)
            else:
                means[layer] = x[m].mean(0)
        return hook

    hooks = [layer.attention.out_proj.register_forward_pre_hook(record(i))
             for i, layer in enumerate(model.layers)]
    try:
        with torch.no_grad():
            model(ids, mask if model_mask else None)
    finally:
        for hook in hooks:
            hook.remove()
    return means


def _silenced(model, ids, mask, heads, how="mean", model_mask=True):
    """The model's last hidden states with the listed heads mean-ablated: each head's ``head_dim``
    features of out_proj's input replaced, at every position, by their mean over the real tokens
    of all sentences in a clean run of the same batch (no head silenced). ``how`` other than
    "mean" makes one of the typical mistakes: "zero" (zero-ablation), "value bias" (W_value's
    weight rows zeroed, its bias left), "pad" (the mean taken over
    the [PAD] positions too), "sentence" (each sentence's own mean), "same pass" (the mean taken
    in the ablated run itself, after earlier layers' heads were already silenced)."""
    m = mask.to(torch.bool)
    no_mean = how in ("zero", "same pass", "value bias")
    clean = None if no_mean else _head_means(model, ids, mask, how, model_mask)
    module_bias = {layer: model.layers[layer].attention.W_value.bias for layer, _ in heads}
    hooks = []
    for layer, head in heads:
        att = model.layers[layer].attention
        cols = slice(head * att.head_dim, (head + 1) * att.head_dim)

        def ablate(module, args, cols=cols, layer=layer):
            x = args[0].clone()
            if how == "zero":
                x[..., cols] = 0
            elif how == "value bias":  # W_value's rows zeroed: the weights sum to 1, so b_v is left
                x[..., cols] = module_bias[layer][cols]
            elif how == "same pass":
                x[..., cols] = x[m][:, cols].mean(0)
            else:
                x[..., cols] = clean[layer][..., cols]
            return (x,)

        hooks.append(att.out_proj.register_forward_pre_hook(ablate))
    try:
        with torch.no_grad():
            return model(ids, mask if model_mask else None).numpy()
    finally:
        for hook in hooks:
            hook.remove()


def _zero_elsewhere(forward_without_heads):
    """For the generic hint: the hidden case, if any, where the answer equals zero-ablation."""
    for model, ids, mask, heads in _silence_cases():
        if not heads:
            continue
        try:
            got = np.asarray(forward_without_heads(model, ids.clone(), mask.clone(), list(heads)))
        except Exception:  # noqa: BLE001 (the failing case already gave its hint)
            continue
        real = mask.numpy()
        zero = _silenced(model, ids, mask, heads, "zero")[real]
        if got.shape[:2] == tuple(ids.shape) and _close(got[real], zero):
            return (f"; on the case silencing {list(heads)} it equals zero-ablation: did you write "
                    f"zeros instead of the clean-run mean?")
    return ""


@_checker
def check_silenced_heads(forward_without_heads):
    """``forward_without_heads(model, ids, mask, heads)`` -> the last hidden states
    ``(B, T, d_model)`` of a ``MiniLM`` in which each ``(layer, head)`` of ``heads`` is
    mean-ablated: its ``head_dim`` features of the concatenated head outputs, on their way into
    ``out_proj``, replaced by their mean over the real tokens of all B sentences in a clean run
    of the same batch (no head silenced). ids ``(B, T)``, mask ``(B, T)`` bool (True = real
    token). Compared at the real tokens. The model must be unchanged afterwards."""
    for model, ids, mask, heads in _silence_cases():
        before = {k: v.clone() for k, v in model.state_dict().items()}
        got = _call(forward_without_heads, model, ids.clone(), mask.clone(), list(heads),
                    name="forward_without_heads",
                    on_error="hint: model.layers[layer].attention.out_proj is the nn.Linear "
                             "that receives the heads side by side")
        if any(not torch.equal(before[k], v) for k, v in model.state_dict().items()):
            raise _Wrong("your function left the model's weights changed: restore every weight "
                         "you change (or replace the heads' outputs with a forward pre-hook on "
                         "out_proj and remove it), or the next call starts from a damaged model")
        got = _arr(got, "the hidden states")
        B, T = ids.shape
        _shape(got, (B, T, model.d_model), "the hidden states",
               "(B, T, d_model): the last layer's output at every position, before any pooling")
        real = mask.numpy()
        got = got[real]

        def ref_of(hs=heads, how="mean", model_mask=True, case=(model, ids, mask, real)):
            m, i, k, r = case
            return _silenced(m, i, k, hs, how, model_mask)[r]

        ref = ref_of()
        if _close(got, ref):
            continue
        swapped = [(h, l) for l, h in heads]
        _diagnose(got, [
            ("nothing was silenced: your output is the plain model's", ref_of([])),
            ("that is zero-ablation: replace the heads' features by their mean over the real "
             "tokens, not by zero", ref_of(how="zero")),
            ("you zeroed the head's rows of W_value.weight, but W_value.bias stays, so the head "
             "still outputs that bias (and zeros would be zero-ablation): replace the head's "
             "features by their clean-run mean over the real tokens",
             ref_of(how="value bias")),
            ("that is zero-ablation, and the padding mask was dropped: replace the heads' features "
             "by their clean-run mean over the real tokens, and pass mask to the model",
             ref_of(how="zero", model_mask=False)),
            ("your mean includes the [PAD] positions: average over the real tokens only "
             "(the mask)", ref_of(how="pad")),
            ("you took each sentence's own mean: average over the real tokens of all sentences "
             "together", ref_of(how="sentence")),
            ("heads are (layer, head) pairs: you read them as (head, layer)",
             ref_of(swapped) if all(h < model.num_layers for h in (h for _, h in heads)) else None),
            ("your means were taken in the ablated run itself: a later layer's mean then already "
             "reflects the heads silenced in earlier layers. Take every mean from one clean run "
             "of the same batch (no head silenced), then run again with the heads replaced",
             ref_of(how="same pass") if len({l for l, _ in heads}) > 1 else None),
            ("the padding mask was dropped: pass mask to the model as usual",
             ref_of(model_mask=False)),
            ("only one head per layer was silenced: a dict {layer: head} keeps just the last head "
             "of each layer; keep every pair (a list, or a dict of lists)",
             ref_of(list(dict(heads).items())) if len(dict(heads)) < len(heads) else None),
            ("only the last (layer, head) of the list was silenced",
             ref_of(heads[-1:]) if len(heads) > 1 else None),
            ("every layer lost the head index of the LAST pair: a function (lambda or def) made in "
             "a loop sees the loop variable's final value; bind it as a default argument "
             "(def hook(module, args, head=head))",
             ref_of([(l, heads[-1][1]) for l, _ in heads]) if heads else None),
        ])
        raise _Wrong(f"the hidden states differ from the mean-ablated model's by up to "
                     f"{_maxdiff(got, ref)}" + _zero_elsewhere(forward_without_heads))
    return ("each listed head's output is its clean-run mean over the real tokens, every other "
            "head and out_proj's bias are untouched, and the model is unchanged afterwards.")


# --------------------------------------------------------------------------------------------
# The predictions of 9.2 and 9.3, measured on the real model by the checkers themselves
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _minilm_measurements() -> dict:
    """On the six reference sentences (section 7): the best head's punctuation score and a uniform
    head's, and the mean 1 - cos of the sentence embeddings with the 10 heads of highest and of
    lowest [CLS] score silenced."""
    import torch.nn.functional as F

    from shared.pretrained import REFERENCE_SENTENCES, load_minilm, mean_pool, tokenize

    model = load_minilm()
    ids, mask, toks = tokenize(list(REFERENCE_SENTENCES), model.tokenizer)
    with torch.no_grad():
        weights = torch.stack(model(ids, mask, return_all=True).weights, dim=1).double().numpy()
    lengths = mask.sum(1).tolist()
    punct = np.mean([_punct_reference(weights[b, :, :, :n, :n], toks[b][:n])
                     for b, n in enumerate(lengths)], axis=0)  # (layer, head)
    punct_padded = np.mean([_punct_reference(weights[b], toks[b]) for b in range(len(lengths))],
                           axis=0)  # the mistake: [PAD] queries averaged in
    uniform = np.mean([_punct_reference(np.full((n, n), 1.0 / n), toks[b][:n])
                       for b, n in enumerate(lengths)])
    cls = np.mean([weights[b, :, :, :n, 0].mean(-1) for b, n in enumerate(lengths)], axis=0)
    num_heads = cls.shape[1]
    order = np.argsort(-cls.flatten(), kind="stable").tolist()

    def embed(heads):
        with torch.no_grad():
            hidden = torch.from_numpy(_silenced(model, ids, mask, list(heads)))
        return F.normalize(mean_pool(hidden, mask), dim=-1)

    base = embed([])

    def change_of(heads):
        return float((1 - (embed(list(heads)) * base).sum(-1)).mean())

    def change_with(forward_without_heads, heads):  # the learner's function on the same batch
        def emb(hs):
            with torch.no_grad():
                hidden = _call(forward_without_heads, model, ids.clone(), mask.clone(), list(hs),
                               name="forward_without_heads")
            hidden = torch.as_tensor(_arr(hidden, "the hidden states"))
            return F.normalize(mean_pool(hidden, mask), dim=-1)

        return float((1 - (emb(heads) * emb([])).sum(-1)).mean())

    change = {label: float((1 - (embed([divmod(i, num_heads) for i in picked]) * base).sum(-1))
                           .mean())
              for label, picked in (("highest", order[:10]), ("lowest", order[-10:]))}
    best = int(punct.argmax())
    return {"best head": float(punct.flatten()[best]), "best": divmod(best, num_heads),
            "punct": punct, "punct padded": punct_padded, "punct first": _punct_reference(
                weights[0, :, :, :lengths[0], :lengths[0]], toks[0][:lengths[0]]),
            "uniform head": float(uniform), "change": change,
            "uniform counts": ([sum(_is_punct(t) for t in toks[b][:n])
                                for b, n in enumerate(lengths)], lengths, ids.shape[1]),
            "change_of": change_of, "change_with": change_with,
            "named": {"highest": [divmod(i, num_heads) for i in order[:10]],
                      "lowest": [divmod(i, num_heads) for i in order[-10:]]}}


class _Missed(Exception):
    """A committed prediction that the measurement does not bear out; ``args[0]`` is the line to
    print: the guess, and what the gap teaches, without the measured number."""


def _prediction_checker(body):
    """``_checker`` for a prediction. A blank guess is "not attempted yet", a malformed one "not
    quite" (``_Wrong``), a guess the measurement bears out "correct!". A guess that misses is no
    mistake: the body raises ``_Missed(line)`` and the check passes (the prediction was made) with
    ``line``, which starts with "recorded:", never with "correct!" or "not quite". Neither says the
    measured number where a later step of the exercise measures it (9.2, 9.4); 9.3b's second call
    adds it once the learner's own measurement is checked."""
    missed = []

    def guarded(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except _Missed as e:
            missed.append(e.args[0])
            return None

    checked = _checker(guarded)

    @functools.wraps(body)
    def run(*args, **kwargs) -> CheckResult:
        missed.clear()
        with contextlib.redirect_stdout(io.StringIO()):
            result = checked(*args, **kwargs)
        message = missed[0] if missed and result.passed else result.message
        print(message)
        return CheckResult(result.passed, message)

    return run


_GUESS_TOL = 0.05  # a guess of the best head within 0.05 of its measured score is borne out
_UNIFORM_TOL = 0.01  # the uniform head's score follows from counting tokens: within 0.01
_GUESS_KEYS = ("best head", "uniform head")


def _valid_guess(my_guess) -> bool:
    """Whether ``my_guess`` is a filled-in, well-formed punctuation guess."""
    return (isinstance(my_guess, dict) and set(my_guess) == set(_GUESS_KEYS)
            and all(isinstance(my_guess[k], numbers.Real) and not isinstance(my_guess[k], bool)
                    and 0 <= my_guess[k] <= 1 for k in _GUESS_KEYS))


def _uniform_mistake(guess, punct, real, padded_len):
    """The hint for a uniform-head guess off by more than 0.01: the counting mistake it matches
    (each computed from the six sentences' punctuation and real token counts and their padded
    length), named without the count; the two closest mistakes differ by 0.0016, hence 0.0008."""
    punct, real = np.array(punct, dtype=float), np.array(real, dtype=float)
    mistakes = [
        (np.mean(punct / (real - 2)), 0.0008, "[CLS] and [SEP] count in n: they are real tokens "
         "a uniform head attends to"),
        (punct.sum() / real.sum(), 0.0008, "average the six sentences' shares, not the tokens of "
         "all six pooled"),
        (np.mean(punct / padded_len), 0.003, "[PAD] does not count in n: the scores use each "
         "sentence's real tokens only"),
        (np.mean((punct / real)[punct > 0]), 0.003, "the two sentences without punctuation "
         "count too, at 0"),
    ]
    for value, tol, hint in mistakes:
        if abs(guess - value) < tol:
            return "the uniform head is off by more than 0.01: " + hint
    return ("the uniform head is off by more than 0.01, and it is exact: in each sentence it "
            "scores the share of punctuation tokens; count them in toks_s")


@_prediction_checker
def check_punctuation_guess(my_guess):
    """``my_guess``: ``{"best head": x, "uniform head": y}``, predicted punctuation scores (0 to 1)
    on the six reference sentences. Graded against the model (borne out within 0.05 for the best
    head, within 0.01 for the uniform head, whose score follows from counting tokens;
    one further off gets the reasoning that closes the gap, in words); the measured scores are
    shown by ``check_punctuation_head``, once the learner has measured them."""
    if not isinstance(my_guess, dict) or set(my_guess) != set(_GUESS_KEYS):
        raise _Wrong('my_guess must be a dict with the keys "best head" and "uniform head", e.g. '
                     f'{{"best head": 0.5, "uniform head": 0.1}}; got {my_guess!r}')
    if any(my_guess[k] is None for k in _GUESS_KEYS):
        raise _NotAttempted("write a number between 0 and 1 for both heads in my_guess; it is "
                            "graded once both are filled in")
    for k in _GUESS_KEYS:
        v = my_guess[k]
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= 1:
            raise _Wrong(f"a score is a number between 0 and 1; got {v!r} for {k!r}")
    m = _minilm_measurements()
    hints = []
    if abs(my_guess["uniform head"] - m["uniform head"]) > _UNIFORM_TOL:
        hints.append(_uniform_mistake(my_guess["uniform head"], *m["uniform counts"]))
    if abs(my_guess["best head"] - m["best head"]) > _GUESS_TOL:
        hints.append("the best head is too high by more than 0.05: no head here comes near the "
                     "[CLS] heads' 0.9" if my_guess["best head"] > m["best head"] else
                     "the best head is too low by more than 0.05: some head does prefer "
                     "punctuation, more than a uniform head")
    shown = (f"you guessed {my_guess['best head']:g} for the best head and "
             f"{my_guess['uniform head']:g} for a uniform head")
    if hints:
        raise _Missed(f"recorded: {shown}. What closes the gap: " + "; ".join(hints)
                      + ". Now find the head: check_punctuation_head shows the measured scores.")
    return (f"{shown}: the uniform head within 0.01, the best head within 0.05 of the model. "
            "Now find the head: check_punctuation_head "
            "shows the measured scores.")


@_checker
def check_punctuation_head(punct_scores, best_head=None, my_guess=None):
    """``punct_scores``: ``(6, 12)``, the learner's ``punctuation_score`` on each of the six
    reference sentences (``weights_s``, ``toks_s``, real tokens only), averaged over them;
    ``best_head``: the ``(layer, head)`` with the highest score. Graded against the model; once
    right, the measured scores are shown next to ``my_guess`` (from ``check_punctuation_guess``)."""
    if punct_scores is None:
        raise _NotAttempted("fill in punct_scores (and best_head); the head is named once they "
                            "are")
    m = _minilm_measurements()
    ref = m["punct"]
    got = _arr(punct_scores, "punct_scores")
    if got.ndim == 3:
        raise _Wrong(f"punct_scores has shape {got.shape}: one (6, 12) map per sentence; average "
                     "them over the six sentences (dim 0)")
    _shape(got, ref.shape, "punct_scores", "(layer, head): one score per head")
    if not _close(got, ref, atol=1e-4):
        _diagnose(got, [
            ("the [PAD] queries were averaged in: score each sentence on its n real tokens only "
             "(weights_s[b, :, :, :n, :n] and toks_s[b][:n], n = mask_s[b].sum())",
             m["punct padded"]),
            ("you added the six sentences' scores: average them, so that a score stays between "
             "0 and 1", 6 * ref),
            ("that is the first sentence alone: average over all six", m["punct first"]),
        ], atol=1e-4)
        raise _Wrong(f"punct_scores differs from the model's by up to {_maxdiff(got, ref)}: "
                     "punctuation_score on each sentence's real tokens, then the mean over the "
                     "six sentences")
    if best_head is None:
        raise _NotAttempted("punct_scores is right; now write the (layer, head) with the highest "
                            "score in best_head")
    num_heads = ref.shape[1]
    if isinstance(best_head, numbers.Integral) and not isinstance(best_head, bool):
        raise _Wrong(f"best_head is a flat index ({best_head}): give a (layer, head) pair, "
                     "divmod(index, 12)")
    try:
        layer, head = (int(v) for v in best_head)
    except (TypeError, ValueError):
        raise _Wrong(f"best_head must be a (layer, head) pair of integers; got {best_head!r}") \
            from None
    best = m["best"]
    if (layer, head) == best:
        runner_up = float(np.sort(ref.flatten())[-2])
        guessed = (f" (you guessed {my_guess['best head']:g} and {my_guess['uniform head']:g})"
                   if _valid_guess(my_guess) else "")
        return (f"layer {layer}, head {head} scores {ref[layer, head]:.3f}, the next best "
                f"{runner_up:.3f}, a uniform head {m['uniform head']:.3f}{guessed}: about twice "
                "uniform, far from the [CLS] heads' 0.9. MiniLM has no strong punctuation head.")
    if (head, layer) == best:
        raise _Wrong(f"best_head {best_head!r} reads as (head, layer): write (layer, head)")
    if not (0 <= layer < ref.shape[0] and 0 <= head < num_heads):
        raise _Wrong(f"best_head {best_head!r} is outside the 6 layers x 12 heads")
    raise _Wrong(f"layer {layer}, head {head} scores {ref[layer, head]:.3f}, not the highest of "
                 "punct_scores: take the argmax over all 72 heads "
                 "(divmod(int(punct_scores.argmax()), 12))")


def _one_of(answer, name: str, options: tuple) -> None:
    """A prediction that is one of ``options`` (strings): not attempted while None, else a clear
    error naming what arrived."""
    choices = " or ".join(f'"{o}"' for o in options)
    if answer is None:
        raise _NotAttempted(f"write {choices} in {name}; it is graded once it is filled in")
    if not isinstance(answer, str):
        raise _Wrong(f"{name} is one string, {choices}; got {type(answer).__name__} {answer!r}")
    if answer not in options:
        raise _Wrong(f"{name} must be {choices}; got {answer!r}")


_RATIO_FACTOR = 2.0  # a guessed ratio within a factor of 2 of the measured one is borne out


_UNSET = object()  # check_silencing_prediction called without a measurement: grade the guess only


def _changes_of(changes, name: str) -> dict:
    """``{"highest": x, "lowest": y}`` -> floats, or a hint naming what arrived instead."""
    if not isinstance(changes, dict) or set(changes) != {"highest", "lowest"}:
        raise _Wrong(f'{name} must be a dict {{"highest": x, "lowest": y}}; got {changes!r}')
    if any(v is None for v in changes.values()):
        raise _NotAttempted(f"fill in both changes of {name}")
    try:
        return {k: float(v) for k, v in changes.items()}
    except (TypeError, ValueError):
        raise _Wrong(f"each change in {name} is one number, the mean of 1 - cos over the six "
                     f"sentences; got {changes!r}") from None


def _measurement_hint(got: dict, ref: dict) -> str:
    """The mistake that explains a wrong (highest, lowest) pair of changes, or a plain pointer."""
    def near(a, b):
        return abs(a - b) <= 1e-4 + 0.01 * abs(b)

    g, r = (got["highest"], got["lowest"]), (ref["highest"], ref["lowest"])
    for hint, expected in (
            ("your highest and lowest sets are swapped: argsort(descending=True)[:10] of the [CLS] "
             "scores gives the 10 highest", r[::-1]),
            ("that is the cosine itself; the change is 1 - cos", (1 - r[0], 1 - r[1])),
            ("you summed 1 - cos over the six sentences; take the mean", (6 * r[0], 6 * r[1]))):
        if near(g[0], expected[0]) and near(g[1], expected[1]):
            return hint
    return ("those are not the model's changes: silence the 10 heads with the highest and the 10 "
            "with the lowest scores['[CLS]'] (section 7), and compare each sentence's unit-length "
            "mean-pooled embedding (mask_s) with its clean one")


@_prediction_checker
def check_silencing_prediction(my_silencing_guess, silencing_changes=_UNSET,
                               forward_without_heads=None):
    """``my_silencing_guess``: a positive number, how many times more the 10 lowest-[CLS] heads
    change the six sentence embeddings (mean 1 - cos) than the 10 highest-[CLS] heads when
    silenced, change(lowest) / change(highest). Borne out within a factor of 2 of the model's
    ratio. Called with the guess alone, it grades it without saying the measured ratio. Called
    again with ``silencing_changes`` ``{"highest": x, "lowest": y}``, the learner's measurement
    with their ``forward_without_heads`` of 9.3a (re-run here on the two sets to tell a wrong
    function from a wrong measurement), it checks the measurement against the model's and only
    then shows the ratio next to the guess."""
    if my_silencing_guess is None:
        raise _NotAttempted("write a number in my_silencing_guess; it is graded once it is "
                            "filled in")
    if not isinstance(my_silencing_guess, numbers.Real) or isinstance(my_silencing_guess, bool):
        raise _Wrong("my_silencing_guess is one number, change(lowest) / change(highest), not a "
                     f"set's name; got {my_silencing_guess!r}")
    if not my_silencing_guess > 0:
        raise _Wrong(f"my_silencing_guess is {my_silencing_guess!r}: a ratio of two changes "
                     "(mean 1 - cos, never negative) is positive")
    meas = _minilm_measurements()
    change = meas["change"]
    measured = ""
    if silencing_changes is not _UNSET:
        if silencing_changes is None:
            raise _NotAttempted('fill in silencing_changes, {"highest": x, "lowest": y}, measured '
                                "with your forward_without_heads; the ratio is shown once it is")
        got = _changes_of(silencing_changes, "silencing_changes")
        if any(abs(got[k] - change[k]) > 1e-4 + 0.01 * change[k] for k in change):
            if forward_without_heads is not None:  # a wrong function, or a wrong measurement?
                theirs = {label: meas["change_with"](forward_without_heads, heads)
                          for label, heads in meas["named"].items()}
                if any(abs(theirs[k] - change[k]) > 1e-4 + 0.01 * change[k] for k in change):
                    raise _Wrong("your forward_without_heads does not silence the heads as the "
                                 "mean-ablated model does: make it pass 9.3a's check first")
            raise _Wrong(_measurement_hint(got, change))
        measured = (f" You measured: ratio {got['lowest'] / got['highest']:.1f} (mean 1 - cos "
                    f"{got['lowest']:.4f} with the lowest set silenced, {got['highest']:.4f} with "
                    "the highest).")
    else:
        measured = " Now measure it (next cell)."
    ratio = change["lowest"] / change["highest"]
    guess = float(my_silencing_guess)
    if guess < 1:
        raise _Missed(f"recorded: you guessed {guess:g}, the highest-[CLS] set mattering more. "
                      "What closes the gap: the lowest-[CLS] set changes the embeddings more, "
                      "as the small [CLS] value vectors of section 7 suggest." + measured)
    if guess < ratio / _RATIO_FACTOR:
        raise _Missed(f"recorded: you guessed {guess:g}; the measured ratio is more than twice "
                      "that. What closes the gap: section 7's value sizes are per head, but a "
                      "silenced head also changes every layer after it, and the two sets come "
                      "from different layers." + measured)
    if guess > ratio * _RATIO_FACTOR:
        raise _Missed(f"recorded: you guessed {guess:g}; the measured ratio is less than half "
                      "that. What closes the gap: the [CLS]-heavy heads still pass on "
                      "something." + measured)
    tail = "" if silencing_changes is _UNSET else (
        " But the two sets come from different layers: before concluding, compare random sets of "
        "10 (9.3c), or heads of the same layers.")
    return f"you guessed {guess:g}, within a factor of 2 of the measured ratio." + measured + tail


_PCT_TOL = 10  # a guessed percentile within 10 points of the learner's measured one is borne out
_PCT_KEYS = ("highest", "lowest")


@_prediction_checker
def check_random_sets(random_sets, random_changes=None, named_changes=None, my_percentiles=None):
    """The fairer test of 9.3. ``random_sets``: at least 100 lists of 10 different ``(layer, head)``
    pairs drawn from all 72 heads; ``random_changes``: for each, the mean over the six sentences of
    1 - cos of the embeddings with those heads silenced; ``named_changes``: ``{"highest": x,
    "lowest": y}``, the same for the two sets of 10 by [CLS] score; ``my_percentiles``:
    ``{"highest": p, "lowest": q}``, committed before the measurement: the % of random sets that
    change the embeddings more than the highest-[CLS] set, and the % that change them less than
    the lowest-[CLS] set. Some values are re-measured on the model; the percentiles are graded
    (within 10 points) on the learner's own random sets: a miss is recorded, not a mistake (the
    percentiles are shown only once the guesses are filled in)."""
    if random_sets is None or random_changes is None:
        raise _NotAttempted("fill in random_sets and random_changes (and named_changes and "
                            "my_percentiles); the percentiles are shown once they are")
    try:
        sets = [[(int(layer), int(head)) for layer, head in s] for s in random_sets]
        changes = [float(c) for c in random_changes]
    except (TypeError, ValueError):
        raise _Wrong("random_sets must be a list of sets, each a list of (layer, head) pairs, and "
                     "random_changes a list of numbers, one per set") from None
    if len(changes) != len(sets):
        raise _Wrong(f"{len(sets)} sets but {len(changes)} values in random_changes: one value "
                     "per set, in the same order")
    if len(sets) < 100:
        raise _Wrong(f"only {len(sets)} random sets: draw at least 100, or a percentile moves by "
                     "several points from one draw to the next")
    for k, s in enumerate(sets):
        if len(set(s)) < len(s):
            raise _Wrong(f"random_sets[{k}] lists a head twice: draw without replacement "
                         "(torch.randperm(72)[:10]), or the set silences fewer than 10 heads")
        if len(s) != 10:
            raise _Wrong(f"random_sets[{k}] has {len(s)} heads: compare like with like, sets of 10 "
                         "as the two named sets")
        bad = [(layer, head) for layer, head in s if not (0 <= layer < 6 and 0 <= head < 12)]
        if bad:
            raise _Wrong(f"random_sets[{k}] holds {bad[0]}: layers run 0..5 and heads 0..11")
    if len({tuple(sorted(s)) for s in sets}) < 10:
        raise _Wrong("most of your random sets are the same set: create the random generator "
                     "once, before the loop, not in each round")
    layers = {layer for s in sets for layer, _ in s}
    if len(layers) < 6 or all(len({layer for layer, _ in s}) == 1 for s in sets):
        raise _Wrong(f"your random sets draw from layers {sorted(layers)} only, or each from one "
                     "layer: draw each set from all 72 heads (divmod(i, 12) for i in "
                     "torch.randperm(72)[:10]), or you compare layers, not sets of heads")
    missing = [(layer, head) for layer in range(6) for head in range(12)
               if all((layer, head) not in s for s in sets)]
    if missing:
        raise _Wrong(f"no random set ever holds {missing[0]}: draw from all 72 heads "
                     "(an index range that stops one short?)")
    if not isinstance(named_changes, dict) or set(named_changes) != {"highest", "lowest"}:
        raise _Wrong('named_changes must be {"highest": ..., "lowest": ...}; got '
                     f"{named_changes!r}")
    if any(named_changes[k] is None for k in named_changes):
        raise _NotAttempted("fill in named_changes, the two named sets measured the same way")
    m = _minilm_measurements()
    true_named = m["change"]
    got_named = {k: float(v) for k, v in named_changes.items()}
    if (abs(got_named["highest"] - true_named["lowest"]) < 1e-4
            and abs(got_named["lowest"] - true_named["highest"]) < 1e-4):
        raise _Wrong("named_changes has the two sets swapped: 'highest' is the set of the 10 heads "
                     "with the highest [CLS] scores")
    for k in ("highest", "lowest"):
        if abs(got_named[k] - true_named[k]) > 1e-4:
            hint = (" (that is cos, not 1 - cos)" if abs(1 - got_named[k] - true_named[k]) < 1e-4
                    else "")
            raise _Wrong(f"named_changes[{k!r}] is {got_named[k]:.4f}, but silencing the 10 "
                         f"{k}-[CLS] heads gives {true_named[k]:.4f}{hint}: the mean over the six "
                         "sentences of 1 - cos(embedding with the heads silenced, without)")
    for k in (0, 1, len(sets) - 1):  # re-measure a few random sets
        true = m["change_of"](sets[k])
        if abs(changes[k] - true) > 1e-4:
            hint = " (that is cos, not 1 - cos)" if abs(1 - changes[k] - true) < 1e-4 else ""
            raise _Wrong(f"random_changes[{k}] is {changes[k]:.4f}, but silencing random_sets[{k}] "
                         f"gives {true:.4f}{hint}: measure each set as the named ones")
    if (not isinstance(my_percentiles, dict) or set(my_percentiles) != set(_PCT_KEYS)
            or any(my_percentiles[k] is None for k in _PCT_KEYS)):
        raise _NotAttempted('write your two guesses in my_percentiles = {"highest": ..., "lowest": '
                            "...} (the cell before this one) first; the percentiles are shown once "
                            "both are filled in")
    guess = my_percentiles
    if not all(isinstance(guess[k], numbers.Real) and not isinstance(guess[k], bool)
               and 0 <= guess[k] <= 100 for k in _PCT_KEYS):
        raise _Wrong("my_percentiles holds two percentages between 0 and 100; got "
                     f"{my_percentiles!r}")
    c = np.array(changes)
    measured = {"highest": 100 * float((c > got_named["highest"]).mean()),  # sets that change more
                "lowest": 100 * float((c < got_named["lowest"]).mean())}  # sets that change less
    shown = (f"silenced, the highest-[CLS] set changes the embeddings by "
             f"{got_named['highest']:.3f} and the lowest-[CLS] set by {got_named['lowest']:.3f} "
             "(mean 1 - cos); "
             f"of your {len(sets)} random sets, {measured['highest']:.1f} % change the "
             "embeddings more than the highest-[CLS] set (you guessed "
             f"{float(guess['highest']):g}) and {measured['lowest']:.1f} % less than the "
             "lowest-[CLS] set (you guessed "
             f"{float(guess['lowest']):g}; median {np.median(c):.3f})")
    off = [k for k in _PCT_KEYS if abs(float(guess[k]) - measured[k]) > _PCT_TOL]
    if off:
        raise _Missed(f"recorded: {' and '.join(off)} more than {_PCT_TOL} points off. What closes "
                      f"the gap: {shown}. The [CLS]-heavy set sits below nearly every random set, "
                      "as section 7's small [CLS] value vectors suggest; random sets still mix "
                      "layers (the solutions compare heads within the same layers).")
    beyond = int((c < got_named["highest"]).sum()), int((c > got_named["lowest"]).sum())
    extreme = ("neither lies beyond every random set" if min(beyond) > 0 else
               "at least one lies beyond every random set")
    return (f"both within {_PCT_TOL} points: {shown}. {beyond[0]} random sets change them less "
            f"than the highest-[CLS] set and {beyond[1]} more than the lowest: {extreme}. But the "
            "gap is partly a layer effect: the two sets come from different layers, and random "
            "sets mix layers. Within each layer the sign agrees: silenced one at a time, heads "
            "with less weight on [CLS] tend to change the embeddings more (the solutions measure "
            "it head by head, and how clear it is).")


# --------------------------------------------------------------------------------------------
# 9.4 Weights or values? Layer 2's heads 1, 3 and 8 at "it", tired run patched from the wide one
# --------------------------------------------------------------------------------------------
_SPLIT_LAYER, _SPLIT_HEADS = 2, (1, 3, 8)


@functools.lru_cache(maxsize=1)
def _split_measurements() -> dict:
    """Shares (vector and lead) restored in the tired run when layer 2's heads 1, 3 and 8 get, at
    "it" only, the wide run's weights (values from the tired run) or values (weights from the
    tired run), or both; and the same measured with the typical mistakes."""
    import torch.nn.functional as F

    from shared.pretrained import load_minilm, tokenize

    model = load_minilm()
    tired = "The animal didn't cross the street because it was too tired."
    ids, mask, toks = tokenize([tired, tired.replace("tired", "wide")], model.tokenizer)
    it, animal, street = (toks[0].index(w) for w in ("it", "animal", "street"))
    with torch.no_grad():
        out = model(ids, mask, return_all=True)
    T = ids.shape[1]

    def head_outputs(layer, weights_from, values_from, values_layer=None):
        """(T, head, head_dim): each query's heads: one run's weights, the other's values."""
        att = model.layers[layer].attention
        x = out.hidden_states[layer if values_layer is None else values_layer][values_from]
        with torch.no_grad():
            v = att.W_value(x).view(T, att.num_heads, att.head_dim)
        return torch.einsum("hqj,jhd->qhd", out.weights[layer][weights_from], v)

    def lead(h):
        return float(F.cosine_similarity(h[it], h[animal], dim=0)
                     - F.cosine_similarity(h[it], h[street], dim=0))

    last = out.hidden_states[-1]
    x_tired, x_wide = last[0, it], last[1, it]
    m_tired, m_wide = lead(last[0]), lead(last[1])

    def shares(weights_from, values_from, layer=_SPLIT_LAYER, positions=(it,), values_layer=None):
        new = head_outputs(layer, weights_from, values_from, values_layer)
        att = model.layers[layer].attention
        pos = list(positions)

        def patch(module, args):
            x = args[0].clone().view(1, T, att.num_heads, att.head_dim)
            for h in _SPLIT_HEADS:
                x[0, pos, h] = new[pos, h]
            return (x.view(1, T, -1),)

        hook = att.out_proj.register_forward_pre_hook(patch)
        try:
            with torch.no_grad():
                h = model(ids[:1])[0]
        finally:
            hook.remove()
        vec = float((h[it] - x_tired) @ (x_wide - x_tired) / (x_wide - x_tired).square().sum())
        return vec, (lead(h) - m_tired) / (m_wide - m_tired)

    def split(**kw):
        (wv, wl), (vv, vl) = shares(1, 0, **kw), shares(0, 1, **kw)
        return {"vector": (wv, vv), "lead": (wl, vl)}

    def mixed(layer, weights_from, values_from, values_layer=None, column=False):
        """(head, head_dim) at "it"; ``column``: the mistake of reading the weights ON "it"."""
        if not column:
            return head_outputs(layer, weights_from, values_from, values_layer)[it]
        att = model.layers[layer].attention
        with torch.no_grad():
            v = att.W_value(out.hidden_states[layer][values_from])
        v = v.view(T, att.num_heads, att.head_dim)
        return torch.einsum("hj,jhd->hd", out.weights[layer][weights_from][:, :, it], v)

    return {"mixed": mixed,
            "right": split(), "both": shares(1, 1), "wrong layer": split(layer=_SPLIT_LAYER + 1),
            "layer output": split(values_layer=_SPLIT_LAYER + 1),
            "all positions": split(positions=range(T))}


_CARRIERS = ("weights", "values")
_CARRIER_TOL = 0.15  # 9.4a: a rough share is enough


@_prediction_checker
def check_carrier_prediction(my_carrier_guess):
    """``my_carrier_guess``: a number, the share of "it"'s change restored when only the value
    vectors of layer 2's heads 1, 3 and 8 come from the wide run (the tired run's weights kept).
    Borne out within 0.15 of the model's share; the measured shares are shown by
    ``check_weights_values_split`` (9.4b), where the learner measures them, never here."""
    if my_carrier_guess is None:
        raise _NotAttempted("write a number in my_carrier_guess; it is graded once it is filled in")
    if not isinstance(my_carrier_guess, numbers.Real) or isinstance(my_carrier_guess, bool):
        raise _Wrong("my_carrier_guess is one number, the share the values alone restore, not "
                     f"the name of a part; got {my_carrier_guess!r}")
    guess = float(my_carrier_guess)
    if not -1 <= guess <= 2:
        raise _Wrong(f"my_carrier_guess is {guess:g}: a share of the change of 'it' is 0 when "
                     "nothing is restored and 1 when all of it is; write a number between those, "
                     "roughly")
    values_share = _split_measurements()["right"]["vector"][1]
    if guess < values_share - _CARRIER_TOL:
        raise _Missed(f"recorded: you guessed {guess:g}; the values alone restore more than that. "
                      "What closes the gap: these heads look at the last word in both sentences, "
                      "so new weights only move a little weight around; what changed is the value "
                      "vectors, above all the last word's. Now measure the split (9.4b).")
    if guess > values_share + _CARRIER_TOL:
        raise _Missed(f"recorded: you guessed {guess:g}; the values alone restore less than that. "
                      "What closes the gap: the three heads keep looking at the last word, so "
                      "what changes is the vector they read there; the heads' whole outputs, "
                      "that vector and the new weights together, restore about half of the change. "
                      "Now measure the split (9.4b).")
    return (f"you guessed {guess:g}, within {_CARRIER_TOL} of the measured share: where these "
            "heads look barely matters here; what they read there does. Now measure the split "
            "(9.4b).")


def _check_mixed_heads(mixed_heads_at_it) -> None:
    """Run the learner's ``mixed_heads_at_it`` on every layer and every (weights, values) pairing
    of the two sentences, against the model's; the typical mistakes are named."""
    _call(mixed_heads_at_it, _SPLIT_LAYER, 1, 0, name="mixed_heads_at_it")  # a stub: not attempted
    m = _split_measurements()
    for layer in range(6):
        for w_from, v_from in ((1, 0), (0, 1), (1, 1), (0, 0)):
            what = f"mixed_heads_at_it({layer}, {w_from}, {v_from})"
            got = _arr(_call(mixed_heads_at_it, layer, w_from, v_from, name="mixed_heads_at_it"),
                       what)
            ref = m["mixed"](layer, w_from, v_from).double().numpy()
            if got.ndim == 3 and got.shape[1:] == ref.shape:
                raise _Wrong(f"{what} has shape {got.shape}: that is every query; return the row "
                             "of 'it' only, (12, 32)")
            _shape(got, ref.shape, what, "(head, head_dim) at 'it'")
            if _close(got, ref, atol=1e-4):
                continue
            later = (m["mixed"](layer, w_from, v_from, values_layer=layer + 1).double().numpy())
            _diagnose(got, [
                (f"{what}: the weights and the values come from swapped sentences: weights_from "
                 "picks the attention weights, values_from the value vectors",
                 m["mixed"](layer, v_from, w_from).double().numpy()),
                (f"{what}: the values come from the layer's output, hidden_states[{layer + 1}]: "
                 f"a layer's values are computed from its input, hidden_states[{layer}]", later),
                (f"{what}: you took the column of 'it' (the weight each query puts ON it): take "
                 "its row, 'it' as the query", m["mixed"](layer, w_from, v_from, column=True)
                 .double().numpy()),
            ], atol=1e-4)
            raise _Wrong(f"{what} differs from the model's head outputs by up to "
                         f"{_maxdiff(got, ref)}: sum over the keys j of weights_p[weights_from, "
                         "layer, head, it, j] times head's value vector v_j, with v = W_value of "
                         "hidden_pair[values_from, layer]")


@_checker
def check_weights_values_split(split, mixed_heads_at_it=None):
    """``split``: ``{"weights": a, "values": b}``, the share (vector) of "it" restored when layer
    2's heads 1, 3 and 8 get, at "it" only, the wide run's attention weights (values from the
    tired run), and the wide run's value vectors (weights from the tired run). Graded against the
    model, with the typical mistakes named. ``mixed_heads_at_it(layer, weights_from, values_from)
    -> (12, 32)``, when given, is tested first, on every layer and pairing."""
    if mixed_heads_at_it is not None:
        _check_mixed_heads(mixed_heads_at_it)
    if split is None:
        raise _NotAttempted('fill in split = {"weights": ..., "values": ...}')
    if not isinstance(split, dict) or set(split) != set(_CARRIERS):
        raise _Wrong(f'split must be a dict {{"weights": a, "values": b}}; got {split!r}')
    if any(split[k] is None for k in _CARRIERS):
        raise _NotAttempted("fill in both shares in split")
    try:
        got = np.array([float(split[k]) for k in _CARRIERS])
    except (TypeError, ValueError):
        raise _Wrong(f"each share is one number; got {split!r}") from None
    m = _split_measurements()
    right = np.array(m["right"]["vector"])
    if _close(got, right, atol=1e-3):
        return (f"weights alone {right[0]:.2f}, values alone {right[1]:.2f}, both "
                f"{m['both'][0]:.2f}: the change travels in the value vectors; the weights of "
                "these heads carry almost none of it.")
    _diagnose(got, [
        ("the two are swapped: 'weights' is the run with the wide run's weights and the tired "
         "run's values", right[::-1]),
        ("that is the share with both weights and values from the wide run, in each entry: "
         "keep one of them from the tired run", np.array([m["both"][0]] * 2)),
        ("the values come from the layer's output, hidden_states[3]: a layer's values are "
         "computed from its input, hidden_states[2]", np.array(m["layer output"]["vector"])),
        ("those are layer 3's heads 1, 3 and 8: patch layer 2 (layers count from 0)",
         np.array(m["wrong layer"]["vector"])),
        ("you patched the heads' outputs at every position: patch them at 'it' only (the "
         "question is what reaches 'it')", np.array(m["all positions"]["vector"])),
    ], atol=1e-3)
    raise _Wrong(f"split is {got.round(3).tolist()}; the model gives other values. Build each "
                 "head's output at 'it' from one run's weights (weights_p[s, 2, :, it]) and the "
                 "other run's value vectors (W_value of hidden_states[2]), and patch only heads 1, "
                 "3 and 8 of layer 2, at 'it'")
