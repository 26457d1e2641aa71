"""Exercise checkers for notebook 04 Multi-head attention (PyTorch)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _diagnose,
    _entropy,
    _maxdiff,
    _NotAttempted,
    _rng,
    _shape,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_cross_attention",
    "check_split_merge_heads",
    "check_parameter_count",
    "check_row_entropy",
    "check_attention_patterns",
]

@_checker
def check_cross_attention(cross_attention):
    """``cross_attention(X_q, X_kv, W_q, W_k, W_v)`` -> ``(T_q, d_v)``: queries from ``X_q``
    ``(T_q, d_in)``, keys and values from ``X_kv`` ``(T_kv, d_in)``; scaled, no mask."""
    rng = _rng(401)
    for T_q, T_kv, d_in, d_k, d_v in ((3, 5, 4, 2, 3), (4, 2, 3, 3, 2)):
        X_q, X_kv = rng.normal(size=(T_q, d_in)), rng.normal(size=(T_kv, d_in))
        W_q, W_k, W_v = (rng.normal(size=(d_in, d_k)), rng.normal(size=(d_in, d_k)),
                         rng.normal(size=(d_in, d_v)))
        got = _arr(_call(cross_attention, _t(X_q), _t(X_kv), _t(W_q), _t(W_k), _t(W_v),
                         name="cross_attention",
                         on_error="hint: queries come from X_q; keys AND values both come from "
                                  "X_kv, which may have a different length"), "the output")
        if got.shape == (T_kv, d_v):
            raise _Wrong(f"the output has shape {got.shape}, one row per key: the queries must "
                         f"come from X_q, giving (T_q, d_v) = {(T_q, d_v)}")
        _shape(got, (T_q, d_v), "the output", "(T_q, d_v): one output per query")
        Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
        S = Q @ K.T
        ref = _softmax(S / math.sqrt(d_k)) @ V
        if _close(got, ref):
            continue
        tri = np.tril(np.ones((T_q, T_kv), dtype=bool))
        _diagnose(got, [
            ("forgot the scaling: divide the scores by sqrt(d_k)", _softmax(S) @ V),
            ("cross-attention has no causal mask: every query may look at every key of X_kv",
             _softmax(np.where(tri, S, -np.inf) / math.sqrt(d_k)) @ V),
            ("the values must come from X_kv too (V = X_kv @ W_v)", None),
        ])
        raise _Wrong(f"the output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                     f"{_maxdiff(got, ref)}")
    return "queries from one sequence, keys and values from another of a different length."


@_checker
def check_split_merge_heads(split_heads, merge_heads):
    """``split_heads(x, num_heads)``: ``(B, T, d)`` -> ``(B, num_heads, T, head_dim)`` with head h
    owning columns ``h*head_dim:(h+1)*head_dim``; ``merge_heads(y)`` undoes it. Torch tensors."""
    g = torch.Generator().manual_seed(402)
    for B, T, H, hd in ((2, 3, 4, 2), (1, 5, 3, 4)):
        x = torch.randn(B, T, H * hd, generator=g, dtype=torch.float64)
        ref = x.view(B, T, H, hd).transpose(1, 2)
        got = _arr(_call(split_heads, x.clone(), H, name="split_heads"), "split_heads(x)")
        _shape(got, (B, H, T, hd), "split_heads(x)", "(B, num_heads, T, head_dim)")
        if not _close(got, ref.numpy()):
            _diagnose(got, [
                ("you reshaped straight to (B, H, T, head_dim), which mixes tokens and heads: "
                 "view as (B, T, H, head_dim) first, then swap dims 1 and 2 (.transpose(1, 2))",
                 x.reshape(B, H, T, hd).numpy()),
                ("head h must own the contiguous columns h*head_dim:(h+1)*head_dim: view as "
                 "(B, T, H, head_dim), not (B, T, head_dim, H)",
                 x.view(B, T, hd, H).permute(0, 3, 1, 2).numpy()),
            ])
            raise _Wrong(f"split_heads(x) differs from x.view(B, T, H, head_dim).transpose(1, 2) "
                         f"by up to {_maxdiff(got, ref.numpy())}")
        merged = _arr(_call(merge_heads, ref.contiguous(), name="merge_heads",
                            on_error="hint: after transpose the tensor is not contiguous; use "
                                     ".contiguous().view(...) or .reshape(...)"),
                      "merge_heads(y)")
        _shape(merged, (B, T, H * hd), "merge_heads(y)", "(B, T, num_heads * head_dim)")
        if not _close(merged, x.numpy()):
            _diagnose(merged, [
                ("transpose back to (B, T, H, head_dim) before reshaping to (B, T, d): "
                 "y.transpose(1, 2).reshape(B, T, d)", ref.reshape(B, T, H * hd).numpy()),
            ])
            raise _Wrong("merge_heads(split_heads(x)) does not give x back")
    return "(B, T, d) -> (B, H, T, head_dim) -> (B, T, d) round-trips exactly."


def _mha_count(d_model: int, num_heads: int, bias: bool) -> int:
    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)
    return sum(p.numel() for p in mha.parameters())


@_checker
def check_parameter_count(count_mha_parameters):
    """``count_mha_parameters(d_model, num_heads, bias=True)`` -> the number of parameters of
    ``torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)``: W_q, W_k, W_v and W_o
    (each d_model x d_model), plus one bias vector of d_model per projection when ``bias``."""
    for d, H, bias in ((768, 12, True), (64, 4, False), (10, 2, True), (12, 3, False)):
        ans = _call(count_mha_parameters, d, H, bias=bias, name="count_mha_parameters")
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a whole number; got {type(ans).__name__}") from None
        if got != int(got):
            raise _Wrong(f"return a whole number of parameters; got {got}")
        got = int(got)
        ref = _mha_count(d, H, bias)
        if got == ref:
            continue
        b = d if bias else 0
        hd = d // H
        for value, hint in (
            (3 * (d * d + b), "forgot the output projection W_o (another d_model x d_model "
                              "matrix, plus its bias)"),
            (4 * d * d, "forgot the biases: each of the 4 projections has d_model of them"),
            (4 * (d * d + d), "with bias=False there are no bias vectors"),
            (H * 4 * (d * d + b), "the heads split d_model into num_heads slices of "
                                  "head_dim; they don't multiply the parameters"),
            (H * 3 * (d * d + b) + d * d + b, "the heads split d_model into num_heads slices of "
                                              "head_dim; they don't multiply the parameters"),
            (4 * (d * hd + (hd if bias else 0)),
             "each projection maps d_model to num_heads * head_dim = d_model, not to head_dim"),
        ):
            if got == value:
                raise _Wrong(hint)
        raise _Wrong(f"for d_model = {d}, num_heads = {H}, bias = {bias} the count is "
                     f"{ref:,}; got {got:,} (4 matrices of d_model x d_model, plus biases)")
    return f"GPT-2 small's attention (d_model = 768, 12 heads) has {_mha_count(768, 12, True):,} " \
           "parameters per layer."


def _entropy_inputs():
    rng = _rng(403)
    T = 5
    causal = _softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), rng.normal(size=(T, T)),
                               -np.inf))
    return [_softmax(rng.normal(size=(4, 6))), _softmax(rng.normal(size=(2, 3, 4))), causal,
            np.full((3, 4), 0.25)]


@_checker
def check_row_entropy(row_entropy):
    """``row_entropy(weights)`` -> the entropy (nats) of every row, shape ``weights.shape[:-1]``;
    a zero weight contributes 0 (0 * log 0 = 0). Torch tensors ``(..., T_q, T_k)``."""
    for w in _entropy_inputs():
        got = _arr(_call(row_entropy, _t(w.copy()), name="row_entropy"), "the entropies")
        ref = _entropy(w)
        if got.size == 1 and ref.size > 1:
            raise _Wrong(f"return one entropy per row, shape {ref.shape}, not a single number")
        if got.shape == w.shape[:-2] + (w.shape[-1],) and got.shape != ref.shape:
            raise _Wrong(f"sum over the last axis (the keys), one entropy per query row: expected "
                         f"shape {ref.shape}, got {got.shape}")
        _shape(got, ref.shape, "the entropies", "(one per query row: weights.shape[:-1])")
        if _close(got, ref):
            continue
        if np.isnan(got).any():
            raise _Wrong("nan: a masked weight is exactly 0 and 0 * log(0) = 0 * (-inf) = nan; "
                         "count it as 0 (torch.special.xlogy(p, p) or torch.where(p > 0, ...))")
        _diagnose(got, [
            ("the entropy is -sum(p * log p): you lost the minus sign", -ref),
            ("use the natural log (torch.log): the course measures entropy in nats",
             ref / math.log(2)),
            ("sum over the last axis (the keys of each query), not over the queries",
             _entropy(w, axis=-2) if w.shape[-1] == w.shape[-2] else None),
        ])
        raise _Wrong(f"the entropies differ from -sum(p log p) by up to {_maxdiff(got, ref)}")
    return "uniform weights over n keys have entropy log(n); a one-hot row has 0."


@_checker
def check_attention_patterns(make_patterns):
    """``make_patterns(T)`` -> ``{"uniform": ..., "peaked": ..., "local": ...}``, three ``(T, T)``
    weight matrices whose rows sum to 1: uniform (every weight 1/T), peaked (each query puts at
    least 0.9 on one key) and local (each query spreads its weight over keys j with |i - j| <= 1,
    every one of them > 0, and nothing elsewhere)."""
    notes = []
    for T in (6, 9):
        pats = _call(make_patterns, T, name="make_patterns")
        if not isinstance(pats, dict):
            raise _Wrong(f"return a dict with the keys 'uniform', 'peaked', 'local'; got "
                         f"{type(pats).__name__}")
        missing = [k for k in ("uniform", "peaked", "local") if k not in pats]
        if missing:
            raise _Wrong(f"the dict is missing {missing}; expected the keys 'uniform', 'peaked', "
                         "'local'")
        todo = [k for k in ("uniform", "peaked", "local") if pats[k] is None]
        if todo:
            raise _NotAttempted(f"make_patterns: {', '.join(repr(k) for k in todo)} still None")
        ent = {}
        for name in ("uniform", "peaked", "local"):
            w = _arr(pats[name], f"the {name} pattern")
            _shape(w, (T, T), f"the {name} pattern", "(T, T): one row per query")
            if (w < 0).any():
                raise _Wrong(f"the {name} pattern has negative weights")
            sums = w.sum(axis=-1)
            if not np.allclose(sums, 1.0):
                r = int(np.argmax(np.abs(sums - 1)))
                raise _Wrong(f"row {r} of the {name} pattern sums to {sums[r]:.4f}, not 1")
            ent[name] = float(_entropy(w).mean())
            if name == "uniform" and not np.allclose(w, 1.0 / T):
                raise _Wrong(f"uniform means every weight is 1/T = {1 / T:.4f}")
            if name == "peaked" and not (w.max(axis=-1) >= 0.9).all():
                r = int(np.argmin(w.max(axis=-1)))
                raise _Wrong(f"peaked: row {r}'s largest weight is {w[r].max():.4f}; each query "
                             "should put at least 0.9 on one key")
            if name == "local":
                i, j = np.indices((T, T))
                band = np.abs(i - j) <= 1
                if (w[~band] > 1e-9).any():
                    raise _Wrong("local: a query may only attend to keys j with |i - j| <= 1 "
                                 "(its neighbours and itself); weights outside that band must "
                                 "be 0")
                if (w[band] <= 0).any():
                    raise _Wrong("local: give every key with |i - j| <= 1 some weight (e.g. "
                                 "split it equally), not only one of them")
        if not ent["peaked"] < ent["local"] < ent["uniform"]:
            raise _Wrong("expected entropies peaked < local < uniform")
        notes.append(ent)
    e = notes[0]
    return (f"mean row entropy for T = 6: uniform {e['uniform']:.4f} > local {e['local']:.4f} > "
            f"peaked {e['peaked']:.4f} nats.")


