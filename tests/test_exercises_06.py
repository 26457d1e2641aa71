"""The checkers of notebook 06 (shared.exercises.nb06): each accepts a correct answer, says "not
attempted yet" for the shipped stub, and rejects typical wrong answers with the hint that names the
mistake. The answers here are written independently of the checkers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from shared import exercises as ex
from shared.tiny_transformer import (
    TinyTransformer,
    ablate_heads,
    head_contexts,
    repeated_tokens,
    train,
)

NA, OK = "not attempted yet", "correct!"


def stub(*args, **kwargs):
    # TODO: your code here
    return None


# shared by the training experiments: train once, hand out copies -----------------------------
_CACHE: dict = {}


def _trained(key, layers, d, heads, min_p, max_p, steps=300):
    if key not in _CACHE:
        torch.manual_seed(0)
        model = TinyTransformer(27, 21, d_model=d, num_heads=heads, num_layers=layers)
        if steps:
            train(model, steps, min_period=min_p, max_period=max_p, batch_size=48, seed=0)
        _CACHE[key] = model
    return copy.deepcopy(_CACHE[key])


# 6.1 ------------------------------------------------------------------------------------------
def wide_ok():
    return _trained("wide", 1, 64, 4, 4, 12)


def wide_two_layers():  # the architecture is checked first: no need to train it
    return _trained("wide2", 2, 64, 4, 4, 12, steps=0)


def wide_untrained():
    return _trained("wide0", 1, 64, 4, 4, 12, steps=0)


def wide_narrow():
    return _trained("narrow", 1, 32, 2, 4, 12, steps=0)


def wide_with_history():
    return wide_ok(), {"loss": []}


# 6.2 ------------------------------------------------------------------------------------------
def _forward_with(model, tokens, new_context):
    """The model's forward pass where new_context(layer, ctx) may replace a layer's contexts."""
    B, T = tokens.shape
    H, hd = model.num_heads, model.head_dim
    x = model.tok_emb(tokens) + model.pos_emb.weight[:T]
    for l, layer in enumerate(model.layers):
        _, w = layer(x, return_weights=True)
        ctx = new_context(l, w @ layer.W_value(x).view(B, T, H, hd).transpose(1, 2))
        x = x + layer.out_proj(ctx.transpose(1, 2).reshape(B, T, H * hd))
    return model.unembed(x)


def _replacing(model, tokens, heads, mean):
    clean = head_contexts(model, tokens)

    def new_context(l, ctx):
        ctx = ctx.clone()
        for hl, h in heads:
            if hl == l:
                ctx[:, h] = mean(clean[l][:, h])
        return ctx

    with torch.no_grad():
        return _forward_with(model, tokens, new_context)


def pma_ok(model, tokens, heads):
    return _replacing(model, tokens, heads, lambda c: c.mean(dim=0, keepdim=True))


def pma_zero(model, tokens, heads):
    return _replacing(model, tokens, heads, lambda c: torch.zeros_like(c))


def pma_global(model, tokens, heads):
    return _replacing(model, tokens, heads, lambda c: c.mean(dim=(0, 1), keepdim=True))


def pma_per_sequence(model, tokens, heads):
    return _replacing(model, tokens, heads, lambda c: c.mean(dim=1, keepdim=True))


def pma_shared_mean(model, tokens, heads):  # the course's plain mean ablation: global mean
    with torch.no_grad():
        return ablate_heads(model, heads, mean_over=tokens)(tokens)


def pma_sequential(model, tokens, heads):
    def new_context(l, ctx):
        ctx = ctx.clone()
        for hl, h in heads:
            if hl == l:
                ctx[:, h] = ctx[:, h].mean(dim=0, keepdim=True)
        return ctx

    with torch.no_grad():
        return _forward_with(model, tokens, new_context)


def pma_next_head(model, tokens, heads):
    return pma_ok(model, tokens, [(l, (h + 1) % model.num_heads) for l, h in heads])


def pma_nothing(model, tokens, heads):
    with torch.no_grad():
        return model(tokens)


def pma_in_place(model, tokens, heads):
    out = pma_ok(model, tokens, heads)
    with torch.no_grad():
        model.unembed.bias.add_(1.0)
    return out


def pma_returns_model(model, tokens, heads):
    return ablate_heads(model, heads)


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


# 6.4 ------------------------------------------------------------------------------------------
def fixed_ok():
    return _trained("fixed", 2, 32, 2, 10, 10)


def varied():
    return _trained("varied", 2, 32, 2, 4, 12)


def fixed_untrained():
    return _trained("fixed0", 2, 32, 2, 10, 10, steps=0)


C = ex
CASES = [
    # 6.1
    (C.check_one_layer_experiment, (wide_ok, "fails"), True, OK),
    (C.check_one_layer_experiment, (stub, None), None, NA),
    (C.check_one_layer_experiment, (wide_ok, "solves"), False, "K-composition"),
    (C.check_one_layer_experiment, (wide_ok, "maybe"), False, 'set prediction to "solves" or'),
    (C.check_one_layer_experiment, (wide_two_layers, "fails"), False, "num_layers=1"),
    (C.check_one_layer_experiment, (wide_untrained, "fails"), False, "looks untrained"),
    (C.check_one_layer_experiment, (wide_narrow, "fails"), False, "d_model=64, num_heads=4"),
    (C.check_one_layer_experiment, (wide_with_history, "fails"), False, "not a tuple"),
    # 6.2
    (C.check_position_mean_ablation, (pma_ok,), True, OK),
    (C.check_position_mean_ablation, (stub,), None, NA),
    (C.check_position_mean_ablation, (pma_zero,), False, "that is zero ablation"),
    (C.check_position_mean_ablation, (pma_global,), False, "you averaged over the positions too"),
    (C.check_position_mean_ablation, (pma_shared_mean,), False,
     "you averaged over the positions too"),
    (C.check_position_mean_ablation, (pma_per_sequence,), False,
     "positions of each sequence"),
    (C.check_position_mean_ablation, (pma_sequential,), False, "from the unablated model"),
    (C.check_position_mean_ablation, (pma_next_head,), False, "you replaced head 2 of layer 0, not head 1"),
    (C.check_position_mean_ablation, (pma_nothing,), False, "nothing changed"),
    (C.check_position_mean_ablation, (pma_in_place,), False, "the model you were given has"),
    (C.check_position_mean_ablation, (pma_returns_model,), False, "not a model"),
    # 6.3
    (C.check_find_induction_head, (find_ok,), True, OK),
    (C.check_find_induction_head, (find_ok_tensor,), True, OK),
    (C.check_find_induction_head, (stub,), None, NA),
    (C.check_find_induction_head, (find_duplicate,), False, "the key right *after* it"),
    (C.check_find_induction_head, (find_previous,), False, "is a previous-token head"),
    (C.check_find_induction_head, (find_sharpest,), False, "is a previous-token head"),
    (C.check_find_induction_head, (find_scores,), False, "not the scores of all heads"),
    (C.check_find_induction_head, (find_first,), False, "head 0"),
    # 6.4
    (C.check_fixed_period_shortcut, (fixed_ok, [5, 10]), True, OK),
    (C.check_fixed_period_shortcut, (stub, None), None, NA),
    (C.check_fixed_period_shortcut, (fixed_ok, [10]), False, "period 5 works too"),
    (C.check_fixed_period_shortcut, (fixed_ok, [5, 7, 10]), False, "period 7 fails"),
    (C.check_fixed_period_shortcut, (fixed_ok, [5, 10, 12]), False, "period 12 fails"),
    (C.check_fixed_period_shortcut, (fixed_ok, [5]), False, "period 10 works"),
    (C.check_fixed_period_shortcut, (fixed_ok, [5, 10, 11]), False, "pick the periods from"),
    (C.check_fixed_period_shortcut, (varied, [5, 10]), False, "also solves periods 7 and 12"),
    (C.check_fixed_period_shortcut, (fixed_untrained, [5, 10]), False,
     "does not solve period 10"),
    (C.check_fixed_period_shortcut, (wide_ok, [5, 10]), False, "use the notebook's model"),
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


def test_the_experiment_checkers_also_take_the_trained_model(capsys):
    assert ex.check_one_layer_experiment(wide_ok(), "fails").passed is True
    assert ex.check_fixed_period_shortcut(fixed_ok(), [10, 5]).passed is True
    assert ex.check_fixed_period_shortcut(fixed_ok(), (10, 5)).passed is True
    assert ex.check_fixed_period_shortcut(fixed_ok(), 10).passed is False  # period 5 works too
    capsys.readouterr()


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    assert ex.nb06.__all__ == ["check_one_layer_experiment", "check_position_mean_ablation",
                               "check_find_induction_head", "check_fixed_period_shortcut"]
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
    from shared.tiny_transformer import induction_score

    g = torch.Generator().manual_seed(0)
    T = 9
    w = torch.softmax(torch.randn(2, 3, T, T, generator=g).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    tokens = torch.tensor([0, 5, 3, 7, 9, 5, 3, 7, 9])
    assert torch.allclose(_induction_scores(w[0], tokens), induction_score(w[0], tokens))
    torch.manual_seed(0)
    model = TinyTransformer(11, 9, d_model=12, num_heads=3)
    x = repeated_tokens(4, 9, 11, 3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the by-hand forward pass is the model's, and a global mean is the
        assert torch.allclose(_forward_with(model, x, lambda l, c: c), model(x), atol=1e-5)
        assert torch.allclose(pma_global(model, x, [(1, 2)]),  # course's mean ablation
                              ablate_heads(model, [(1, 2)], mean_over=x)(x), atol=1e-5)
        assert torch.allclose(pma_zero(model, x, [(0, 1)]), ablate_heads(model, [(0, 1)])(x),
                              atol=1e-5)


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_position_mean_ablation(pma_ok)
    ex.check_find_induction_head(find_ok)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002
