"""Notebook 09's checkers: each accepts an independent reference solution, says "not attempted yet"
for the shipped stub, and rejects typical wrong answers with the hint that names the mistake."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shared import exercises as ex
from tests.checker_helpers import NA, OK, case_id, run, stub, stub_raises  # noqa: F401

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

# 9.1 ------------------------------------------------------------------------------------------
PARTS = {
    "attention.self.query": "attention.W_query",
    "attention.self.key": "attention.W_key",
    "attention.self.value": "attention.W_value",
    "attention.output.dense": "attention.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ff_in",
    "output.dense": "ff_out",
    "output.LayerNorm": "norm2",
}
EMBEDDINGS = {
    "embeddings.word_embeddings": "embeddings.token",
    "embeddings.position_embeddings": "embeddings.position",
    "embeddings.token_type_embeddings": "embeddings.segment",
    "embeddings.LayerNorm": "embeddings.norm",
}


def map_ok(name, parts=PARTS, layer=lambda i: i):
    if name.startswith("pooler.") or name == "embeddings.position_ids":
        return None
    stem, kind = name.rsplit(".", 1)
    if stem in EMBEDDINGS:
        return f"{EMBEDDINGS[stem]}.{kind}"
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", stem)
    return f"layers.{layer(m.group(1))}.{parts[m.group(2)]}.{kind}"


REPLACEMENTS = [  # the notebook's tempting str.replace mapper: the shorter part comes first
    ("encoder.layer.", "layers."), ("attention.self.query", "attention.W_query"),
    ("attention.self.key", "attention.W_key"), ("attention.self.value", "attention.W_value"),
    ("output.dense", "ff_out"), ("attention.output.dense", "attention.out_proj"),
    ("intermediate.dense", "ff_in"), ("output.LayerNorm", "norm2"),
    ("attention.output.LayerNorm", "norm1"), ("embeddings.word_embeddings", "embeddings.token"),
    ("embeddings.position_embeddings", "embeddings.position"),
    ("embeddings.token_type_embeddings", "embeddings.segment"),
    ("embeddings.LayerNorm", "embeddings.norm"),
]


def _notebook_replacements(path):
    """The REPLACEMENTS list as a notebook defines it, read from the cell's source (not executed)."""
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        tree = ast.parse("".join(cell["source"])) if cell["cell_type"] == "code" else None
        for node in tree.body if tree else ():
            if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["REPLACEMENTS"]:
                return [tuple(pair) for pair in ast.literal_eval(node.value)]
    raise AssertionError(f"no REPLACEMENTS in {path}")


@pytest.mark.parametrize("path", [NOTEBOOKS / "09_inside_a_pretrained_model.ipynb",
                                  NOTEBOOKS / "solutions" / "09_inside_a_pretrained_model_solutions.ipynb"],
                         ids=["notebook", "solutions"])
def test_replacements_are_the_notebooks(path):
    """The checker of 9.1 and these tests grade the very mapper the notebooks show: one list, no drift."""
    from shared.exercises import nb09

    assert _notebook_replacements(path) == list(nb09._REPLACEMENTS) == REPLACEMENTS


def map_by_replace(name, replacements=REPLACEMENTS):
    if name.startswith("pooler.") or name == "embeddings.position_ids":
        return None
    for theirs, ours in replacements:
        name = name.replace(theirs, ours)
    return name


def split_ok(weight, bias):  # the solution: three column blocks, each transposed
    q, k, v = weight.chunk(3, dim=1)
    bq, bk, bv = bias.chunk(3)
    return {"W_query.weight": q.T, "W_query.bias": bq, "W_key.weight": k.T, "W_key.bias": bk,
            "W_value.weight": v.T, "W_value.bias": bv}


def split_via_linear(weight, bias):  # independent: an nn.Linear of 3 d_out outputs, then its rows
    d = weight.shape[1] // 3
    full = weight.T  # (3 d_out, d_in), nn.Linear's layout of the whole projection
    return {f"{n}.{kind}": (full if kind == "weight" else bias)[i * d:(i + 1) * d]
            for i, n in enumerate(("W_query", "W_key", "W_value")) for kind in ("weight", "bias")}


def split_no_transpose(weight, bias):
    return {k: (v.T if k.endswith("weight") else v) for k, v in split_ok(weight, bias).items()}


def split_interleaved(weight, bias):
    out = {}
    for i, n in enumerate(("W_query", "W_key", "W_value")):
        out[f"{n}.weight"], out[f"{n}.bias"] = weight[:, i::3].T, bias[i::3]
    return out


def split_kqv(weight, bias):
    r = split_ok(weight, bias)
    return {**r, "W_query.weight": r["W_key.weight"], "W_query.bias": r["W_key.bias"],
            "W_key.weight": r["W_query.weight"], "W_key.bias": r["W_query.bias"]}


def split_whole_bias(weight, bias):
    return {**split_ok(weight, bias), "W_query.bias": bias}


def split_tuple(weight, bias):
    return tuple(split_ok(weight, bias).values())


def split_rows(weight, bias):  # blocks of rows of the fused tensor: the wrong axis
    d = weight.shape[0] // 3 or 1
    r = split_ok(weight, bias)
    return {**r, "W_query.weight": weight[:d]}


# 9.2 ------------------------------------------------------------------------------------------
def punct_ok(weights, tokens):
    is_punct = torch.tensor([re.fullmatch(r"[^\w]+|_+", t) is not None for t in tokens])
    return weights[..., is_punct].sum(-1).mean(-1)


@functools.lru_cache(maxsize=1)
def _model_punct():
    """An independent measurement for 9.2's last step: the reference scorer above on the model's
    weights, per sentence, on the real tokens and on all T (padding included)."""
    from shared.pretrained import REFERENCE_SENTENCES, load_minilm, tokenize

    model = load_minilm()
    ids, mask, toks = tokenize(list(REFERENCE_SENTENCES), model.tokenizer)
    with torch.no_grad():
        w = torch.stack(model(ids, mask, return_all=True).weights, dim=1).double()
    real = torch.stack([punct_ok(w[b, :, :, :n, :n], toks[b][:n]) for b, n in enumerate(mask.sum(1).tolist())])
    padded = torch.stack([punct_ok(w[b], toks[b]) for b in range(len(toks))])
    return real.numpy(), padded.numpy()


def punct_ok_scores(padded=False, first=False, per_sentence=False):
    real, with_pad = _model_punct()
    if per_sentence:
        return real
    return real[0] if first else (with_pad if padded else real).mean(0)


