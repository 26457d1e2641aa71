"""Exercise checkers for notebook 10 Training attention (PyTorch).

References are computed by the checker in float64 with PyTorch's autograd (an independent route to
every gradient), from copies made before the learner's code runs. Hints name the mistake that was
actually made: each wrong-answer candidate is computed on the same hidden cases and compared.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _diagnose,
    _maxdiff,
    _NotAttempted,
    _shape,
    _Wrong,
)

__all__ = [
    "check_temperature_grad",
    "check_bias_grads",
    "check_fixed_backward",
    "check_attention_saved_bytes",
    "check_memory_crossover",
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
        try:
            return _call(fn, *args, name=name)
        except _Wrong as e:  # add the advice only where autograd was what failed
            message = e.args[0]
            if " raised " in message and "grad" in message.split(" when called with ")[0]:
                raise _Wrong(f"{message} (autograd is off inside this checker: derive the "
                             "gradient from dS = P * (dP - D) instead of calling .backward())"
                             ) from None
            raise


# --------------------------------------------------------------------------------------------
# 10.1 The gradient of a temperature
# --------------------------------------------------------------------------------------------
@_checker
def check_temperature_grad(temperature_grad, predicted_equal_keys_grad=None):
    """Exercise 10.1: ``temperature_grad(Q, K, V, dO, tau)`` returns ``dLoss/dtau`` (a number)
    for ``O = softmax(Q K^T / (tau sqrt(d))) V`` and a loss whose gradient with respect to O is
    ``dO``. Shapes: Q, K ``(B, T, d)``, V and dO ``(B, T, d_v)``; tau a positive float.
    ``predicted_equal_keys_grad``: the learner's prediction (a number) of what it returns when
    every key is the same vector, made before coding."""
    cases = [(2, 5, 4, 3, 0.7), (1, 6, 8, 2, 2.0), (3, 4, 2, 5, 1.6)]  # B, T, d, d_v, tau
    cases.append((2, 5, 3, 3, 1.3))  # last: every key the same vector (the prediction)
    for case, (B, T, d, d_v, tau) in enumerate(cases):
        gen = torch.Generator().manual_seed(1010 + case)
        Q, K = _randn(gen, B, T, d) * 1.5, _randn(gen, B, T, d) * 1.5
        if case == len(cases) - 1:
            K = K[:, :1].expand(B, T, d).clone()
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
        if case == len(cases) - 1:
            raise _Wrong(f"with every key the same vector you returned {got:.4g}, not 0: then "
                         "every row of S is constant, and the sum of dS along a row is 0")
        raise _Wrong(f"for B = {B}, T = {T}, d = {d}, tau = {tau} you returned {got:.4f}; "
                     f"expected {ref:.4f}: write S as S0/tau and apply the chain rule, "
                     "dLoss/dtau = sum(dS * dS/dtau)")
    if predicted_equal_keys_grad is None:
        raise _NotAttempted("temperature_grad is right; now set predicted_equal_keys_grad to "
                            "your prediction for equal keys and run the cell again")
    try:
        guess = float(predicted_equal_keys_grad)
    except (TypeError, ValueError):
        raise _Wrong("predicted_equal_keys_grad should be a number; got "
                     f"{predicted_equal_keys_grad!r}") from None
    if not math.isfinite(guess) or abs(guess) > 1e-6:
        raise _Wrong(f"temperature_grad is right, but you predicted {guess:g} for equal keys: "
                     "call it with every key the same vector and look at one row of S, "
                     "then at what a row of dS adds up to")
    return ("dLoss/dtau = -sum(dS * S) / tau; with equal keys every row of S is a constant and "
            "every row of dS sums to 0, so it is 0: no temperature changes a flat row")


# --------------------------------------------------------------------------------------------
# 10.2 Biases on the scores
# --------------------------------------------------------------------------------------------
@_checker
def check_bias_grads(bias_grads, predicted_dc_sum=None):
    """Exercise 10.2: ``bias_grads(Q, K, V, dO)`` returns ``(dr, dc)``, the gradients of the
    loss with respect to a per-query bias ``r`` ``(T_q,)`` and a per-key bias ``c`` ``(T_k,)``
    in ``S = Q K^T / sqrt(d) + r[:, None] + c[None, :]``, at ``r = c = 0``. Shapes: Q
    ``(T_q, d)``, K ``(T_k, d)``, V ``(T_k, d_v)``, dO ``(T_q, d_v)``.
    ``predicted_dc_sum``: the learner's prediction of ``dc.sum()`` (a number), made before
    coding."""
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
    if predicted_dc_sum is None:
        raise _NotAttempted("bias_grads is right; now set predicted_dc_sum to your prediction "
                            "of dc.sum() and run the cell again")
    try:
        guess = float(predicted_dc_sum)
    except (TypeError, ValueError):
        raise _Wrong(f"predicted_dc_sum should be a number; got {predicted_dc_sum!r}") from None
    if not math.isfinite(guess) or abs(guess) > 1e-6:
        raise _Wrong(f"bias_grads is right, but you predicted dc.sum() = {guess:g}; print "
                     "dc.sum() from your own function: it is 0 up to rounding. dc.sum() adds up "
                     "every entry of dS once; add them row by row instead, and use what dr is")
    return ("dr = 0 and dc.sum() = 0: softmax ignores a constant added to a whole row, so every "
            "row of dS sums to 0, and so does all of dS; single keys' biases still get gradients")


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


def _tiled_backward(Q, K, V, O, L, dO, block: int, causal: bool, variant: str = "ok"):
    """The flash backward (float64), or one of the typical causal mistakes (``variant``):
    ``no_mask`` (inner loop from the diagonal, diagonal tile unmasked: the exercise's bug),
    ``self_masked`` (the mask also hides key j = query i), ``from_zero`` (inner loop from block 0
    with only the diagonal tile masked), ``dS_only`` (the mask zeroes dS but not the P of dV)."""
    N, T, d = Q.shape
    scale = 1 / math.sqrt(d)
    D = (dO * O).sum(-1, keepdim=True)
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    for k0 in range(0, T, block):
        k1 = min(k0 + block, T)
        for q0 in range(k0 if causal and variant != "from_zero" else 0, T, block):
            q1 = min(q0 + block, T)
            keys, queries = torch.arange(k0, k1)[None, :], torch.arange(q0, q1)[:, None]
            future = keys >= queries if variant == "self_masked" else keys > queries
            P = torch.exp(Q[:, q0:q1] @ K[:, k0:k1].transpose(1, 2) * scale - L[:, q0:q1, None])
            masked = causal and variant not in ("no_mask", "dS_only") and (
                variant != "from_zero" or q0 == k0)
            if masked:
                P = P.masked_fill(future, 0.0)
            dV[:, k0:k1] += P.transpose(1, 2) @ dO[:, q0:q1]
            dS = P * (dO[:, q0:q1] @ V[:, k0:k1].transpose(1, 2) - D[:, q0:q1])
            if causal and variant == "dS_only":
                dS = dS.masked_fill(future, 0.0)
            dQ[:, q0:q1] += dS @ K[:, k0:k1] * scale
            dK[:, k0:k1] += dS.transpose(1, 2) @ Q[:, q0:q1] * scale
    return [g.numpy() for g in (dQ, dK, dV)]


_CAUSAL_HINTS = (
    ("no_mask", "inside the tile on the diagonal some keys are still in the future: starting the "
     "inner loop at the diagonal skips the tiles above it, but in the diagonal tile P must be 0 "
     "wherever key j > query i"),
    ("self_masked", "your mask also hides the diagonal: a query may attend to itself, so mask key "
     "j > query i, not j >= i"),
    ("from_zero", "the tiles above the diagonal (key block after the query block) are all "
     "future: skip them (start the inner loop at the diagonal) or mask them as well"),
    ("dS_only", "dV is wrong while dQ and dK are right: dV = P^T dO is built from the weights, "
     "not from dS, and in the tile on the diagonal the weights still see the future"),
)


@_checker
def check_fixed_backward(fixed_backward, predicted_dQ_rows=None, predicted_dV_rows=None):
    """Exercise 10.3: ``fixed_backward(Q, K, V, O, L, dO, block_size, causal)`` returns ``(dQ,
    dK, dV)``, recomputing P tile by tile from L, with or without the causal mask. Shapes: Q
    ``(N, T, d)``, K ``(N, T, d)``, V, O, dO ``(N, T, d_v)``, L ``(N, T)``.
    ``predicted_dQ_rows``, ``predicted_dV_rows``: the learner's predictions (lists of 0-based
    rows) of which rows of the buggy version's dQ and dV match autograd (causal, T = 10, blocks
    of 4), made before running it."""
    cases = [  # N, T, d, d_v, block_size, causal: blocks that do not divide T, one block > T
        (2, 7, 4, 3, 3, False), (2, 10, 4, 3, 4, True), (1, 11, 16, 4, 4, True),
        (3, 5, 9, 2, 8, True), (2, 9, 5, 3, 3, True),
    ]
    for case, (N, T, d, d_v, block, causal) in enumerate(cases):
        gen = torch.Generator().manual_seed(1030 + case)
        Q, K = _randn(gen, N, T, d), _randn(gen, N, T, d)
        V, dO = _randn(gen, N, T, d_v), _randn(gen, N, T, d_v)
        allowed = torch.ones(T, T, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
        S = (Q @ K.transpose(-2, -1) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
        L = torch.logsumexp(S, dim=-1)
        q, k, v = (x.clone().requires_grad_() for x in (Q, K, V))
        S_ad = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
        O = torch.softmax(S_ad, dim=-1) @ v
        refs = [g.numpy() for g in torch.autograd.grad(O, (q, k, v), dO)]
        O = O.detach()
        out = _no_autograd_hint(fixed_backward, Q, K, V, O, L, dO, block, causal,
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
        where = f"(N = {N}, T = {T}, block_size = {block}, causal = {causal})"

        def matches(candidate, grads=grads):
            return all(_close(g, c, 1e-8) for g, c in zip(grads, candidate, strict=True))

        if not causal and matches(_tiled_backward(Q, K, V, O, L, dO, block, True)):
            raise _Wrong(f"with causal=False there is no mask: every query sees every key {where}")
        if causal:
            if matches(_tiled_backward(Q, K, V, O, L, dO, block, False)):
                raise _Wrong(f"with causal=True you computed the gradients without the mask "
                             f"{where}: use the causal argument")
            for variant, hint in _CAUSAL_HINTS:
                if matches(_tiled_backward(Q, K, V, O, L, dO, block, causal, variant)):
                    raise _Wrong(f"{hint} {where}")
        if not _close(grads[2], refs[2], 1e-8):
            raise _Wrong(f"dV = P^T dO is off by up to {_maxdiff(grads[2], refs[2])} {where}: "
                         "recompute each tile of P as exp(Q_i K_j^T / sqrt(d) - L_i), masked "
                         "where key j > query i when causal, and cover the last, shorter block")
        for name, g, r in zip(("dQ", "dK"), grads[:2], refs[:2], strict=True):
            if not _close(g, r, 1e-8):
                _scale_hint(name, g, r, d)
                raise _Wrong(f"{name} is off by up to {_maxdiff(g, r)} while dV is right {where}:"
                             f" check the line that accumulates {name} (dQ_i += dS K_j / sqrt(d),"
                             " dK_j += dS^T Q_i / sqrt(d))")
    _check_bug_rows(predicted_dQ_rows, predicted_dV_rows)
    return ("every gradient matches autograd, with and without the causal mask, blocks that do "
            "not divide T included; the bug only leaks the future into dV, in every row but the "
            "first of each key block")


def _bug_rows() -> tuple[list[int], list[int]]:
    """Rows of dQ and dV that the exercise's bug (dS masked, P not) gets right, measured on a
    hidden case with the exercise's sizes (causal, T = 10, blocks of 4) against autograd."""
    gen = torch.Generator().manual_seed(1039)
    N, T, d, block = 2, 10, 16, 4
    Q, K, V, dO = (_randn(gen, N, T, d) for _ in range(4))
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    q, k, v = (x.clone().requires_grad_() for x in (Q, K, V))
    S = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
    L = torch.logsumexp(S.detach(), dim=-1)
    O = torch.softmax(S, dim=-1) @ v
    refs = [g.numpy() for g in torch.autograd.grad(O, (q, k, v), dO)]
    bug = _tiled_backward(Q, K, V, O.detach(), L, dO, block, True, "dS_only")
    return [[t for t in range(T) if np.abs(g[:, t] - r[:, t]).max() < 1e-10]
            for g, r in ((bug[0], refs[0]), (bug[2], refs[2]))]


