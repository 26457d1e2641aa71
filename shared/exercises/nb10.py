"""Exercise checkers for notebook 10 Training attention (PyTorch).

References are computed by the checker in float64 with PyTorch's autograd (an independent route to
every gradient), from copies made before the learner's code runs. Hints name the mistake that was
actually made: each wrong-answer candidate is computed on the same hidden cases and compared.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._core import _arr, _call, _checker, _close, _diagnose, _maxdiff, _shape, _Wrong

__all__ = [
    "check_temperature_grad",
    "check_bias_grads",
    "check_fixed_backward",
    "check_attention_saved_bytes",
]


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _forward(Q, K, V, tau=1.0):
    """Scores, weights and output of unmasked attention with a temperature (float64)."""
    S = Q @ K.transpose(-2, -1) / (tau * math.sqrt(Q.shape[-1]))
    P = torch.softmax(S, dim=-1)
    return S, P, P @ V


def _no_autograd_hint(fn, *args, name: str):
    """Call learner code with autograd switched off (the exercise is to derive the gradient)."""
    with torch.no_grad():
        return _call(fn, *args, name=name,
                     on_error="autograd is off inside this checker: derive the gradient from "
                              "dS = P * (dP - D) instead of calling .backward()")


# --------------------------------------------------------------------------------------------
# 10.1 The gradient of a temperature
# --------------------------------------------------------------------------------------------
@_checker
def check_temperature_grad(temperature_grad):
    """Exercise 10.1: ``temperature_grad(Q, K, V, dO, tau)`` returns ``dLoss/dtau`` (a number)
    for ``O = softmax(Q K^T / (tau sqrt(d))) V`` and a loss whose gradient with respect to O is
    ``dO``. Shapes: Q, K ``(B, T, d)``, V and dO ``(B, T, d_v)``; tau a positive float."""
    cases = [(2, 5, 4, 3, 0.7), (1, 6, 8, 2, 2.0), (3, 4, 2, 5, 1.6)]  # B, T, d, d_v, tau
    for case, (B, T, d, d_v, tau) in enumerate(cases):
        gen = torch.Generator().manual_seed(1010 + case)
        Q, K = _randn(gen, B, T, d) * 1.5, _randn(gen, B, T, d) * 1.5
        V, dO = _randn(gen, B, T, d_v), _randn(gen, B, T, d_v)
        got = _no_autograd_hint(temperature_grad, Q, K, V, dO, tau, name="temperature_grad")
        got = _arr(got, "temperature_grad's result")
        if got.size != 1:
            raise _Wrong(f"return one number (dLoss/dtau summed over the whole batch); got shape "
                         f"{got.shape} for B = {B}: add up over the batch too")
        got = float(got.reshape(()))
        t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
        S = Q @ K.transpose(-2, -1) / (t * math.sqrt(d))
        O = torch.softmax(S, dim=-1) @ V
        (ref,) = torch.autograd.grad((O * dO).sum(), t)
        ref = float(ref)
        if math.isclose(got, ref, rel_tol=1e-6, abs_tol=1e-9):
            continue
        S, P, O = _forward(Q, K, V, tau)
        dP = dO @ V.transpose(-2, -1)
        dS = P * (dP - (dO * O).sum(-1, keepdim=True))
        S_unscaled = Q @ K.transpose(-2, -1)  # no tau, no sqrt(d)
        _diagnose(np.array(got), [
            ("the sign is flipped: a larger tau shrinks every score, so dS/dtau = -S/tau",
             np.array(float((dS * S).sum() / tau))),
            ("off by a factor tau: with S = S0/tau (S0 = QK^T/sqrt(d)), dS/dtau = -S0/tau^2 = "
             "-S/tau; divide once more by tau", np.array(float(-(dS * S).sum()))),
            ("off by a factor tau: dS/dtau = -S/tau, where S already includes the 1/tau; you "
             "divided by tau twice", np.array(float(-(dS * S).sum() / tau**2))),
            ("you used dP = dO V^T where dS is needed: go through the softmax backward, "
             "dS = P * (dP - D)", np.array(float(-(dP * S).sum() / tau))),
            ("the softmax backward is missing its row term: dS = P * (dP - D) with D = "
             "rowsum(dO * O), not P * dP", np.array(float(-(P * dP * S).sum() / tau))),
            ("the scores are QK^T / (tau sqrt(d)): the 1/sqrt(d) is part of dS/dtau too",
             np.array(float(-(dS * S_unscaled).sum() / tau**2))),
        ], atol=1e-7 * max(1.0, abs(ref)))
        raise _Wrong(f"for B = {B}, T = {T}, d = {d}, tau = {tau} you returned {got:.4f}; "
                     f"expected {ref:.4f}: write S as S0/tau and apply the chain rule, "
                     "dLoss/dtau = sum(dS * dS/dtau)")
    return "dLoss/dtau = -sum(dS * S) / tau, and a constant added to a row of S changes nothing"


# --------------------------------------------------------------------------------------------
# 10.2 Row and column biases: why the rows of dS sum to zero
# --------------------------------------------------------------------------------------------
@_checker
def check_bias_grads(bias_grads):
    """Exercise 10.2: ``bias_grads(Q, K, V, dO)`` returns ``(dr, dc)``, the gradients of the
    loss with respect to a per-query bias ``r`` ``(T_q,)`` and a per-key bias ``c`` ``(T_k,)``
    in ``S = Q K^T / sqrt(d) + r[:, None] + c[None, :]``, at ``r = c = 0``. Shapes: Q
    ``(T_q, d)``, K ``(T_k, d)``, V ``(T_k, d_v)``, dO ``(T_q, d_v)``."""
    cases = [(4, 6, 3, 2), (5, 3, 4, 4), (7, 7, 2, 3)]  # T_q, T_k, d, d_v
    for case, (T_q, T_k, d, d_v) in enumerate(cases):
        gen = torch.Generator().manual_seed(1020 + case)
        Q, K = _randn(gen, T_q, d), _randn(gen, T_k, d)
        V, dO = _randn(gen, T_k, d_v), _randn(gen, T_q, d_v)
        out = _no_autograd_hint(bias_grads, Q, K, V, dO, name="bias_grads")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise _Wrong(f"return a pair (dr, dc); got {type(out).__name__}")
        dr, dc = _arr(out[0], "dr"), _arr(out[1], "dc")
        S, P, O = _forward(Q, K, V)
        dP = dO @ V.T
        dS = P * (dP - (dO * O).sum(-1, keepdim=True))
        if dr.shape == (T_k,) and dc.shape == (T_q,) and T_q != T_k:
            raise _Wrong("dr and dc are swapped or summed along the wrong axis: r adds to every "
                         "score of one query (a row of S), so dr has T_q entries, dc T_k")
        _shape(dr, (T_q,), "dr", "(T_q,): one entry per query")
        _shape(dc, (T_k,), "dc", "(T_k,): one entry per key")
        ref_r, ref_c = dS.sum(-1).numpy(), dS.sum(0).numpy()
        if _close(dr, ref_r, 1e-8) and _close(dc, ref_c, 1e-8):
            continue
        for what, got, sums in (("dr", dr, -1), ("dc", dc, 0)):
            if _close(got, (dS.sum(-1) if sums == -1 else dS.sum(0)).numpy(), 1e-8):
                continue
            other = dS.sum(0) if sums == -1 else dS.sum(-1)
            _diagnose(got, [
                (f"{what}: summed along the wrong axis (r moves a row of S, c a column)",
                 other.numpy() if other.shape == got.shape else None),
                (f"{what}: you summed dP = dO V^T; the bias enters before the softmax, so sum "
                 "dS = P * (dP - D)", dP.sum(sums).numpy()),
                (f"{what}: the softmax backward is missing its row term D = rowsum(dO * O): "
                 "dS = P * (dP - D)", (P * dP).sum(sums).numpy()),
                (f"{what}: you summed P, the weights; the gradient needs dS",
                 P.sum(sums).numpy()),
            ], atol=1e-8)
            raise _Wrong(f"{what} (T_q = {T_q}, T_k = {T_k}) is off by up to "
                         f"{_maxdiff(got, (dS.sum(sums)).numpy())}: d(score)/d(bias) is 1 for "
                         "every score the bias is added to, so sum dS over those")
    return ("dr is zero (up to rounding): softmax ignores a constant added to a whole row, so "
            "every row of dS sums to 0; a key's bias does get a gradient")


# --------------------------------------------------------------------------------------------
# 10.3 Find the bug in a flash backward
# --------------------------------------------------------------------------------------------
def _scale_hint(name: str, got: np.ndarray, ref: np.ndarray, d: int) -> None:
    root = math.sqrt(d)
    _diagnose(got, [
        (f"{name} is sqrt(d) times too large: S = QK^T / sqrt(d), so the chain rule multiplies "
         f"{name} by 1/sqrt(d) too", ref * root),
        (f"{name} is sqrt(d) times too small: the 1/sqrt(d) is applied twice", ref / root),
        (f"{name} is d times too small: scale by 1/sqrt(d), not 1/d", ref / root**2),
    ], atol=1e-8)


@_checker
def check_fixed_backward(fixed_backward):
    """Exercise 10.3: ``fixed_backward(Q, K, V, O, L, dO, block_size)`` returns ``(dQ, dK, dV)``
    for unmasked attention, recomputing P tile by tile from L. Shapes: Q ``(N, T, d)``, K
    ``(N, T, d)``, V, O, dO ``(N, T, d_v)``, L ``(N, T)``."""
    cases = [(2, 7, 4, 3, 3), (1, 10, 16, 4, 4), (3, 5, 9, 2, 8)]  # N, T, d, d_v, block_size
    for case, (N, T, d, d_v, block) in enumerate(cases):
        gen = torch.Generator().manual_seed(1030 + case)
        Q, K = _randn(gen, N, T, d), _randn(gen, N, T, d)
        V, dO = _randn(gen, N, T, d_v), _randn(gen, N, T, d_v)
        S = Q @ K.transpose(-2, -1) / math.sqrt(d)
        L = torch.logsumexp(S, dim=-1)
        q, k, v = (x.clone().requires_grad_() for x in (Q, K, V))
        O = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v
        refs = [g.numpy() for g in torch.autograd.grad(O, (q, k, v), dO)]
        out = _no_autograd_hint(fixed_backward, Q, K, V, O.detach(), L, dO, block,
                                name="fixed_backward")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise _Wrong(f"return the three gradients (dQ, dK, dV); got {type(out).__name__}")
        grads = [_arr(g, name) for g, name in zip(out, ("dQ", "dK", "dV"), strict=True)]
        if [g.shape for g in grads] == [r.shape for r in refs] and all(
                _close(g, r, 1e-8) for g, r in zip(grads, refs, strict=True)):
            continue
        for i, j in ((0, 1), (0, 2), (1, 2)):
            if (grads[i].shape == refs[j].shape and grads[j].shape == refs[i].shape
                    and _close(grads[i], refs[j], 1e-8) and _close(grads[j], refs[i], 1e-8)):
                raise _Wrong("the gradients are right but in the wrong order: return (dQ, dK, "
                             "dV)")
        for name, g, r in zip(("dQ", "dK", "dV"), grads, refs, strict=True):
            _shape(g, r.shape, name, f"(N, T, {'d' if name != 'dV' else 'd_v'}), like its input")
        dV_ok = _close(grads[2], refs[2], 1e-8)
        if not dV_ok:
            raise _Wrong(f"dV = P^T dO is off by up to {_maxdiff(grads[2], refs[2])} (N = {N}, "
                         f"T = {T}, block_size = {block}): recompute each tile of P as "
                         "exp(Q_i K_j^T / sqrt(d) - L_i), with the same 1/sqrt(d) as the forward "
                         "pass, and cover the last, shorter block")
        for name, g, r in zip(("dQ", "dK"), grads[:2], refs[:2], strict=True):
            if not _close(g, r, 1e-8):
                _scale_hint(name, g, r, d)
                raise _Wrong(f"{name} is off by up to {_maxdiff(g, r)} while dV is right: check "
                             f"the line that accumulates {name} (dQ_i += dS K_j / sqrt(d), "
                             "dK_j += dS^T Q_i / sqrt(d))")
    return "every gradient matches autograd, blocks that do not divide T included"


# --------------------------------------------------------------------------------------------
# 10.4 What attention keeps for training, from shapes
# --------------------------------------------------------------------------------------------
@_checker
def check_attention_saved_bytes(attention_saved_bytes):
    """Exercise 10.4: ``attention_saved_bytes(num_layers, batch, num_heads, head_dim, T,
    dtype_bytes, flash)`` returns the bytes attention itself keeps for the backward pass (beyond
    Q, K, V, which both keep): naive keeps P ``(batch, heads, T, T)`` per layer; flash keeps O
    ``(batch, heads, T, head_dim)`` and L ``(batch, heads, T)`` in float32 (4 bytes) per layer."""
    cases = [  # layers, batch, heads, head_dim, T, dtype_bytes
        (3, 5, 7, 16, 96, 2), (7, 1, 4, 32, 40, 2), (5, 2, 6, 8, 50, 4), (12, 8, 12, 64, 1024, 4),
    ]  # the first case has a distinct factor for every count, so no hint is mistaken
    for layers, batch, heads, head_dim, T, nbytes in cases:
        for flash in (False, True):
            got = _call(attention_saved_bytes, layers, batch, heads, head_dim, T, nbytes, flash,
                        name="attention_saved_bytes")
            try:
                got = float(got)
            except (TypeError, ValueError):
                raise _Wrong(f"return a number of bytes; got {type(got).__name__}") from None
            per_row = batch * heads * T
            ref = layers * (per_row * (head_dim * nbytes + 4) if flash else per_row * T * nbytes)
            if got == ref:
                continue
            what = (f"attention_saved_bytes({layers}, {batch}, {heads}, {head_dim}, {T}, "
                    f"{nbytes}, flash={flash})")
            for hint, value in (
                ("units: the answer is in bytes, not GiB (2**30 bytes) or GB", ref / 2**30),
                ("units: the answer is in bytes, not GiB (2**30 bytes) or GB", ref / 1e9),
                ("units: the answer is in bytes, not MiB", ref / 2**20),
                ("multiply by num_layers: every layer keeps its own tensors", ref / layers),
                ("multiply by batch: every sequence has its own weights", ref / batch),
                ("multiply by num_heads: every head has its own weights", ref / heads),
                ("P has one row of T weights per query and per head: (batch, heads, T, T), "
                 "not T x T x head_dim", ref * head_dim if not flash else None),
                ("L is kept in float32 (4 bytes) whatever the dtype of O",
                 layers * per_row * (head_dim + 1) * nbytes if flash else None),
                ("flash also keeps L, one float32 per query and head",
                 layers * per_row * head_dim * nbytes if flash else None),
                ("flash keeps O and L, not P: that is the point of recomputing",
                 layers * per_row * T * nbytes if flash else None),
                ("naive keeps the weights P (batch, heads, T, T), not the output",
                 layers * per_row * head_dim * nbytes if not flash else None),
                ("count bytes: multiply the number of elements by dtype_bytes",
                 ref / nbytes if not flash else None),
            ):
                if value is not None and math.isclose(got, value, rel_tol=1e-9):
                    raise _Wrong(f"{what}: {hint}")
            raise _Wrong(f"{what} returned {got:,.0f}; expected {ref:,.0f} bytes")
    return ("GPT-2 small at T = 1024, batch 8: 4.5 GiB of weights P for naive attention, "
            "about 0.29 GiB of O and L for flash")
