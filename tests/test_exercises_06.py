"""The checkers of notebook 06 (shared.exercises.nb06): each accepts a correct answer, says "not
attempted yet" for the shipped stub, and rejects typical wrong answers with the hint that names the
mistake. The answers here are written independently of the checkers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from shared import exercises as ex
from shared.modules import MultiHeadAttention

NA, OK = "not attempted yet", "correct!"


def stub(*args, **kwargs):
    # TODO: your code here
    return None


# 6.1 ------------------------------------------------------------------------------------------
def prev_ok(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def prev_loop(weights):  # slower, same answer
    T = weights.shape[-1]
    return sum(weights[..., i, i - 1] for i in range(1, T)) / (T - 1)


def prev_self(weights):
    return weights.diagonal(dim1=-2, dim2=-1).mean(dim=-1)


def prev_next(weights):
    return weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=-1)


def prev_over_all_rows(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / weights.shape[-1]


def prev_sum(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1)


def prev_default_dims(weights):
    return torch.diagonal(weights, -1).mean(dim=-1)


def prev_one_number(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean()


# 6.2 ------------------------------------------------------------------------------------------
def ablate_ok(mha, head):
    ablated = copy.deepcopy(mha)
    hd = mha.head_dim
    with torch.no_grad():
        ablated.out_proj.weight[:, head * hd:(head + 1) * hd] = 0.0
    return ablated


def ablate_values(mha, head):  # zero values (weight and bias) -> zero context: also right
    ablated = copy.deepcopy(mha)
    rows = slice(head * mha.head_dim, (head + 1) * mha.head_dim)
    with torch.no_grad():
        ablated.W_value.weight[rows] = 0.0
        if ablated.W_value.bias is not None:
            ablated.W_value.bias[rows] = 0.0
    return ablated


def ablate_in_place(mha, head):
    hd = mha.head_dim
    with torch.no_grad():
        mha.out_proj.weight[:, head * hd:(head + 1) * hd] = 0.0
    return mha


def ablate_rows(mha, head):
    ablated = copy.deepcopy(mha)
    hd = mha.head_dim
    with torch.no_grad():
        ablated.out_proj.weight[head * hd:(head + 1) * hd] = 0.0
    return ablated


def ablate_queries(mha, head):
    ablated = copy.deepcopy(mha)
    hd = mha.head_dim
    with torch.no_grad():
        ablated.W_query.weight[head * hd:(head + 1) * hd] = 0.0
    return ablated


def ablate_value_weight_only(mha, head):
    ablated = copy.deepcopy(mha)
    hd = mha.head_dim
    with torch.no_grad():
        ablated.W_value.weight[head * hd:(head + 1) * hd] = 0.0
    return ablated


def ablate_next_head(mha, head):
    return ablate_ok(mha, (head + 1) % mha.num_heads)


def ablate_and_bias(mha, head):
    ablated = ablate_ok(mha, head)
    with torch.no_grad():
        ablated.out_proj.bias.zero_()
    return ablated


def ablate_nothing(mha, head):
    return copy.deepcopy(mha)


def ablate_returns_weights(mha, head):
    return ablate_ok(mha, head).out_proj.weight


# 6.3 ------------------------------------------------------------------------------------------
def _induction_scores(weights, tokens):
    T = len(tokens)
    x = tokens.tolist()
    targets = [[k for k in range(1, i + 1) if x[k - 1] == x[i]] for i in range(T)]
    rows = [i for i in range(T) if targets[i]]
    return torch.stack([sum(weights[h, i, targets[i]].sum() for i in rows) / len(rows)
                        for h in range(weights.shape[0])])


def find_ok(weights, tokens):
    return int(_induction_scores(weights, tokens).argmax())


def find_ok_tensor(weights, tokens):  # a 0-d tensor is accepted as an index
    return _induction_scores(weights, tokens).argmax()


def find_duplicate(weights, tokens):  # attention on the earlier occurrence itself
    T = len(tokens)
    same = (tokens[:, None] == tokens[None, :]) & torch.ones(T, T, dtype=torch.bool).tril(-1)
    return int((weights * same).sum(dim=(-1, -2)).argmax())


def find_previous(weights, tokens):
    return int(weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1).argmax())


def find_sharpest(weights, tokens):
    return int(weights.max(dim=-1).values.mean(dim=-1).argmax())


def find_scores(weights, tokens):
    return _induction_scores(weights, tokens)


def find_first(weights, tokens):
    return 0


C = ex
CASES = [
    # 6.1
    (C.check_previous_token_score, (prev_ok,), True, OK),
    (C.check_previous_token_score, (prev_loop,), True, "a perfect previous-token head scores 1.0"),
    (C.check_previous_token_score, (stub,), None, NA),
    (C.check_previous_token_score, (prev_self,), False, "attention to the query itself"),
    (C.check_previous_token_score, (prev_next,), False, "key i + 1 is the *next* token"),
    (C.check_previous_token_score, (prev_over_all_rows,), False, "query 0 has no previous token"),
    (C.check_previous_token_score, (prev_sum,), False, "average over the queries instead of summing"),
    (C.check_previous_token_score, (prev_default_dims,), False, "dim1=-2, dim2=-1"),
    (C.check_previous_token_score, (prev_one_number,), False, "return one score per head"),
    # 6.2
    (C.check_ablate_head, (ablate_ok,), True, OK),
    (C.check_ablate_head, (ablate_values,), True, OK),
    (C.check_ablate_head, (stub,), None, NA),
    (C.check_ablate_head, (ablate_in_place,), False, "ablate a copy (copy.deepcopy(mha))"),
    (C.check_ablate_head, (ablate_rows,), False, "you zeroed *rows* of out_proj.weight"),
    (C.check_ablate_head, (ablate_queries,), False, "its attention becomes a plain average"),
    (C.check_ablate_head, (ablate_value_weight_only,), False, "value bias is still there"),
    (C.check_ablate_head, (ablate_next_head,), False, "you silenced head 0, not head 1"),
    (C.check_ablate_head, (ablate_and_bias,), False, "out_proj.bias is shared by all heads"),
    (C.check_ablate_head, (ablate_nothing,), False, "nothing changed"),
    (C.check_ablate_head, (ablate_returns_weights,), False, "return the ablated module"),
    # 6.3
    (C.check_find_induction_head, (find_ok,), True, OK),
    (C.check_find_induction_head, (find_ok_tensor,), True, OK),
    (C.check_find_induction_head, (stub,), None, NA),
    (C.check_find_induction_head, (find_duplicate,), False, "the key right *after* it"),
    (C.check_find_induction_head, (find_previous,), False, "is a previous-token head"),
    (C.check_find_induction_head, (find_sharpest,), False, "is a previous-token head"),
    (C.check_find_induction_head, (find_scores,), False, "not the scores of all heads"),
    (C.check_find_induction_head, (find_first,), False, "head 0"),
]


def _id(case):
    checker, answers, _, _ = case
    return f"{checker.__name__}-{'+'.join(getattr(a, '__name__', repr(a)) for a in answers)}"


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result = checker(*answers)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, f"expected exactly one line, got: {out!r}"
    assert result.passed is expected, out
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    assert ex.nb06.__all__ == ["check_previous_token_score", "check_ablate_head",
                               "check_find_induction_head"]
    for name in ex.nb06.__all__:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 2, name


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0), lambda *a, **k: True,
           lambda *a, **k: 1 / 0]
    for name in ex.nb06.__all__:
        checker = getattr(ex, name)
        for answer in odd:
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_the_references_agree_with_the_course_module():
    """The answers above against shared.tiny_transformer (an independent implementation)."""
    from shared.tiny_transformer import ablate_heads, induction_score, previous_token_score

    g = torch.Generator().manual_seed(0)
    T = 9
    w = torch.softmax(torch.randn(2, 3, T, T, generator=g).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    assert torch.allclose(prev_ok(w), previous_token_score(w))
    tokens = torch.tensor([0, 5, 3, 7, 9, 5, 3, 7, 9])
    assert torch.allclose(_induction_scores(w[0], tokens), induction_score(w[0], tokens))
    from shared.tiny_transformer import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(11, 9, d_model=12, num_heads=3)
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        assert torch.allclose(ablate_ok(model.layers[1], 2)(x),
                              ablate_heads(model, [(1, 2)]).layers[1](x))


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_ablate_head(ablate_ok)
    ex.check_previous_token_score(prev_ok)
    ex.check_find_induction_head(find_ok)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002


def test_the_checker_layers_are_the_course_module():
    """check_ablate_head builds shared.modules.MultiHeadAttention layers, as the notebook uses."""
    seen = []

    def spy(mha, head):
        seen.append((type(mha), mha.num_heads, head, mha.W_query.bias is not None))
        return ablate_ok(mha, head)

    ex.check_ablate_head(spy)
    assert [s[0] for s in seen] == [MultiHeadAttention] * 3
    assert [s[3] for s in seen] == [False, True, True]  # with and without projection biases