def _check_bug_rows(predicted_dQ_rows, predicted_dV_rows) -> None:
    if predicted_dQ_rows is None or predicted_dV_rows is None:
        raise _NotAttempted("fixed_backward is right; now set predicted_dQ_rows and "
                            "predicted_dV_rows to your predictions and run the cell again")
    guesses = []
    for name, rows in (("predicted_dQ_rows", predicted_dQ_rows),
                       ("predicted_dV_rows", predicted_dV_rows)):
        try:
            guesses.append(sorted({int(r) for r in rows}))
        except (TypeError, ValueError):
            raise _Wrong(f"{name} should be a list of row numbers (0-based, 0 to 9); got "
                         f"{rows!r}") from None
    want_dQ, want_dV = _bug_rows()
    if guesses[0] == want_dV and guesses[1] == want_dQ:
        raise _Wrong("fixed_backward is right, but your two predictions are swapped: which "
                     "gradient is built from P alone, without dS?")
    if guesses[0] != want_dQ:
        raise _Wrong("fixed_backward is right, but predicted_dQ_rows is off: the bug masks dS, "
                     "and dQ is built from dS and K only; run the buggy cell to see")
    if guesses[1] != want_dV:
        raise _Wrong("fixed_backward is right, but predicted_dV_rows is off: dV row j collects "
                     "P[i, j] dO[i] from the queries i of the tiles it meets, and in the tile on "
                     "the diagonal P is not masked; run the buggy cell to see")


