"""Notebook 10's checkers: each accepts an independent reference solution, says "not attempted yet"
for the shipped stub, and rejects typical wrong answers with the hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch

from shared.exercises import nb10 as ex

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


@pytest.mark.parametrize("checker", [ex.check_temperature_grad, ex.check_bias_grads,
                                     ex.check_fixed_backward, ex.check_attention_saved_bytes])
@pytest.mark.parametrize("answer", [stub, stub_raises])
def test_stubs_are_not_attempted(capsys, checker, answer):
    result, out = run(capsys, checker, answer)
    assert result.passed is None and out.startswith(NA)


# 10.1 ------------------------------------------------------------------------------------------
def _tau_parts(Q, K, V, dO, tau):
    S = Q @ K.transpose(-2, -1) / (tau * math.sqrt(Q.shape[-1]))
    P = torch.softmax(S, dim=-1)
    O = P @ V
    dP = dO @ V.transpose(-2, -1)
    D = (dO * O).sum(-1, keepdim=True)
    return S, P, dP, P * (dP - D)


def temperature_ok(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(dS * S).sum() / tau


def temperature_finite_difference(Q, K, V, dO, tau):
    """A different route: central differences of the loss sum(O * dO) in float64."""
    def loss(t):
        S = Q @ K.transpose(-2, -1) / (t * math.sqrt(Q.shape[-1]))
        return float((torch.softmax(S, dim=-1) @ V * dO).sum())
    h = 1e-6
    return (loss(tau + h) - loss(tau - h)) / (2 * h)


def temperature_sign(Q, K, V, dO, tau):
    return -temperature_ok(Q, K, V, dO, tau)


def temperature_no_tau(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(dS * S).sum()


def temperature_tau_twice(Q, K, V, dO, tau):
    return temperature_ok(Q, K, V, dO, tau) / tau


def temperature_dP(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(dP * S).sum() / tau


def temperature_no_D(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(P * dP * S).sum() / tau


def temperature_no_sqrt_d(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(dS * (Q @ K.transpose(-2, -1))).sum() / tau**2


def temperature_per_batch(Q, K, V, dO, tau):
    S, P, dP, dS = _tau_parts(Q, K, V, dO, tau)
    return -(dS * S).sum(dim=(-1, -2)) / tau


def temperature_autograd(Q, K, V, dO, tau):
    t = torch.tensor(tau, requires_grad=True)
    S = Q @ K.transpose(-2, -1) / (t * math.sqrt(Q.shape[-1]))
    (g,) = torch.autograd.grad((torch.softmax(S, -1) @ V * dO).sum(), t)
    return g


@pytest.mark.parametrize("answer", [temperature_ok, temperature_finite_difference])
def test_temperature_correct(capsys, answer):
    result, out = run(capsys, ex.check_temperature_grad, answer)
    assert result.passed is True, out


@pytest.mark.parametrize("answer, hint", [
    (temperature_sign, "sign is flipped"),
    (temperature_no_tau, "divide once more by tau"),
    (temperature_tau_twice, "divided by tau twice"),
    (temperature_dP, "dP = dO V^T where dS is needed"),
    (temperature_no_D, "missing its row term"),
    (temperature_no_sqrt_d, "1/sqrt(d) is part of"),
    (temperature_per_batch, "add up over the batch"),
    (temperature_autograd, "autograd is off inside this checker"),
])
def test_temperature_wrong(capsys, answer, hint):
    result, out = run(capsys, ex.check_temperature_grad, answer)
    assert result.passed is False and hint in out, out


# 10.2 ------------------------------------------------------------------------------------------
def _bias_parts(Q, K, V, dO):
    P = torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1)
    O = P @ V
    dP = dO @ V.T
    return P, dP, P * (dP - (dO * O).sum(-1, keepdim=True))


def bias_ok(Q, K, V, dO):
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return dS.sum(-1), dS.sum(0)


def bias_zero_rows(Q, K, V, dO):
    """The learner who reasoned it out: dr is exactly zero."""
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return torch.zeros(Q.shape[0], dtype=Q.dtype), dS.sum(0)


def bias_swapped(Q, K, V, dO):
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return dS.sum(0), dS.sum(-1)


def bias_dP(Q, K, V, dO):
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return dS.sum(-1), dP.sum(0)


def bias_no_D(Q, K, V, dO):
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return dS.sum(-1), (P * dP).sum(0)


def bias_weights(Q, K, V, dO):
    P, dP, dS = _bias_parts(Q, K, V, dO)
    return dS.sum(-1), P.sum(0)


def bias_one(Q, K, V, dO):
    return bias_ok(Q, K, V, dO)[1]


@pytest.mark.parametrize("answer", [bias_ok, bias_zero_rows])
def test_bias_correct(capsys, answer):
    result, out = run(capsys, ex.check_bias_grads, answer)
    assert result.passed is True and "dr is zero" in out, out


@pytest.mark.parametrize("answer, hint", [
    (bias_swapped, "swapped or summed along the wrong axis"),
    (bias_dP, "dc: you summed dP"),
    (bias_no_D, "dc: the softmax backward is missing its row term"),
    (bias_weights, "dc: you summed P"),
    (bias_one, "return a pair (dr, dc)"),
])
def test_bias_wrong(capsys, answer, hint):
    result, out = run(capsys, ex.check_bias_grads, answer)
    assert result.passed is False and hint in out, out


# 10.3 ------------------------------------------------------------------------------------------
def make_backward(q_scale=True, k_scale=True, s_scale=True, k_scale_twice=False, order=(0, 1, 2),
                  skip_last_block=False):
    def backward(Q, K, V, O, L, dO, block_size):
        N, T, d = Q.shape
        scale = 1 / math.sqrt(d)
        D = (dO * O).sum(-1, keepdim=True)
        dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
        stop = T - T % block_size if skip_last_block and T % block_size else T
        for k0 in range(0, stop, block_size):
            k1 = min(k0 + block_size, T)
            for q0 in range(0, T, block_size):
                q1 = min(q0 + block_size, T)
                S = Q[:, q0:q1] @ K[:, k0:k1].transpose(1, 2) * (scale if s_scale else 1.0)
                P = torch.exp(S - L[:, q0:q1, None])
                dV[:, k0:k1] += P.transpose(1, 2) @ dO[:, q0:q1]
                dP = dO[:, q0:q1] @ V[:, k0:k1].transpose(1, 2)
                dS = P * (dP - D[:, q0:q1])
                dQ[:, q0:q1] += dS @ K[:, k0:k1] * (scale if q_scale else 1.0)
                dK[:, k0:k1] += dS.transpose(1, 2) @ Q[:, q0:q1] * (
                    (scale**2 if k_scale_twice else scale) if k_scale else 1.0)
        grads = (dQ, dK, dV)
        return tuple(grads[i] for i in order)
    return backward


def backward_autograd_free_reference(Q, K, V, O, L, dO, block_size):
    """Whole-matrix gradients (no tiles): an equally correct answer."""
    P = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(Q.shape[-1]), dim=-1)
    dP = dO @ V.transpose(1, 2)
    dS = P * (dP - (dO * O).sum(-1, keepdim=True))
    s = 1 / math.sqrt(Q.shape[-1])
    return dS @ K * s, dS.transpose(1, 2) @ Q * s, P.transpose(1, 2) @ dO


@pytest.mark.parametrize("answer", [make_backward(), backward_autograd_free_reference])
def test_fixed_backward_correct(capsys, answer):
    result, out = run(capsys, ex.check_fixed_backward, answer)
    assert result.passed is True, out


@pytest.mark.parametrize("answer, hint", [
    (make_backward(q_scale=False, k_scale=False), "dQ is sqrt(d) times too large"),
    (make_backward(k_scale=False), "dK is sqrt(d) times too large"),
    (make_backward(k_scale_twice=True), "dK is sqrt(d) times too small"),
    (make_backward(s_scale=False), "recompute each tile of P"),
    (make_backward(skip_last_block=True), "dV = P^T dO is off"),
    (make_backward(order=(1, 0, 2)), "wrong order"),
])
def test_fixed_backward_wrong(capsys, answer, hint):
    result, out = run(capsys, ex.check_fixed_backward, answer)
    assert result.passed is False and hint in out, out


# 10.4 ------------------------------------------------------------------------------------------
def saved_ok(layers, batch, heads, head_dim, T, nbytes, flash):
    if flash:
        O = batch * heads * T * head_dim * nbytes
        L = batch * heads * T * 4
        return layers * (O + L)
    return layers * batch * heads * T * T * nbytes


def saved_by_allocation(layers, batch, heads, head_dim, T, nbytes, flash):
    """Independent route: the bytes of the actual (meta) tensors' shapes."""
    dtype = {2: torch.bfloat16, 4: torch.float32}[nbytes]
    if flash:
        tensors = [torch.empty(batch, heads, T, head_dim, dtype=dtype, device="meta"),
                   torch.empty(batch, heads, T, dtype=torch.float32, device="meta")]
    else:
        tensors = [torch.empty(batch, heads, T, T, dtype=dtype, device="meta")]
    return layers * sum(t.numel() * t.element_size() for t in tensors)


