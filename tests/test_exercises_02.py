"""The checker paths of notebook 02 added in its third edition (tests/test_exercises.py keeps the
older ones): each typical wrong answer gets the hint for its mistake. The answers here are written
independently of the checkers, with PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared import exercises as ex
from shared.exercises import nb02


def stub(*args, **kwargs):
    # TODO: your code here
    return None


# 2.5 ------------------------------------------------------------------------------------------
def buggy(X, W_q, W_k, W_v):  # exactly the notebook's attention_buggy
    W_q /= math.sqrt(X.shape[-1])
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    A = torch.softmax(Q @ K.T, dim=0)
    return A @ V


def fixed_ok(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    A = torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)
    return A @ V


def fixed_fold_into_W_q(X, W_q, W_k, W_v):  # the buggy idea done right: a new tensor
    W_q = W_q / math.sqrt(W_k.shape[-1])
    return torch.softmax((X @ W_q) @ (X @ W_k).T, dim=-1) @ (X @ W_v)


def fixed_sdpa_float32(X, W_q, W_k, W_v):
    return F.scaled_dot_product_attention(*((X @ W).float() for W in (W_q, W_k, W_v)))


def fixed_numpy(X, W_q, W_k, W_v):
    X, W_q, W_k, W_v = (t.numpy() for t in (X, W_q, W_k, W_v))
    S = (X @ W_q) @ (X @ W_k).T / np.sqrt(W_k.shape[1])
    A = np.exp(S - S.max(axis=1, keepdims=True))
    return A / A.sum(axis=1, keepdims=True) @ (X @ W_v)


def fixed_in_place_on_scores(X, W_q, W_k, W_v):  # in place, but on its own tensor: fine
    scores = (X @ W_q) @ (X @ W_k).T
    scores /= math.sqrt(W_q.shape[1])
    return torch.softmax(scores, dim=1) @ (X @ W_v)


def with_divisor(divisor_of, dim=-1):
    def attention_fixed(X, W_q, W_k, W_v):
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        return torch.softmax(Q @ K.T / divisor_of(X, K, V), dim=dim) @ V
    return attention_fixed


root_d_k = with_divisor(lambda X, K, V: math.sqrt(K.shape[-1]))
root_d_in = with_divisor(lambda X, K, V: math.sqrt(X.shape[-1]))
root_d_v = with_divisor(lambda X, K, V: math.sqrt(V.shape[-1]))
d_k_no_root = with_divisor(lambda X, K, V: K.shape[-1])
d_in_no_root = with_divisor(lambda X, K, V: X.shape[-1])
root_T = with_divisor(lambda X, K, V: math.sqrt(K.shape[0]))
unscaled = with_divisor(lambda X, K, V: 1.0)
dim0_only = with_divisor(lambda X, K, V: math.sqrt(K.shape[-1]), dim=0)
dim0_and_root_d_in = with_divisor(lambda X, K, V: math.sqrt(X.shape[-1]), dim=0)


def centres_X_in_place(X, W_q, W_k, W_v):
    X -= X.mean(dim=0)
    return fixed_ok(X, W_q, W_k, W_v)


def returns_weights(X, W_q, W_k, W_v):
    Q, K = X @ W_q, X @ W_k
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1)


def transposes_W_v(X, W_q, W_k, W_v):  # raises: (d_v, d_in) does not fit X
    return fixed_ok(X, W_q, W_k, W_v.T)


def forgets_the_values(X, W_q, W_k, W_v):
    A = torch.softmax((X @ W_q) @ (X @ W_k).T / math.sqrt(W_k.shape[-1]), dim=-1)
    return A @ (X @ W_v) + 0.1


@pytest.mark.parametrize("answer", [fixed_ok, fixed_fold_into_W_q, fixed_sdpa_float32,
                                    fixed_numpy, fixed_in_place_on_scores, root_d_k])
def test_bug_fix_accepts(capsys, answer):
    assert ex.check_attention_bug_fix(answer).passed is True, capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (buggy, "changed W_q in place"),
    (centres_X_in_place, "changed X in place"),
    (root_d_in, "sqrt(d_in) = sqrt(7), the width of the embeddings X.shape[-1] (d_model"),
    (root_d_v, "sqrt(d_v) = sqrt(2), the width of the values"),
    (d_k_no_root, "by d_k = 3 itself; divide by its square root"),
    (d_in_no_root, "by d_in = 7; the scale is sqrt(d_k)"),
    (root_T, "sqrt(T) = sqrt(5), the number of tokens"),
    (unscaled, "not scaled at all"),
    (dim0_only, "softmax over dim=0"),
    (returns_weights, "wrong shape (5, 5); expected (5, 2)"),
    (transposes_W_v, "raised RuntimeError"),
    (forgets_the_values, "differs from softmax(Q K^T / sqrt(d_k)) V by up to 0.1000"),
])
def test_bug_fix_hints(capsys, answer, hint):
    result = ex.check_attention_bug_fix(answer)
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out
    assert out.count("\n") == 1


def test_two_bugs_are_both_named(capsys):
    ex.check_attention_bug_fix(dim0_and_root_d_in)
    out = capsys.readouterr().out
    assert "two bugs left" in out and "dim=0" in out and "sqrt(d_in)" in out, out


def test_errors_name_the_inputs(capsys):
    ex.check_attention_bug_fix(transposes_W_v)
    out = capsys.readouterr().out
    assert "X = tensor of shape (5, 7)" in out and "W_v = tensor of shape (7, 2)" in out, out


def test_stub_is_not_attempted(capsys):
    assert ex.check_attention_bug_fix(stub).passed is None
    assert capsys.readouterr().out.startswith("not attempted yet")


def test_hidden_cases_keep_every_mistake_apart():
    """No hidden case may make two different mistakes (or a mistake and the right answer) give
    the same outputs: every scale the hints name, with the softmax over either dim."""
    rng = np.random.default_rng(0)
    for T, d_in, d_k, d_v in ((5, 7, 3, 2), (6, 5, 4, 3), (4, 6, 9, 5)):
        X = torch.tensor(rng.normal(size=(T, d_in)))
        W_q, W_k, W_v = (torch.tensor(rng.normal(size=(d_in, d))) for d in (d_k, d_k, d_v))
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        divisors = [math.sqrt(d_k), math.sqrt(d_in), math.sqrt(d_v), d_k, d_in, math.sqrt(T), 1.0]
        outs = [torch.softmax(Q @ K.T / d, dim=dim) @ V for dim in (-1, 0) for d in divisors]
        for i in range(len(outs)):
            for j in range(i):
                assert (outs[i] - outs[j]).abs().max() > 1e-3, (T, i, j)
    assert len(nb02._scale_mistakes(5, 7, 3, 2)) == len(divisors)


# 2.4: an in-place change of an input is seen ---------------------------------------------------
def perm_centres_in_place(Z, Z_shuffled):
    Z -= Z.mean(axis=0)
    Z_shuffled -= Z_shuffled.mean(axis=0)
    return np.linalg.norm(Z_shuffled[:, None] - Z[None], axis=-1).argmin(axis=1)


def perm_ok(Z, Z_shuffled):
    return np.linalg.norm(Z_shuffled[:, None] - Z[None], axis=-1).argmin(axis=1)


def test_recover_permutation_sees_in_place_changes(capsys):
    assert ex.check_recover_permutation(perm_ok).passed is True
    capsys.readouterr()
    assert ex.check_recover_permutation(perm_centres_in_place).passed is False
    out = capsys.readouterr().out
    assert "changed Z and Z_shuffled in place" in out, out