# --------------------------------------------------------------------------------------------
# 10.4 What attention keeps for training, from shapes
# --------------------------------------------------------------------------------------------
_BUDGET = 16 * 2**30  # bytes P may take in the question: GPT-2 small, batch 8, bfloat16


def _longest_T(per_T_squared: float, budget: float = _BUDGET) -> int:
    """The largest integer T with per_T_squared * T**2 <= budget (exact integer arithmetic)."""
    T = math.isqrt(int(budget // per_T_squared))
    while per_T_squared * (T + 1) ** 2 <= budget:
        T += 1
    while per_T_squared * T**2 > budget:
        T -= 1
    return T


@_checker
def check_attention_saved_bytes(attention_saved_bytes, T_max=None, context_ratio=None):
    """Exercise 10.4: ``attention_saved_bytes(num_layers, batch, num_heads, head_dim, T,
    dtype_bytes, flash)`` returns the bytes attention itself keeps for the backward pass (beyond
    Q, K, V, which both keep): naive keeps P ``(batch, heads, T, T)`` per layer; flash keeps O
    ``(batch, heads, T, head_dim)`` and L ``(batch, heads, T)`` in float32 (4 bytes) per layer.
    ``T_max``: the longest context at which GPT-2 small (12 layers of 12 heads), batch 8, in
    bfloat16, keeps at most 16 GiB of P. ``context_ratio``: how many times longer the longest
    context is when flash's O and L (instead of P) may take those 16 GiB (a number)."""
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
    if T_max is None:
        raise _NotAttempted("attention_saved_bytes is right; now set T_max, the longest context "
                            "whose P fits in 16 GiB, and run the cell again")
    want = _longest_T(12 * 8 * 12 * 2)
    try:
        got_T = float(T_max)
    except (TypeError, ValueError):
        raise _Wrong(f"T_max should be a whole number of tokens; got {T_max!r}") from None
    if got_T != want:
        for hint, value in (
            ("T_max: round down, not to the nearest or up: the context must fit, so T_max is the "
             "largest T whose P takes at most 16 GiB", want + 1),
            ("T_max: bfloat16 has 2 bytes per number; you used 4 (float32)",
             _longest_T(12 * 8 * 12 * 4)),
            ("T_max: 16 GiB is 16 * 2**30 bytes, not 16e9", _longest_T(12 * 8 * 12 * 2, 16e9)),
            ("T_max: a factor 12 is missing: P is (batch, heads, T, T) with 12 heads, in each "
             "of the 12 layers", _longest_T(8 * 12 * 2)),
            ("T_max: count the batch of 8", _longest_T(12 * 12 * 2)),
        ):
            if got_T == value:
                raise _Wrong(hint)
        if got_T > 10 * want:
            raise _Wrong(f"T_max = {got_T:g} is flash's budget (O and L); the question is how "
                         "long a context fits when P, (batch, heads, T, T) per layer, is kept")
        raise _Wrong(f"T_max = {got_T:g} is not the longest context whose P fits: search for the "
                     "largest T with attention_saved_bytes(12, 8, 12, 64, T, 2, False) <= "
                     "16 * 2**30")
    rows = 12 * 8 * 12  # layers * batch * heads: one O row and one L per query of each
    T_flash = _BUDGET // (rows * (64 * 2 + 4))
    ratio = T_flash / want
    if context_ratio is None:
        raise _NotAttempted("T_max is right; now set context_ratio, how many times longer a "
                            "context fits when flash's O and L may take the 16 GiB")
    try:
        got_r = float(context_ratio)
    except (TypeError, ValueError):
        raise _Wrong(f"context_ratio should be a number; got {context_ratio!r}") from None
    if not (math.isfinite(got_r) and math.isclose(got_r, ratio, rel_tol=5e-3)):
        for hint, value in (
            ("context_ratio: flash also keeps L, one float32 per query and head: 64 * 2 + 4 "
             "bytes per query, not 64 * 2", _BUDGET // (rows * 64 * 2) / want),
            ("context_ratio: L is kept in float32 (4 bytes), not bfloat16",
             _BUDGET // (rows * (64 * 2 + 2)) / want),
            ("context_ratio: O is kept in the model's dtype, bfloat16 (2 bytes per number)",
             _BUDGET // (rows * (64 * 4 + 4)) / want),
            ("context_ratio: flash's memory is linear in T, so solve rows * T * (bytes per "
             "query) <= 16 GiB with no square root", math.sqrt(ratio)),
            ("context_ratio: that is naive over flash; the question is flash's longest context "
             "divided by T_max", 1 / ratio),
        ):
            if math.isclose(got_r, value, rel_tol=5e-3):
                raise _Wrong(hint)
        raise _Wrong(f"context_ratio = {got_r:g} is off: find flash's longest context, the "
                     "largest T with attention_saved_bytes(12, 8, 12, 64, T, 2, True) <= 16 GiB, "
                     "and divide it by T_max")
    return (f"T_max = {want}, and flash fits T = {T_flash}, {ratio:.1f} times longer: not a "
            "fixed factor but 2 * T_max / (64 * 2 + 4), since naive's context grows like the "
            "square root of the budget and flash's like the budget itself")


# --------------------------------------------------------------------------------------------
# 10.5 Predict, then measure: at what length does flash win on memory?
# --------------------------------------------------------------------------------------------
_LENGTHS = (32, 64, 128, 256, 512)  # the T the learner compares (B = 1, H = 4, head_dim = 64)
_CROSSOVER_BLOCKS = (64, 128)  # hidden block sizes; the prediction is for the first


def _peak_ratio_below(T: int, block_size: int) -> bool:
    """Whether a causal forward + backward step through flash_attention(block_size) peaks below
    one through textbook attention, measured with the profiler's allocation events."""
    from shared.benchmark import cpu_peak_memory
    from shared.flash_backward import flash_attention

    def textbook(Q, K, V):
        S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(S, dim=-1) @ V

    def flash(Q, K, V):
        return flash_attention(Q, K, V, causal=True, block_size=block_size)

    gen = torch.Generator().manual_seed(1050 + T)
    Q, K, V = (torch.randn(1, 4, T, 64, generator=gen).requires_grad_() for _ in range(3))
    dO = torch.randn(1, 4, T, 64, generator=gen)
    peaks = [cpu_peak_memory(lambda f=f: torch.autograd.grad(f(Q, K, V), (Q, K, V), dO))
             for f in (textbook, flash)]
    return peaks[1] < peaks[0]


@functools.cache  # a measurement of fixed shapes: the same every time
def _crossover(block_size: int) -> int:
    return next((T for T in _LENGTHS if _peak_ratio_below(T, block_size)), _LENGTHS[-1])


@_checker
def check_memory_crossover(first_T_where_flash_wins, predicted_T=None):
    """Exercise 10.5: ``first_T_where_flash_wins(block_size)`` returns the first T in (32, 64,
    128, 256, 512) at which one causal forward + backward step through
    ``flash_attention(..., block_size=block_size)`` peaks below naive attention's (B = 1, H = 4,
    head_dim = 64, measured with ``shared.benchmark.cpu_peak_memory``). ``predicted_T``: the
    learner's prediction for block_size = 64, made before measuring."""
    got = []
    for block in _CROSSOVER_BLOCKS:
        T = _call(first_T_where_flash_wins, block, name="first_T_where_flash_wins")
        try:
            value = float(T)
        except (TypeError, ValueError):
            value = None
        if isinstance(T, bool) or value not in _LENGTHS:
            raise _Wrong(f"for block_size = {block} return one of the lengths {_LENGTHS}; got "
                         f"{T!r}")
        got.append(int(value))
    want = [_crossover(block) for block in _CROSSOVER_BLOCKS]
    if got != want:
        earlier = [_LENGTHS[max(_LENGTHS.index(w) - 1, 0)] for w in want]
        if got == earlier:
            raise _Wrong(f"each answer is one length too early: at T = {got[0]} (block_size = "
                         f"{_CROSSOVER_BLOCKS[0]}) flash's peak is still above naive's; return the "
                         "first T at which it is below")
        if len(set(got)) == 1:
            raise _Wrong(f"your answer ({got[0]}) does not change with the block size: pass "
                         "block_size=block_size to flash_attention (its default is 256), and "
                         "compare the peak of the whole step (peak_of_step), not what is saved "
                         "for the backward pass")
        k = next(i for i in range(len(got)) if got[i] != want[i])
        raise _Wrong(f"for block_size = {_CROSSOVER_BLOCKS[k]} you returned {got[k]}; measured: "
                     f"{want[k]}. For each T, compare peak_of_step of candidates['naive'] with "
                     "that of flash_attention(Q, K, V, causal=True, block_size=block_size), and "
                     "return the first T at which flash's is smaller")
    if predicted_T is None:
        raise _NotAttempted("your measurement is right; now set predicted_T to the prediction "
                            "you made before measuring, and run the cell again")
    try:
        guess = float(predicted_T)
    except (TypeError, ValueError):
        raise _Wrong(f"predicted_T should be a length in {_LENGTHS}; got {predicted_T!r}") from None
    if guess != want[0]:
        raise _Wrong(f"you predicted T = {guess:g}; measured T = {want[0]} for block_size = "
                     f"{_CROSSOVER_BLOCKS[0]}. Up to the block size flash has one tile, the "
                     "whole T x T matrix, plus T x head_dim buffers as large as a T x T one "
                     "when T = head_dim; only past the block size do its tiles stop growing")
    return (f"flash first wins at T = {want[0]} with blocks of {_CROSSOVER_BLOCKS[0]}, and at "
            f"T = {want[1]} with blocks of {_CROSSOVER_BLOCKS[1]}: past the block size its "
            "tiles stop growing while naive attention's T x T buffers do not")