def saved_gib(*args):
    return saved_ok(*args) / 2**30


def saved_no_layers(layers, *rest):
    return saved_ok(1, *rest)


def saved_no_batch(layers, batch, *rest):
    return saved_ok(layers, 1, *rest)


def saved_no_heads(layers, batch, heads, *rest):
    return saved_ok(layers, batch, 1, *rest)


def saved_P_times_head_dim(layers, batch, heads, head_dim, T, nbytes, flash):
    if flash:
        return saved_ok(layers, batch, heads, head_dim, T, nbytes, flash)
    return saved_ok(layers, batch, heads, head_dim, T, nbytes, flash) * head_dim


def saved_L_in_dtype(layers, batch, heads, head_dim, T, nbytes, flash):
    if flash:
        return layers * batch * heads * T * (head_dim + 1) * nbytes
    return saved_ok(layers, batch, heads, head_dim, T, nbytes, flash)


def saved_no_L(layers, batch, heads, head_dim, T, nbytes, flash):
    if flash:
        return layers * batch * heads * T * head_dim * nbytes
    return saved_ok(layers, batch, heads, head_dim, T, nbytes, flash)


def saved_flash_keeps_P(layers, batch, heads, head_dim, T, nbytes, flash):
    return saved_ok(layers, batch, heads, head_dim, T, nbytes, False)


def saved_elements(layers, batch, heads, head_dim, T, nbytes, flash):
    if flash:
        return saved_ok(layers, batch, heads, head_dim, T, nbytes, flash)
    return layers * batch * heads * T * T


@pytest.mark.parametrize("answer", [saved_ok, saved_by_allocation])
def test_saved_bytes_correct(capsys, answer):
    result, out = run(capsys, ex.check_attention_saved_bytes, answer)
    assert result.passed is True and "4.5 GiB" in out, out


@pytest.mark.parametrize("answer, hint", [
    (saved_gib, "not GiB"),
    (saved_no_layers, "multiply by num_layers"),
    (saved_no_batch, "multiply by batch"),
    (saved_no_heads, "multiply by num_heads"),
    (saved_P_times_head_dim, "not T x T x head_dim"),
    (saved_L_in_dtype, "L is kept in float32"),
    (saved_no_L, "flash also keeps L"),
    (saved_flash_keeps_P, "flash keeps O and L, not P"),
    (saved_elements, "multiply the number of elements by dtype_bytes"),
])
def test_saved_bytes_wrong(capsys, answer, hint):
    result, out = run(capsys, ex.check_attention_saved_bytes, answer)
    assert result.passed is False and hint in out, out
