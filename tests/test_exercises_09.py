"""Notebook 09's checkers: each accepts an independent reference solution, says "not attempted yet"
for the shipped stub, and rejects typical wrong answers with the hint that names the mistake."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from shared import exercises as ex

NA, OK = "not attempted yet", "correct!"


def run(capsys, checker, *answer):
    result = checker(*answer)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, f"expected exactly one line, got: {out!r}"
    return result, out


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


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


def map_swapped_norms(name):
    return map_ok(name, {**PARTS, "attention.output.LayerNorm": "norm2", "output.LayerNorm": "norm1"})


def map_output_dense_as_ff(name):
    return map_ok(name, {**PARTS, "attention.output.dense": "attention.ff_out"})


def map_always_layer0(name):
    return map_ok(name, layer=lambda i: "0")


def map_one_digit(name):
    return map_ok(name, layer=lambda i: i[0])


def map_keeps_pooler(name):
    return name if name.startswith("pooler.") else map_ok(name)


def map_drops_kind(name):
    out = map_ok(name)
    return out if out is None else out.rsplit(".", 1)[0] + ".weight"


def map_ff_swapped(name):
    return map_ok(name, {**PARTS, "intermediate.dense": "ff_out", "output.dense": "ff_in"})


# 9.2 ------------------------------------------------------------------------------------------
def punct_ok(weights, tokens):
    is_punct = torch.tensor([re.fullmatch(r"[^\w]+|_+", t) is not None for t in tokens])
    return weights[..., is_punct].sum(-1).mean(-1)


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
def _fill(scores, allowed, value):
    return scores.masked_fill(~allowed, value)


def pairs(m):
    return m[:, None, :, None] & m[:, None, None, :]


def mask_ok(scores, attention_mask):
    allowed = pairs(attention_mask)  # (B, 1, T, T): query real AND key real
    return torch.softmax(_fill(scores, allowed, float("-inf")), dim=-1).nan_to_num(0.0)


def mask_where(scores, attention_mask):
    allowed = pairs(attention_mask)
    w = torch.softmax(_fill(scores, attention_mask[:, None, None, :], float("-inf")), dim=-1)
    return torch.where(allowed, w, torch.zeros(()))


def mask_nan(scores, attention_mask):
    return torch.softmax(_fill(scores, pairs(attention_mask), float("-inf")), dim=-1)


def mask_keys_only(scores, attention_mask):
    return torch.softmax(_fill(scores, attention_mask[:, None, None, :], float("-inf")), dim=-1)


def mask_finfo_min(scores, attention_mask):
    return torch.softmax(_fill(scores, pairs(attention_mask), torch.finfo(scores.dtype).min), dim=-1)


def mask_queries_only(scores, attention_mask):
    allowed = attention_mask[:, None, :, None].expand_as(scores)
    return torch.softmax(_fill(scores, allowed, float("-inf")), dim=-1).nan_to_num(0.0)


def mask_inverted(scores, attention_mask):
    return mask_ok(scores, ~attention_mask)


def mask_after_softmax(scores, attention_mask):
    return torch.softmax(scores, dim=-1) * pairs(attention_mask)


def mask_zero_fill(scores, attention_mask):
    return torch.softmax(scores * pairs(attention_mask), dim=-1)


C = ex
CASES = [
    (C.check_weight_name, (map_ok,), True, OK),
    (C.check_weight_name, (stub,), None, NA),
    (C.check_weight_name, (stub_raises,), None, NA),
    (C.check_weight_name, (map_swapped_norms,), False, "(norm1)"),
    (C.check_weight_name, (map_output_dense_as_ff,), False, "attention's output projection"),
    (C.check_weight_name, (map_always_layer0,), False, "keep the layer index"),
    (C.check_weight_name, (map_one_digit,), False, "it can have two digits"),
    (C.check_weight_name, (map_keeps_pooler,), False, "return None for them"),
    (C.check_weight_name, (map_drops_kind,), False, "(.weight or .bias)"),
    (C.check_weight_name, (map_ff_swapped,), False, "intermediate.dense is the feed-forward's first"),
    (C.check_punctuation_score, (punct_ok,), True, "known scores"),
    (C.check_punctuation_score, (punct_loop,), True, OK),
    (C.check_punctuation_score, (stub,), None, NA),
    (C.check_punctuation_score, (punct_first_char,), False, "none of its characters"),
    (C.check_punctuation_score, (punct_swapped,), False, "rows are queries"),
    (C.check_punctuation_score, (punct_summed,), False, "average over the queries"),
    (C.check_punctuation_score, (punct_key_mean,), False, "you averaged them"),
    (C.check_punctuation_score, (punct_per_query,), False, "one number per query"),
    (C.check_padding_mask, (mask_ok,), True, OK),
    (C.check_padding_mask, (mask_where,), True, OK),
    (C.check_padding_mask, (stub,), None, NA),
    (C.check_padding_mask, (mask_nan,), False, "contain nan"),
    (C.check_padding_mask, (mask_keys_only,), False, "mask the queries too"),
    (C.check_padding_mask, (mask_finfo_min,), False, "a large negative number"),
    (C.check_padding_mask, (mask_queries_only,), False, "padded keys still get weight"),
    (C.check_padding_mask, (mask_inverted,), False, "the mask is inverted"),
    (C.check_padding_mask, (mask_after_softmax,), False, "without renormalising"),
    (C.check_padding_mask, (mask_zero_fill,), False, "exp(0) = 1"),
]
CHECKERS = ex.nb09.__all__


def _id(case):
    checker, answers, _, _ = case
    return f"{checker.__name__}-{'+'.join(getattr(a, '__name__', repr(a)) for a in answers)}"


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    assert result.passed is expected, out
    assert result == expected and bool(result) is (expected is True)
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    assert CHECKERS == ["check_weight_name", "check_punctuation_score", "check_padding_mask"]
    for name in CHECKERS:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 2, name
        hints = {c[3] for c in CASES if c[0].__name__ == name and c[2] is False}
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
    scores = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    real = torch.tensor([[True, True, False, False], [True, True, True, True]])
    w = mask_ok(scores, real)
    sdpa_like = torch.softmax(scores[0, :, :2, :2], dim=-1)
    assert torch.allclose(w[0, :, :2, :2], sdpa_like) and (w[0, :, 2:] == 0).all()
    assert (w[0, :, :, 2:] == 0).all() and torch.allclose(w[1], torch.softmax(scores[1], -1))


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0)]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)