def punct_loop(weights, tokens):  # a plain loop over heads, queries and keys
    L, H, n, _ = weights.shape
    out = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            out[layer, head] = sum(float(weights[layer, head, i, j]) for i in range(n) for j in range(n)
                                   if not any(c.isalnum() for c in tokens[j])) / n
    return out


def punct_first_char(weights, tokens):
    is_punct = torch.tensor([not t[0].isalnum() for t in tokens])
    return weights[..., is_punct].sum(-1).mean(-1)


def punct_swapped(weights, tokens):
    return punct_ok(weights.transpose(-1, -2), tokens)


def punct_summed(weights, tokens):
    return punct_ok(weights, tokens) * len(tokens)


def punct_key_mean(weights, tokens):
    is_punct = torch.tensor([not any(c.isalnum() for c in t) for t in tokens])
    return weights[..., is_punct].mean(-1).mean(-1)


def punct_per_query(weights, tokens):
    is_punct = torch.tensor([not any(c.isalnum() for c in t) for t in tokens])
    return weights[..., is_punct].sum(-1)


# 9.3 ------------------------------------------------------------------------------------------
def silence_hook(model, ids, mask, heads, how="mean", model_mask=True):  # the solution: a pre-hook per head
    means = {}  # a clean run first: each layer's out_proj input, averaged
    recorders = []
    for layer in {layer for layer, _ in heads}:
        def record(module, args, layer=layer):
            x = args[0]
            if how == "pad":
                means[layer] = x.flatten(0, 1).mean(0)
            elif how == "sentence":
                means[layer] = torch.stack([x[b, mask[b]].mean(0) for b in range(x.shape[0])])[:, None]
            else:
                means[layer] = x[mask].mean(0)

        recorders.append(model.layers[layer].attention.out_proj.register_forward_pre_hook(record))
    with torch.no_grad():
        model(ids, mask if model_mask else None)
    for h in recorders:
        h.remove()
    hooks = []
    for layer, head in heads:
        att = model.layers[layer].attention
        cols = slice(head * att.head_dim, (head + 1) * att.head_dim)

        def ablate(module, args, cols=cols, layer=layer):
            x = args[0].clone()
            if how == "zero":
                x[..., cols] = 0
            elif how == "same pass":
                x[..., cols] = x[mask][:, cols].mean(0)
            else:
                x[..., cols] = means[layer][..., cols]
            return (x,)

        hooks.append(att.out_proj.register_forward_pre_hook(ablate))
    try:
        with torch.no_grad():
            return model(ids, mask if model_mask else None)
    finally:
        for h in hooks:
            h.remove()


def silence_by_hand(model, ids, mask, heads):
    """Independent: the forward pass written out, each silenced head's context replaced by its
    mean over the real tokens of the batch in a clean pass (a loop over sentences and tokens)."""
    clean = _by_hand_pass(model, ids, mask, [], None)
    return _by_hand_pass(model, ids, mask, heads, clean)


def _by_hand_pass(model, ids, mask, heads, means):
    """One forward pass written out, the listed heads' contexts replaced by ``means``; with
    ``means`` None, the clean pass: it returns each head's mean context over the real tokens."""
    recorded = {}
    with torch.no_grad():
        x = model.embeddings(ids)
        for i, layer in enumerate(model.layers):
            att = layer.attention
            H, d = att.num_heads, att.head_dim
            Q, K, V = (lin(x).unflatten(-1, (H, d)).transpose(1, 2)
                       for lin in (att.W_query, att.W_key, att.W_value))  # (B, H, T, d)
            s = (Q @ K.transpose(-1, -2) / d ** 0.5).masked_fill(~mask[:, None, None, :], float("-inf"))
            ctx = torch.softmax(s, -1) @ V  # (B, H, T, d)
            for h in range(H):
                rows = [ctx[b, h, t] for b in range(ids.shape[0]) for t in range(ids.shape[1]) if mask[b, t]]
                recorded[i, h] = sum(rows) / len(rows)
                if (i, h) in heads:
                    ctx[:, h] = means[i, h]
            ctx = ctx.transpose(1, 2).flatten(2)
            z = layer.norm1(x + att.out_proj(ctx))
            x = layer.norm2(z + layer.ff_out(torch.nn.functional.gelu(layer.ff_in(z))))
        return recorded if means is None else x


def silence_not_restored(model, ids, mask, heads):  # zeroes W_o's columns and leaves them so
    with torch.no_grad():
        for layer, head in heads:
            d = model.layers[layer].attention.head_dim
            model.layers[layer].attention.out_proj.weight[:, d * head:d * (head + 1)] = 0
        return model(ids, mask)


def silence_zero(model, ids, mask, heads):
    return silence_hook(model, ids, mask, heads, "zero")


def silence_zero_values(model, ids, mask, heads):  # zeroes W_value's rows, restored; b_v stays
    saved = {}
    with torch.no_grad():
        for layer, head in heads:
            W = model.layers[layer].attention.W_value.weight
            d = model.layers[layer].attention.head_dim
            saved.setdefault(layer, W.clone())
            W[d * head:d * (head + 1)] = 0
        out = model(ids, mask)
        for layer, W in saved.items():
            model.layers[layer].attention.W_value.weight.copy_(W)
    return out


def silence_zero_no_mask(model, ids, mask, heads):  # zero-ablation, and the padding mask dropped
    return silence_hook(model, ids, mask, heads, "zero", model_mask=False)


def silence_zero_late_binding(model, ids, mask, heads):  # zeros, and each hook sees the last head
    return silence_hook(model, ids, mask, [(layer, heads[-1][1]) for layer, _ in heads], "zero")


def silence_pad(model, ids, mask, heads):
    return silence_hook(model, ids, mask, heads, "pad")


def silence_sentence(model, ids, mask, heads):
    return silence_hook(model, ids, mask, heads, "sentence")


def silence_same_pass(model, ids, mask, heads):  # the means taken in the ablated run itself
    return silence_hook(model, ids, mask, heads, "same pass")


def silence_swapped(model, ids, mask, heads):
    return silence_hook(model, ids, mask, [(h, layer) for layer, h in heads])


def silence_no_mask(model, ids, mask, heads):
    return silence_hook(model, ids, mask, heads, model_mask=False)  # the mean still over real tokens


def silence_nothing(model, ids, mask, heads):
    with torch.no_grad():
        return model(ids, mask)


def silence_last_only(model, ids, mask, heads):
    return silence_hook(model, ids, mask, heads[-1:])


def silence_dict(model, ids, mask, heads):
    return silence_hook(model, ids, mask, list(dict(heads).items()))


def silence_late_binding(model, ids, mask, heads):
    means = ex.nb09._head_means(model, ids, mask)  # the clean run's means, right
    hooks = []
    for layer, head in heads:
        att = model.layers[layer].attention

        def ablate(module, args, layer=layer):  # reads `head` when it runs: the loop's last value
            x = args[0].clone()
            cols = slice(head * att.head_dim, (head + 1) * att.head_dim)  # noqa: B023
            x[..., cols] = means[layer][cols]
            return (x,)

        hooks.append(att.out_proj.register_forward_pre_hook(ablate))
    with torch.no_grad():
        out = model(ids, mask)
    for h in hooks:
        h.remove()
    return out


def silence_pooled(model, ids, mask, heads):
    from shared.pretrained import mean_pool

    return mean_pool(silence_hook(model, ids, mask, heads), mask)


C = ex
CASES = [
    (C.check_replace_prediction, ({"attention.output.dense", "attention.output.LayerNorm"},), True,
     "their rules run first"),
    (C.check_replace_prediction, (None,), None, "my_broken_parts"),
    (C.check_replace_prediction, ({"attention.output.dense"},), False,
     "you found 1 of the 2 parts it gets wrong; every part it gets wrong breaks"),
    (C.check_replace_prediction, ({"output.dense", "attention.output.dense"},), False,
     "'output.dense' maps right"),
    (C.check_replace_prediction, (set(),), False, "some parts do go wrong"),
    (C.check_replace_prediction, ({"pooler.dense"},), False, "not one of the 8 layer parts"),
    (C.check_split_qkv, (split_ok,), True, "gives back the file's query, key and value"),
    (C.check_split_qkv, (split_via_linear,), True, OK),
    (C.check_split_qkv, (stub,), None, NA),
    (C.check_split_qkv, (split_no_transpose,), False, "not transposed"),
    (C.check_split_qkv, (split_interleaved,), False, "alternate column by column"),
    (C.check_split_qkv, (split_kqv,), False, "assigned in another order"),
    (C.check_split_qkv, (split_whole_bias,), False, "the whole fused bias"),
    (C.check_split_qkv, (split_tuple,), False, "return a dict with the six keys"),
    (C.check_split_qkv, (split_rows,), False, "has shape"),
    (C.check_punctuation_score, (punct_ok,), True, "known scores"),
    (C.check_punctuation_score, (punct_loop,), True, OK),
    (C.check_punctuation_score, (stub,), None, NA),
    (C.check_punctuation_score, (punct_first_char,), False, "none of its characters"),
    (C.check_punctuation_score, (punct_swapped,), False, "rows are queries"),
    (C.check_punctuation_score, (punct_summed,), False, "average over the queries"),
    (C.check_punctuation_score, (punct_key_mean,), False, "you averaged them"),
    (C.check_punctuation_score, (punct_per_query,), False, "one number per query"),
    (C.check_silenced_heads, (silence_hook,), True, OK),
    (C.check_silenced_heads, (stub,), None, NA),
    (C.check_silenced_heads, (silence_not_restored,), False, "left the model's weights changed"),
    (C.check_silenced_heads, (silence_pooled,), False, "before any pooling"),
    (C.check_silenced_heads, (silence_nothing,), False, "nothing was silenced"),
    (C.check_silenced_heads, (silence_zero,), False, "that is zero-ablation"),
    (C.check_silenced_heads, (silence_zero_values,), False, "W_value.bias stays"),
    (C.check_silenced_heads, (silence_zero_no_mask,), False, "zero-ablation, and the padding mask"),
    (C.check_silenced_heads, (silence_zero_late_binding,), False, "did you write zeros instead"),
    (C.check_silenced_heads, (silence_pad,), False, "includes the [PAD] positions"),
    (C.check_silenced_heads, (silence_sentence,), False, "each sentence's own mean"),
    (C.check_silenced_heads, (silence_swapped,), False, "as (head, layer)"),
    (C.check_silenced_heads, (silence_no_mask,), False, "padding mask was dropped"),
    (C.check_silenced_heads, (silence_same_pass,), False, "taken in the ablated run itself"),
    (C.check_silenced_heads, (silence_dict,), False, "a dict {layer: head}"),
    (C.check_silenced_heads, (silence_last_only,), False, "only the last (layer, head)"),
    (C.check_silenced_heads, (silence_late_binding,), False, "bind it as a default argument"),
    # prediction checkers: the right guesses are measured independently in
    # test_prediction_checkers_measure_the_model below
    # a committed prediction that misses passes as "recorded: ..." with the lesson ("miss"); none
    # of them prints the measurement (test_prediction_checkers_do_not_reveal_the_measurement)
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 0.08},), True,
     "the uniform head within 0.01, the best head within 0.05"),
    # the uniform head's score is exact (a count): the typical counting mistakes miss it by > 0.01
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 5 / 56},), "miss",  # [CLS], [SEP] left out of n
     "[CLS] and [SEP] count in n"),
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 0.0625},), "miss",  # n = 16, [PAD] counted
     "[PAD] does not"),
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 5 / 55},), "miss",  # all tokens pooled
     "not the tokens of all six pooled"),
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 0.1125},), "miss",  # sentences without punct. skipped
     "the two sentences without punctuation count too"),
    (C.check_punctuation_guess, ({"best head": None, "uniform head": 0.1},), None, "both heads"),
    (C.check_punctuation_guess, ({"best head": 0.9, "uniform head": 0.075},), "miss",
     "best head is too high"),
    (C.check_punctuation_guess, ({"best head": 0.01, "uniform head": 0.075},), "miss",
     "best head is too low"),
    (C.check_punctuation_guess, ({"best head": 0.15, "uniform head": 0.25},), "miss",
     "share of punctuation tokens"),
    (C.check_punctuation_guess, ({"best": 0.15},), False, "must be a dict"),
    (C.check_punctuation_guess, ({"best head": 15, "uniform head": 0.08},), False, "between 0 and 1"),
    (C.check_punctuation_head, (punct_ok_scores(), (3, 11)), True, "no strong punctuation head"),
    (C.check_punctuation_head, (punct_ok_scores(), (3, 11), {"best head": 0.5, "uniform head": 0.1}), True,
     "(you guessed 0.5 and 0.1)"),
    (C.check_punctuation_head, (None,), None, "best_head"),
    (C.check_punctuation_head, (punct_ok_scores(),), None, "now write the (layer, head)"),
    (C.check_punctuation_head, (punct_ok_scores(padded=True), (3, 11)), False, "[PAD] queries"),
    (C.check_punctuation_head, (6 * punct_ok_scores(), (3, 11)), False, "you added"),
    (C.check_punctuation_head, (punct_ok_scores(first=True), (3, 11)), False, "first sentence alone"),
    (C.check_punctuation_head, (punct_ok_scores(per_sentence=True), (3, 11)), False, "one (6, 12) map per"),
    (C.check_punctuation_head, (punct_ok_scores(), (11, 3)), False, "(head, layer)"),
    (C.check_punctuation_head, (punct_ok_scores(), 47), False, "flat index"),
    (C.check_punctuation_head, (punct_ok_scores(), (0, 4)), False, "not the highest"),
    (C.check_silencing_prediction, (8,), True, "within a factor of 2"),
    (C.check_silencing_prediction, (15,), True, "within a factor of 2"),
    (C.check_silencing_prediction, (None,), None, "my_silencing_guess"),
    (C.check_silencing_prediction, (0.5,), "miss", "the lowest-[CLS] set changes the embeddings more"),
    (C.check_silencing_prediction, (3,), "miss", "more than twice that"),  # section 7's median value sizes
    (C.check_silencing_prediction, (40,), "miss", "less than half that"),
    (C.check_silencing_prediction, ("lowest",), False, "not a set's name"),
    (C.check_silencing_prediction, (-2,), False, "is positive"),
    (C.check_carrier_prediction, (0.35,), True, "what they read there does"),
    (C.check_carrier_prediction, (None,), None, "my_carrier_guess"),
    (C.check_carrier_prediction, (0.1,), "miss", "above all the last word's"),  # a weights-first guess
    (C.check_carrier_prediction, (0.25,), "miss", "more than that"),  # half of the heads' share
    (C.check_carrier_prediction, (0.8,), "miss", "keep looking at the last word"),
    (C.check_carrier_prediction, ("values",), False, "not the name of a part"),
    (C.check_carrier_prediction, (True,), False, "one number"),
    (C.check_carrier_prediction, (3,), False, "between those"),
    (C.check_weights_values_split, (None,), None, NA),
    (C.check_weights_values_split, ({"weights": 0.1, "values": None},), None, "both shares"),
    (C.check_weights_values_split, ({"weights": 0.1},), False, "must be a dict"),
    (C.check_weights_values_split, ({"weights": "a lot", "values": 0.4},), False, "one number"),
]
CHECKERS = [name for name in ex.nb09.__all__ if name.startswith("check_")]  # grade_switch_prediction: section 8, tested below


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[case_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    passed = True if expected == "miss" else expected  # a missed prediction is no mistake ...
    assert result.passed is passed, out
    assert result == passed and bool(result) is (passed is True)
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet",
              "miss": "recorded"}[expected]  # ... it records the guess and prints the lesson
    assert out.startswith(prefix), out
    if expected == "miss":
        assert "you guessed" in out and "What closes the gap" in out, out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    assert CHECKERS == ["check_replace_prediction", "check_split_qkv", "check_punctuation_score", "check_punctuation_guess",
                        "check_punctuation_head", "check_silenced_heads", "check_silencing_prediction", "check_random_sets",
                        "check_carrier_prediction", "check_weights_values_split"]
    cases = CASES + [(ex.check_random_sets, None, expected, phrase) for _, expected, phrase in RANDOM_CASES] + [
        (ex.check_weights_values_split, None, expected, phrase) for _, expected, phrase in SPLIT_CASES]
    for name in CHECKERS:
        results = [c[2] for c in cases if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 2, name
        hints = {c[3] for c in cases if c[0].__name__ == name and c[2] is False}
        assert len(hints) >= 2, name


def test_reference_solutions_agree_with_independent_implementations():
    """The references above against the course's module and the real model's names."""
    from shared.pretrained import hf_to_ours, load_weights

    for name in load_weights():
        assert map_ok(name) == hf_to_ours(name), name
    # the punctuation score by hand: 13 tokens, 3 of them punctuation (' , .)
    tokens = ["[CLS]", "the", "animal", "didn", "'", "t", "cross", ",", "it", "was", "tired", ".", "[SEP]"]
    n = len(tokens)
    uniform = torch.full((1, 1, n, n), 1.0 / n, dtype=torch.float64)
    previous = torch.eye(n, dtype=torch.float64).roll(-1, dims=1)[None, None]  # query i -> key i - 1 ...
    previous[..., 0, :] = 0
    previous[..., 0, 0] = 1  # ... and [CLS] on itself
    assert torch.allclose(punct_ok(uniform, tokens), torch.tensor(3 / 13, dtype=torch.float64))
    assert torch.allclose(punct_ok(previous, tokens), torch.tensor(3 / 13, dtype=torch.float64))  # after ' , .
    w = torch.softmax(torch.randn(2, 3, n, n, dtype=torch.float64), dim=-1)
    assert np.allclose(punct_ok(w, tokens).numpy(), punct_loop(w, tokens))
    # silencing heads: the hook and the weight edit against the forward pass written out by hand
    for model, ids, mask, heads in ex.nb09._silence_cases():
        expected = silence_by_hand(model, ids, mask, heads)
        assert torch.allclose(silence_hook(model, ids, mask, heads), expected, atol=1e-10)
        assert torch.allclose(torch.from_numpy(ex.nb09._silenced(model, ids, mask, heads)), expected,
                              atol=1e-10)
        if heads:  # and silencing changes something
            assert not torch.allclose(silence_nothing(model, ids, mask, heads), expected, atol=1e-4)

def test_prediction_checkers_measure_the_model():
    """The numbers the prediction checkers print, against the notebook's own way of measuring
    them: torch, the solutions' punctuation scorer and a weight edit instead of a hook."""
    import torch.nn.functional as F

    from shared.pretrained import REFERENCE_SENTENCES, load_minilm, mean_pool, tokenize

    m = ex.nb09._minilm_measurements()
    model = load_minilm()
    ids, mask, toks = tokenize(list(REFERENCE_SENTENCES), model.tokenizer)
    with torch.no_grad():
        w = torch.stack(model(ids, mask, return_all=True).weights, dim=1)
    lengths = mask.sum(1).tolist()
    punct = torch.stack([punct_ok(w[b, :, :, :n, :n], toks[b][:n]) for b, n in enumerate(lengths)])
    assert abs(punct.mean(0).max().item() - m["best head"]) < 1e-5
    assert divmod(int(punct.mean(0).argmax()), 12) == m["best"] == (3, 11)  # the head CASES names
    share = [sum(not any(c.isalnum() for c in t) for t in toks[b][:n]) / n for b, n in enumerate(lengths)]
    assert abs(np.mean(share) - m["uniform head"]) < 1e-6  # a uniform head scores the share
    cls = torch.stack([w[b, :, :, :n, 0].mean(-1) for b, n in enumerate(lengths)]).mean(0).flatten()
    base = F.normalize(mean_pool(model(ids, mask), mask), dim=-1)
    for label, picked in (("highest", cls.argsort(descending=True)[:10]), ("lowest", cls.argsort()[:10])):
        heads = [divmod(i, 12) for i in picked.tolist()]
        e = F.normalize(mean_pool(silence_by_hand(model, ids, mask, heads), mask), dim=-1)
        assert abs((1 - (e * base).sum(-1)).mean().item() - m["change"][label]) < 1e-5, label
    assert m["change"]["lowest"] > 5 * m["change"]["highest"]


PREDICTIONS = [  # (checker, guesses right and wrong); the guesses avoid the measured digits
    (C.check_punctuation_guess, [{"best head": 0.17, "uniform head": 0.09}, {"best head": 0.9, "uniform head": 0.3},
                                 {"best head": 0.01, "uniform head": 0.01}]),
    (C.check_carrier_prediction, [0.35, 0.1, 0.8]),
]



UNIFORM_MISTAKES = {  # a typical counting mistake for the uniform head, by hand -> the phrase of its hint
    5 / 56: "[CLS] and [SEP] count in n",  # 0+1+0+2+2+1 over n - 2 = 6, 8, 4, 14, 14, 8, averaged
    5 / 55: "not the tokens of all six pooled",  # 6 of 66 tokens
    6 / 16 / 6: "[PAD] does not",  # every sentence's count over the padded length 16
    0.1125: "the two sentences without punctuation",  # (1/10 + 2/16 + 2/16 + 1/10) / 4
}


@pytest.mark.parametrize("guess", list(UNIFORM_MISTAKES))
def test_uniform_guess_hint_names_only_its_mistake(capsys, guess):
    """Each counting mistake gets the hint that names it, and none of the others' (no recipe)."""
    result, out = run(capsys, C.check_punctuation_guess, {"best head": 0.15, "uniform head": guess})
    assert result.passed is True and out.startswith("recorded"), out
    for other, phrase in UNIFORM_MISTAKES.items():
        assert (phrase in out) is (other == guess), (guess, phrase, out)
    assert "count them in toks_s" not in out, out

def test_prediction_checkers_do_not_reveal_the_measurement(capsys):
    """A prediction checker grades the guess but never prints the number measured in the next step:
    none of the measured values, at 1, 2 or 3 decimals, appears in what it prints. 9.3b's checker
    shows them only when called again with the learner's checked measurement."""
    m, split = ex.nb09._minilm_measurements(), ex.nb09._split_measurements()
    measured = {
        "check_punctuation_guess": [m["best head"], m["uniform head"]],
        "check_silencing_prediction": list(m["change"].values()),
        "check_carrier_prediction": [*split["right"]["vector"], split["both"][0]],
    }
    for checker, guesses in PREDICTIONS:
        for guess in guesses:
            result, out = run(capsys, checker, guess)
            assert result.passed is True, out
            for value in measured[checker.__name__]:
                for digits in (1, 2, 3) if checker is not C.check_punctuation_guess else (2, 3):
                    shown = f"{value:.{digits}f}"
                    assert shown not in out.replace("0.05", "").replace("0.01", ""), (checker.__name__, shown, out)
    # 9.3b's checker shows the measured ratio (and both changes) once the learner's measurement is
    # checked, hit or miss; m["change"] is checked against silence_by_hand (no hooks) in the test above
    ratio = m["change"]["lowest"] / m["change"]["highest"]
    for guess in (8, 0.5, 3, 40):
        result, out = run(capsys, C.check_silencing_prediction, guess)
        assert result.passed is True and "Measured" not in out and f"{ratio:.1f}" not in out, out
        result, out = run(capsys, C.check_silencing_prediction, guess, dict(m["change"]))
        assert result.passed is True, out
        assert f"measured: ratio {ratio:.1f}" in out and all(f"{v:.4f}" in out for v in m["change"].values()), out
    result, out = run(capsys, C.check_silencing_prediction, None)
    assert "Measured" not in out and f"{ratio:.1f}" not in out, out
    # the measuring checkers do show them
    result, out = run(capsys, C.check_punctuation_head, punct_ok_scores(), (3, 11))
    assert f"{m['best head']:.3f}" in out and f"{m['uniform head']:.3f}" in out, out
    result, out = run(capsys, ex.check_random_sets, *_random_answer("ok"))
    assert all(f"{v:.3f}" in out for v in m["change"].values()), out



def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0)]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            if name == "check_silencing_prediction" and answer == 3:
                continue  # a number is a well-formed guess there (graded in CASES)
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_replace_prediction_truth_matches_the_notebooks_mapper():
    """The parts check_replace_prediction calls broken are exactly those that the notebook's
    str.replace mapper (REPLACEMENTS above, as in the notebook) maps differently from map_ok."""
    broken = {part for part in PARTS
              if map_by_replace(f"encoder.layer.7.{part}.bias") != map_ok(f"encoder.layer.7.{part}.bias")}
    assert broken == {"attention.output.dense", "attention.output.LayerNorm"}
    assert set(ex.nb09._broken_parts()) == broken


# 9.3, the fairer test: random sets of 10 heads, measured with the forward pass written out -------
@functools.lru_cache(maxsize=1)
def random_set_data():
    """100 random sets of 10 heads (seed 1), each set's and the two named sets' mean 1 - cos,
    measured independently of the checker (silence_by_hand, no hooks)."""
    import torch.nn.functional as F

    from shared.pretrained import REFERENCE_SENTENCES, load_minilm, mean_pool, tokenize

    model = load_minilm()
    ids, mask, _ = tokenize(list(REFERENCE_SENTENCES), model.tokenizer)

    def embed():
        with torch.no_grad():
            return F.normalize(mean_pool(model(ids, mask), mask), dim=-1)

    base = embed()
    clean = _by_hand_pass(model, ids, mask, [], None)  # the clean run's means, shared by every set

    def change(heads):
        e = F.normalize(mean_pool(_by_hand_pass(model, ids, mask, heads, clean), mask), dim=-1)
        return (1 - (e * base).sum(-1)).mean().item()

    g = torch.Generator().manual_seed(1)
    sets = [[divmod(i, 12) for i in torch.randperm(72, generator=g)[:10].tolist()] for _ in range(100)]
    changes = [change(s) for s in sets]
    with torch.no_grad():
        cls = torch.stack([torch.stack(model(ids[b:b + 1, :n], mask[b:b + 1, :n], return_all=True).weights)
                           [:, 0, :, :, 0].mean(-1) for b, n in enumerate(mask.sum(1).tolist())]).mean(0)
    order = cls.flatten().argsort(descending=True).tolist()
    named = {"highest": change([divmod(i, 12) for i in order[:10]]),
             "lowest": change([divmod(i, 12) for i in order[-10:]])}
    c = np.array(changes)
    truth = {"highest": 100 * (c > named["highest"]).mean(), "lowest": 100 * (c < named["lowest"]).mean()}
    return sets, changes, named, truth


def _random_answer(kind):
    sets, changes, named, truth = random_set_data()
    near = {k: v - 8 if v > 50 else v + 8 for k, v in truth.items()}  # within 10 points
    wrong = {"highest": truth["highest"], "lowest": 50.0}  # the lowest set read as typical
    g = torch.Generator().manual_seed(2)
    return {
        "ok": (sets, changes, named, truth),
        "ok_near": (sets, changes, named, near),
        "stub": (None, None, {"highest": None, "lowest": None}, None),
        "no_conclusion": (sets, changes, named, None),
        "half_conclusion": (sets, changes, named, {"highest": 90, "lowest": None}),
        "wrong_conclusion": (sets, changes, named, wrong),
        "odd_conclusion": (sets, changes, named, {"highest": 0.9, "lowest": 120}),
        "too_few": (sets[:99], changes[:99], named, truth),
        "nine_heads": ([s[:9] for s in sets], changes, named, truth),
        "with_replacement": ([[divmod(i, 12) for i in torch.randint(0, 72, (10,), generator=g).tolist()]
                              for _ in range(100)], changes, named, truth),
        "same_set": ([sets[0]] * 100, changes, named, truth),
        "one_layer": ([[(0, h) for h in s] for s in (torch.randperm(12, generator=g)[:10].tolist()
                                                      for _ in range(100))], changes, named, truth),
        "range_one_short": ([[divmod(i, 12) for i in torch.randperm(71, generator=g)[:10].tolist()]
                             for _ in range(100)], changes, named, truth),
        "cosines": (sets, [1 - c for c in changes], named, truth),
        "swapped": (sets, changes, {"highest": named["lowest"], "lowest": named["highest"]}, truth),
        "length_mismatch": (sets, changes[:-1], named, truth),
    }[kind]


RANDOM_CASES = [
    ("ok", True, "at least one lies beyond every random set"),
    ("ok_near", True, "both within 10 points"),
    ("stub", None, NA),
    ("no_conclusion", None, "my_percentiles"),
    ("half_conclusion", None, "my_percentiles"),
    ("wrong_conclusion", "miss", "lowest more than 10 points off"),
    ("odd_conclusion", False, "two percentages between 0 and 100"),
    ("too_few", False, "only 99 random sets"),
    ("nine_heads", False, "has 9 heads"),
    ("with_replacement", False, "draw without replacement"),
    ("same_set", False, "create the random generator once"),
    ("one_layer", False, "or each from one layer"),
    ("range_one_short", False, "an index range that stops one short"),
    ("cosines", False, "that is cos, not 1 - cos"),
    ("swapped", False, "swapped"),
    ("length_mismatch", False, "one value per set"),
]


@pytest.mark.parametrize("kind, expected, phrase", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_random_sets_checker(capsys, kind, expected, phrase):
    result, out = run(capsys, ex.check_random_sets, *_random_answer(kind))
    assert result.passed is (True if expected == "miss" else expected), out
    assert phrase in out, out
    if expected == "miss":  # a conclusion the sets do not bear out is recorded, not a mistake
        assert out.startswith("recorded:") and "What closes the gap" in out, out


def test_random_sets_both_names_the_layer_effect(capsys):
    """The closing message of right percentiles does not stop at the two sets: their gap is partly a
    difference between layers, which the random sets cannot control for."""
    result, out = run(capsys, ex.check_random_sets, *_random_answer("ok"))
    assert result.passed is True and "partly a layer effect" in out and "Within each layer the sign agrees" in out, out


def test_random_sets_percentiles_far_from_a_cut():
    """On 100 random sets the [CLS]-heavy set lies below nearly all random sets and the
    [CLS]-light set above most (as on the solutions' 200), and 'the lowest set is typical' (50)
    is more than 10 points off: the graded guess has room on both sides."""
    truth = random_set_data()[3]
    assert truth["highest"] >= 95 and 70 <= truth["lowest"] <= 95, truth


# 9.4, weights or values: the split measured by writing layer 2 out by hand (no hooks) ----------
@functools.cache
def split_by_hand(layer=2, all_positions=False, values_layer=None, measure="vector"):
    """(weights share, values share): the tired run with layer `layer`'s heads 1, 3 and 8 given the
    wide run's weights (tired values) or values (tired weights), at "it" (or at every position),
    the attention block of that layer written out from its parameters."""
    import torch.nn.functional as F

    from shared.pretrained import gelu, load_minilm, tokenize

    model = load_minilm()
    tired = "The animal didn't cross the street because it was too tired."
    ids, mask, toks = tokenize([tired, tired.replace("tired", "wide")], model.tokenizer)
    it, animal, street = (toks[0].index(w) for w in ("it", "animal", "street"))
    with torch.no_grad():
        out = model(ids, mask, return_all=True)
        hs = out.hidden_states
        att = model.layers[layer].attention
        x = hs[layer][0]  # (T, 384), the tired run's input of the layer
        T = x.shape[0]
        v_true = att.W_value(x).view(T, 12, 32)  # the tired run's own values, for the unpatched heads
        v_of = [att.W_value(hs[layer if values_layer is None else values_layer][s]).view(T, 12, 32)
                for s in (0, 1)]  # the mistake reads the layer's output instead of its input
        a_of = [out.weights[layer][s] for s in (0, 1)]  # (12, T, T)
        rows = list(range(T)) if all_positions else [it]

        def final(w_from, v_from):
            heads = torch.einsum("hqj,jhd->qhd", a_of[0], v_true).clone()  # the tired run's heads
            mixed = torch.einsum("hqj,jhd->qhd", a_of[w_from], v_of[v_from])
            for q in rows:
                for h in (1, 3, 8):
                    heads[q, h] = mixed[q, h]
            layer_ = model.layers[layer]
            z = layer_.norm1(x + att.out_proj(heads.reshape(T, 384)))
            h_ = layer_.norm2(z + layer_.ff_out(gelu(layer_.ff_in(z))))[None]
            for later in model.layers[layer + 1:]:
                h_, _ = later(h_)
            return h_[0]

        last = hs[-1]

        def lead(h):
            return (F.cosine_similarity(h[it], h[animal], dim=0)
                    - F.cosine_similarity(h[it], h[street], dim=0)).item()

        def share(h):
            if measure == "lead":
                return (lead(h) - lead(last[0])) / (lead(last[1]) - lead(last[0]))
            d = last[1, it] - last[0, it]
            return ((h[it] - last[0, it]) @ d / d.square().sum()).item()

        return share(final(1, 0)), share(final(0, 1))


def _split(kind):
    w, v = split_by_hand()
    return {
        "ok": {"weights": w, "values": v},
        "swapped": {"weights": v, "values": w},
        "layer_output": dict(zip(("weights", "values"), split_by_hand(values_layer=3), strict=True)),
        "layer_3": dict(zip(("weights", "values"), split_by_hand(layer=3), strict=True)),
        "all_positions": dict(zip(("weights", "values"), split_by_hand(all_positions=True), strict=True)),
        "other": {"weights": 0.2, "values": 0.3},
    }[kind]


SPLIT_CASES = [
    ("ok", True, "travels in the value vectors"),
    ("swapped", False, "the two are swapped"),
    ("layer_output", False, "from the layer's output"),
    ("layer_3", False, "layer 3's heads"),
    ("all_positions", False, "at every position"),
    ("other", False, "the model gives other values"),
]


@pytest.mark.parametrize("kind, expected, phrase", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_weights_values_split_checker(capsys, kind, expected, phrase):
    result, out = run(capsys, ex.check_weights_values_split, _split(kind))
    assert result.passed is expected, out
    assert phrase in out, out


def test_weights_values_split_truth():
    """By hand: the values carry the change (about 0.44 of the vector), the weights almost none;
    the carrier prediction checker grades a guess against that hand-derived share."""
    w, v = split_by_hand()
    assert v > 0.4 and abs(w) < 0.05
    m = ex.nb09._split_measurements()
    assert np.allclose(m["right"]["vector"], (w, v), atol=1e-5)
    for guess, borne_out in ((v - 0.14, True), (v + 0.14, True), (v - 0.16, False), (v + 0.16, False)):
        result = ex.check_carrier_prediction(guess)  # a miss is recorded, not borne out
        assert result.passed is True and result.message.startswith("recorded:") is not borne_out, guess


def test_split_qkv_reference_on_the_model():
    """Independent of the checker: MiniLM's layer 0 fused GPT-2 style (x @ W + b, q then k then v),
    split by the reference, computes the same projections as the file's nn.Linear tensors."""
    from shared.pretrained import load_weights

    t = load_weights()
    prefix = "encoder.layer.0.attention.self."
    fused_w = torch.cat([t[prefix + n + ".weight"].T for n in ("query", "key", "value")], dim=1)
    fused_b = torch.cat([t[prefix + n + ".bias"] for n in ("query", "key", "value")])
    x = torch.randn(5, 384, generator=torch.Generator().manual_seed(0))
    qkv = (x @ fused_w + fused_b).chunk(3, dim=-1)
    for i, n in enumerate(("query", "key", "value")):  # the fused projection is the file's three
        assert torch.allclose(torch.nn.functional.linear(x, t[prefix + n + ".weight"], t[prefix + n + ".bias"]),
                              qkv[i], atol=1e-5), n
    back = split_ok(fused_w, fused_b)
    assert all(back[f"{n}.weight"].shape == (384, 384) for n in ("W_query", "W_key", "W_value"))
    for i, name in enumerate(("W_query", "W_key", "W_value")):
        linear = x @ back[f"{name}.weight"].T + back[f"{name}.bias"]
        assert torch.allclose(linear, qkv[i], atol=1e-5), name


# --------------------------------------------------------------------------------------------
# 9.4b mixed_heads_at_it, called by check_weights_values_split on every layer and pairing
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _pair_run():
    """The tired/wide pair through the model, and a hook-free reading of its attention blocks:
    per layer, (sentence, head, T, T) weights recomputed from W_query/W_key of the layer input,
    independent of the checker's use of the model's returned weights."""
    from shared.pretrained import load_minilm, tokenize

    model = load_minilm()
    tired = "The animal didn't cross the street because it was too tired."
    ids, mask, toks = tokenize([tired, tired.replace("tired", "wide")], model.tokenizer)
    it = toks[0].index("it")
    with torch.no_grad():
        hs = model(ids, mask, return_all=True).hidden_states
        weights, values, values_out = [], [], []
        for layer, block in enumerate(model.layers):
            att = block.attention
            x = hs[layer]  # (2, T, 384): the input of the layer
            q, k = (f(x).view(2, -1, 12, 32).transpose(1, 2) for f in (att.W_query, att.W_key))
            weights.append(torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5, dim=-1))  # (2, 12, T, T)
            values.append(att.W_value(x).view(2, -1, 12, 32))  # (2, T, head, 32)
            values_out.append(att.W_value(hs[layer + 1]).view(2, -1, 12, 32))  # the mistake
    return it, weights, values, values_out


def _mixed(kind="ok"):
    it, weights, values, values_out = _pair_run()

    def mixed_heads_at_it(layer, weights_from, values_from):
        if kind == "swapped":
            weights_from, values_from = values_from, weights_from
        v = (values_out if kind == "layer output" else values)[layer][values_from]  # (T, head, 32)
        a = weights[layer][weights_from]  # (head, T, T)
        row = a[:, :, it] if kind == "column" else a[:, it]  # (head, T)
        if kind == "every query":
            return torch.einsum("hqj,jhd->qhd", a, v)
        return torch.einsum("hj,jhd->hd", row, v)

    return mixed_heads_at_it


MIXED_CASES = [
    ("ok", True, "travels in the value vectors"),
    ("swapped", False, "swapped sentences"),
    ("layer output", False, "from the layer's output"),
    ("column", False, "the column of 'it'"),
    ("every query", False, "that is every query"),
]


@pytest.mark.parametrize("kind, expected, phrase", MIXED_CASES, ids=[c[0] for c in MIXED_CASES])
def test_mixed_heads_at_it_is_checked(capsys, kind, expected, phrase):
    result, out = run(capsys, ex.check_weights_values_split, _split("ok"), _mixed(kind))
    assert result.passed is expected, out
    assert phrase in out, out


def test_mixed_heads_stub_is_not_attempted(capsys):
    def mixed_heads_at_it(layer, weights_from, values_from):
        return None  # the notebook's stub

    result, out = run(capsys, ex.check_weights_values_split, None, mixed_heads_at_it)
    assert result.passed is None and "mixed_heads_at_it" in out, out


# Section 8: the graded prediction (a count of right-way wins over the 7 pairs) --------------------
from shared.exercises import grade_switch_prediction  # noqa: E402  (exported like every checker)

# hand-made margins: the right way wins pairs 4, 5 and 6, the wrong way pairs 0 to 3 (pair 1 by a
# hair, 0.0001 against 0.0004): counted by hand, 3 of 7
RIGHT = [0.04, 0.0001, 0.0002, 0.0001, 0.009, 0.014, 0.006]
WRONG = [0.05, 0.0004, 0.005, 0.006, 0.002, 0.010, 0.003]


@pytest.mark.parametrize("guess", [..., None])
def test_switch_prediction_unanswered_says_not_attempted(capsys, guess):
    result = grade_switch_prediction(guess, RIGHT, WRONG)
    out = capsys.readouterr().out
    assert result.passed is None and out.startswith("not attempted yet") and "pred_right_wins" in out, out


@pytest.mark.parametrize("guess", [2, 3, 4])
def test_switch_prediction_within_one_is_borne_out(guess):
    result = grade_switch_prediction(guess, RIGHT, WRONG)
    assert result.passed is True and "right way wins 3 of 7" in result.message


@pytest.mark.parametrize("guess", [6, 7, 5])  # a "heads track the referent" guess
def test_switch_prediction_too_many_names_the_coin(guess):
    result = grade_switch_prediction(guess, RIGHT, WRONG)
    assert result.passed is False
    assert "3 of 7" in result.message and "Fewer than you expected" in result.message and "coin" in result.message


@pytest.mark.parametrize("guess", [0, 1])  # a "the wrong way wins systematically" guess
def test_switch_prediction_too_few_says_more(guess):
    result = grade_switch_prediction(guess, RIGHT, WRONG)
    assert result.passed is False and "More than you expected" in result.message


def test_switch_prediction_counts_from_the_margins():
    # flip the near-tie pair 1: 4 of 7, so 5 is now borne out and 2 is not
    right = list(RIGHT)
    right[1] = 0.0005
    assert grade_switch_prediction(5, right, WRONG).passed is True
    assert grade_switch_prediction(2, right, WRONG).passed is False
    assert grade_switch_prediction(7, [1.0] * 7, [0.0] * 7).passed is True
    assert grade_switch_prediction(0, [0.0] * 7, [1.0] * 7).passed is True


@pytest.mark.parametrize("guess", [3.0, "3", True, 8, -1, "no systematic direction"])
def test_switch_prediction_malformed_guess(guess):
    result = grade_switch_prediction(guess, RIGHT, WRONG)
    assert result.passed is False and "whole number from 0 to 7" in result.message


# 9.3b: the measurement, with the learner's own forward_without_heads -------------------------
def _measured(kind):
    named = random_set_data()[2]  # measured independently of the checker (silence_by_hand)
    h, lo = named["highest"], named["lowest"]
    return {"ok": named, "swapped": {"highest": lo, "lowest": h}, "cos": {"highest": 1 - h, "lowest": 1 - lo},
            "summed": {"highest": 6 * h, "lowest": 6 * lo}, "off": {"highest": 2 * h, "lowest": lo},
            "list": [h, lo], "blank": None}[kind]


MEASURE_CASES = [  # (guess, measurement, forward_without_heads, expected, phrase)
    (8, "ok", None, True, "You measured: ratio 10."),
    (8, "ok", silence_hook, True, "compare random sets of 10"),
    (3, "ok", silence_hook, "miss", "You measured: ratio 10."),
    (8, "blank", silence_hook, None, "fill in silencing_changes"),
    (None, "ok", silence_hook, None, "my_silencing_guess"),
    (8, "off", silence_zero, False, "make it pass 9.3a's check first"),
    (8, "swapped", silence_hook, False, "highest and lowest sets are swapped"),
    (8, "cos", silence_hook, False, "the cosine itself; the change is 1 - cos"),
    (8, "summed", silence_hook, False, "summed 1 - cos over the six sentences"),
    (8, "off", silence_hook, False, "not the model's changes"),
    (8, "list", silence_hook, False, "must be a dict"),
]


@pytest.mark.parametrize("guess, kind, fn, expected, phrase", MEASURE_CASES,
                         ids=[f"{c[0]}-{c[1]}-{getattr(c[2], '__name__', None)}" for c in MEASURE_CASES])
def test_silencing_measurement(capsys, guess, kind, fn, expected, phrase):
    """9.3b's second call: the learner's measurement is checked before the ratio is shown."""
    result, out = run(capsys, ex.check_silencing_prediction, guess, _measured(kind), fn)
    assert result.passed is (True if expected == "miss" else expected), out
    assert phrase in out, out
    assert out.startswith({True: "correct!", False: "not quite:", None: "not attempted yet", "miss": "recorded"}[expected]), out
    assert ("You measured" in out) is (expected in (True, "miss")), out  # the ratio only after a checked measurement


@pytest.mark.parametrize("guess", [8, 3, 40, 0.5])
def test_silencing_guess_alone_keeps_the_ratio_hidden(capsys, guess):
    """Graded before the measurement, the guess gets no measured number back."""
    _, out = run(capsys, ex.check_silencing_prediction, guess)
    assert "Now measure it" in out and not re.search(r"\d\.\d", out.replace(f"{guess:g}", "")), out
