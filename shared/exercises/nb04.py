"""Exercise checkers for notebook 04 Multi-head attention (PyTorch).

Every reference is computed before the learner's code runs, from inputs the learner never sees
(the learner gets copies), so changing an input in place cannot change what it is judged
against. Answers computed in float32 are accepted (the tolerances are float32's).
"""

from __future__ import annotations

import copy
import math
import numbers

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _maxdiff,
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
    "check_fused_attention",
    "check_grouped_query_attention",
]

# float32 answers to float64 questions: ~1e-7 relative error per operation, a few operations deep
ATOL, RTOL = 1e-5, 1e-4


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=ATOL, rtol=RTOL))


def _diagnose(got, candidates) -> None:
    """Raise ``_Wrong(hint)`` for the first ``(hint, value)`` candidate that ``got`` matches."""
    for hint, value in candidates:
        if value is not None and _close(got, value):
            raise _Wrong(hint)


def _whole_number(ans, what: str) -> int:
    """A learner's count as an int: ints, whole floats, NumPy scalars and 0-d tensors are fine;
    text (even text that reads as a number), booleans and containers are not."""
    if isinstance(ans, torch.Tensor) and ans.numel() == 1:
        ans = ans.item()
    if isinstance(ans, np.generic):
        ans = ans.item()
    if isinstance(ans, str):
        raise _Wrong(f"you returned the text {ans!r}: return the number itself (an int), not a "
                     "string")
    if isinstance(ans, bool) or not isinstance(ans, numbers.Real):
        raise _Wrong(f"return {what} as a whole number (an int); got {type(ans).__name__}")
    if not math.isfinite(ans) or ans != int(ans):
        raise _Wrong(f"return {what} as a whole number; got {ans}")
    return int(ans)


# --------------------------------------------------------------------------------------------
# 4.1 Cross-attention
# --------------------------------------------------------------------------------------------
@_checker
def check_cross_attention(cross_attention):
    """``cross_attention(X_q, X_kv, W_q, W_k, W_v)`` -> ``(T_q, d_v)``: queries from ``X_q``
    ``(T_q, d_in)``, keys and values from ``X_kv`` ``(T_kv, d_in)``; scaled, no mask."""
    rng = _rng(401)
    # (T_q, T_kv, d_in, d_k, d_v, spread): different lengths; equal lengths (so swapped roles
    # keep the shape); d_k != d_v; large scores that overflow an exp without the max trick
    cases = ((3, 5, 4, 2, 3, 1.0), (4, 4, 3, 3, 2, 1.0), (2, 6, 5, 4, 7, 1.0),
             (3, 4, 4, 4, 3, 15.0))
    for T_q, T_kv, d_in, d_k, d_v, spread in cases:
        X_q = rng.normal(size=(T_q, d_in)) * spread
        X_kv = rng.normal(size=(T_kv, d_in)) * spread
        W_q, W_k, W_v = (rng.normal(size=(d_in, d_k)), rng.normal(size=(d_in, d_k)),
                         rng.normal(size=(d_in, d_v)))
        Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
        S = Q @ K.T
        ref = _softmax(S / math.sqrt(d_k)) @ V
        got = _arr(_call(cross_attention, _t(X_q.copy()), _t(X_kv.copy()), _t(W_q.copy()),
                         _t(W_k.copy()), _t(W_v.copy()), name="cross_attention",
                         on_error="hint: queries come from X_q; keys AND values both come from "
                                  "X_kv, which may have a different length"), "the output")
        if got.shape == (T_kv, d_v) and T_kv != T_q:
            raise _Wrong(f"the output has shape {got.shape}, one row per key: the queries must "
                         f"come from X_q, giving (T_q, d_v) = {(T_q, d_v)}")
        if got.shape == (T_q, T_kv) and T_kv != d_v:
            raise _Wrong(f"the output has shape {got.shape} = (T_q, T_kv): those are the "
                         "attention weights; multiply them by V = X_kv @ W_v")
        _shape(got, (T_q, d_v), "the output", "(T_q, d_v): one output per query")
        if _close(got, ref):
            continue
        if not np.isfinite(got).all():
            raise _Wrong("your output has nan or inf where the scores are large (this case has "
                         "scores in the hundreds): exp overflows; subtract each row's maximum "
                         "before exponentiating, or use torch.softmax")
        tri = np.tril(np.ones((T_q, T_kv), dtype=bool))
        swapped = None
        if T_q == T_kv:
            swapped = [
                ("the queries must come from X_q (Q = X_q @ W_q); yours come from X_kv",
                 _softmax((X_kv @ W_q) @ K.T / math.sqrt(d_k)) @ V),
                ("the keys must come from X_kv (K = X_kv @ W_k); yours come from X_q",
                 _softmax(Q @ (X_q @ W_k).T / math.sqrt(d_k)) @ V),
                ("the values must come from X_kv too (V = X_kv @ W_v); yours come from X_q",
                 _softmax(S / math.sqrt(d_k)) @ (X_q @ W_v)),
            ]
        _diagnose(got, [
            ("forgot the scaling: divide the scores by sqrt(d_k)", _softmax(S) @ V),
            ("divide by sqrt(d_k), the size of a query/key (W_q's columns), not sqrt(d_v)",
             _softmax(S / math.sqrt(d_v)) @ V if d_v != d_k else None),
            ("divide by sqrt(d_k), the size of a query/key (W_q's columns), not sqrt(d_in)",
             _softmax(S / math.sqrt(d_in)) @ V if d_in != d_k else None),
            ("cross-attention has no causal mask: every query may look at every key of X_kv",
             _softmax(np.where(tri, S, -np.inf) / math.sqrt(d_k)) @ V),
            ("softmax over the wrong axis: each query's weights (a row, dim=-1) must sum to 1",
             _softmax(S / math.sqrt(d_k), axis=0) @ V),
            *(swapped or []),
        ])
        raise _Wrong(f"the output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                     f"{_maxdiff(got, ref)} (case T_q = {T_q}, T_kv = {T_kv})")
    return "queries from one sequence, keys and values from another of a different length."


# --------------------------------------------------------------------------------------------
# 4.2 Split and merge heads
# --------------------------------------------------------------------------------------------
@_checker
def check_split_merge_heads(split_heads, merge_heads):
    """``split_heads(x, num_heads)``: ``(B, T, d)`` -> ``(B, num_heads, T, head_dim)`` with head h
    owning columns ``h*head_dim:(h+1)*head_dim``; ``merge_heads(y)`` undoes it. Torch tensors."""
    g = torch.Generator().manual_seed(402)
    for B, T, H, hd, dtype in ((2, 3, 4, 2, torch.float64), (1, 5, 3, 4, torch.float64),
                               (3, 4, 2, 3, torch.float32)):
        x = torch.randn(B, T, H * hd, generator=g, dtype=dtype)
        ref = x.view(B, T, H, hd).transpose(1, 2)  # a view of x: x itself is never given out
        ref_np, x_np = ref.double().numpy().copy(), x.double().numpy().copy()
        got = _arr(_call(split_heads, x.clone(), H, name="split_heads"), "split_heads(x)")
        if got.shape == (B, T, H, hd):
            raise _Wrong(f"split_heads(x) has shape {got.shape} = (B, T, H, head_dim): after "
                         "the view, swap dims 1 and 2 (.transpose(1, 2)) to put the heads before "
                         "the tokens")
        _shape(got, (B, H, T, hd), "split_heads(x)", "(B, num_heads, T, head_dim)")
        if not _close(got, ref_np):
            _diagnose(got, [
                ("you reshaped straight to (B, H, T, head_dim), which mixes tokens and heads: "
                 "view as (B, T, H, head_dim) first, then swap dims 1 and 2 (.transpose(1, 2))",
                 x_np.reshape(B, H, T, hd)),
                ("head h must own the contiguous columns h*head_dim:(h+1)*head_dim: view as "
                 "(B, T, H, head_dim), not (B, T, head_dim, H)",
                 x_np.reshape(B, T, hd, H).transpose(0, 3, 1, 2)),
            ])
            raise _Wrong(f"split_heads(x) differs from x.view(B, T, H, head_dim).transpose(1, 2) "
                         f"by up to {_maxdiff(got, ref_np)}")
        # merge_heads gets what attention produces, a contiguous (B, H, T, head_dim) tensor, and
        # what split_heads produces, a transposed view
        for y in (ref.contiguous().clone(), x.clone().view(B, T, H, hd).transpose(1, 2)):
            merged = _arr(_call(merge_heads, y, name="merge_heads",
                                on_error="hint: after transpose the tensor is not contiguous; use "
                                         ".contiguous().view(...) or .reshape(...)"),
                          "merge_heads(y)")
            _shape(merged, (B, T, H * hd), "merge_heads(y)", "(B, T, num_heads * head_dim)")
            if not _close(merged, x_np):
                _diagnose(merged, [
                    ("transpose back to (B, T, H, head_dim) before reshaping to (B, T, d): "
                     "y.transpose(1, 2).reshape(B, T, d)", ref_np.reshape(B, T, H * hd)),
                ])
                raise _Wrong("merge_heads(split_heads(x)) does not give x back")
    return "(B, T, d) -> (B, H, T, head_dim) -> (B, T, d) round-trips exactly."


# --------------------------------------------------------------------------------------------
# 4.3 Count the parameters
# --------------------------------------------------------------------------------------------
def _mha_count(d_model: int, num_heads: int, bias: bool) -> int:
    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)
    return sum(p.numel() for p in mha.parameters())


@_checker
def check_parameter_count(count_mha_parameters):
    """``count_mha_parameters(d_model, num_heads, bias=True)`` -> the number of parameters of
    ``torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)``: W_q, W_k, W_v and W_o
    (each d_model x d_model), plus one bias vector of d_model per projection when ``bias``."""
    answers = []
    for d, H, bias in ((768, 12, True), (64, 4, False), (10, 2, True), (12, 3, False),
                       (20, 1, True)):
        ans = _call(count_mha_parameters, d, H, bias=bias, name="count_mha_parameters")
        got = _whole_number(ans, "the number of parameters")
        answers.append(got)
        ref = _mha_count(d, H, bias)
        if got == ref:
            continue
        if len(answers) > 1 and len(set(answers)) == 1:
            raise _Wrong(f"you returned {got:,} for every size: compute the count from d_model "
                         "(and bias) instead of a fixed number")
        b = d if bias else 0
        hd = d // H
        for value, hint in (
            (3 * (d * d + b), "forgot the output projection W_o (another d_model x d_model "
                              "matrix, plus its bias)"),
            (4 * d * d, "forgot the biases: with bias=True each of the 4 projections has "
                        "d_model of them"),
            (4 * (d * d + d), "with bias=False there are no bias vectors"),
            (H * 4 * (d * d + b), "the heads split d_model into num_heads slices of "
                                  "head_dim; they don't multiply the parameters"),
            (H * 3 * (d * d + b) + d * d + b, "the heads split d_model into num_heads slices of "
                                              "head_dim; they don't multiply the parameters"),
            (4 * (d * hd + (hd if bias else 0)),
             "each projection maps d_model to num_heads * head_dim = d_model, not to head_dim"),
        ):
            if got == value and value != ref:
                raise _Wrong(f"{hint} (d_model = {d}, num_heads = {H}, bias = {bias})")
        raise _Wrong(f"for d_model = {d}, num_heads = {H}, bias = {bias} the count is "
                     f"{ref:,}; got {got:,} (4 matrices of d_model x d_model, plus biases)")
    return f"GPT-2 small's attention (d_model = 768, 12 heads) has {_mha_count(768, 12, True):,} " \
           "parameters per layer."


# --------------------------------------------------------------------------------------------
# 4.4 Multi-head attention from a fused c_attn, with SDPA
# --------------------------------------------------------------------------------------------
def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    B, T, d = t.shape
    return t.reshape(B, T, H, d // H).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    B, H, T, hd = t.shape
    return t.transpose(1, 2).reshape(B, T, H * hd)


def _fused_variants(x, c_attn, c_proj, H):
    """The reference and typical wrong versions of GPT-2-style attention, as NumPy arrays."""
    F = torch.nn.functional
    B, T, _ = x.shape
    d = c_proj.in_features
    qkv = c_attn(x)  # (B, T, 3d)
    q, k, v = qkv.split(d, dim=-1)

    def attend(q, k, v, causal=True, split=_heads, proj=True):
        ctx = F.scaled_dot_product_attention(split(q, H), split(k, H), split(v, H),
                                             is_causal=causal)
        ctx = _merge(ctx)
        return c_proj(ctx) if proj else ctx

    def direct(t, H):  # straight to (B, H, T, hd): mixes tokens and heads
        return t.reshape(B, H, T, t.shape[-1] // H)

    # per-head interleaved layout: [q_h, k_h, v_h] for each head in turn (not GPT-2's)
    inter = qkv.reshape(B, T, H, 3 * (d // H)).transpose(1, 2)  # (B, H, T, 3 hd)
    qi, ki, vi = inter.split(d // H, dim=-1)
    ctx_inter = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True)

    def unscaled():
        Qh, Kh, Vh = _heads(q, H), _heads(k, H), _heads(v, H)
        s = Qh @ Kh.transpose(-2, -1)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return c_proj(_merge(torch.softmax(s, dim=-1) @ Vh))

    def no_transpose_merge():
        ctx = F.scaled_dot_product_attention(_heads(q, H), _heads(k, H), _heads(v, H),
                                             is_causal=True)
        return c_proj(ctx.reshape(B, T, d))

    with torch.no_grad():
        ref = attend(q, k, v)
        wrong = [
            ("GPT-2's attention is causal: pass is_causal=True to scaled_dot_product_attention",
             attend(q, k, v, causal=False)),
            ("c_attn's output is [Q | K | V] in that order: q, k, v = c_attn(x).split(d, dim=-1) "
             "(you took the keys as queries)", attend(k, q, v)),
            ("c_attn's output is [Q | K | V] in that order: q, k, v = c_attn(x).split(d, dim=-1) "
             "(you mixed up K and V)", attend(q, v, k)),
            ("split c_attn(x) into Q, K and V first (three blocks of d features), then each into "
             "heads: GPT-2's c_attn is not interleaved per head", c_proj(_merge(ctx_inter))),
            ("you reshaped straight to (B, H, T, head_dim), which mixes tokens and heads: view "
             "as (B, T, H, head_dim), then .transpose(1, 2)", attend(q, k, v, split=direct)),
            ("transpose the heads back to (B, T, H, head_dim) before merging them to (B, T, d)",
             no_transpose_merge()),
            ("finish with the output projection: return c_proj(merged heads)",
             attend(q, k, v, proj=False)),
            ("forgot the scaling: divide the scores by sqrt(head_dim) (SDPA does it for you)",
             unscaled()),
        ]
    return ref.double().numpy(), [(h, w.double().numpy()) for h, w in wrong]


@_checker
def check_fused_attention(fused_attention):
    """``fused_attention(x, c_attn, c_proj, num_heads)`` -> ``(B, T, d)``: causal multi-head
    self-attention the GPT-2 way, ``q, k, v = c_attn(x).split(d, dim=-1)``, each split into heads,
    ``F.scaled_dot_product_attention(..., is_causal=True)``, heads merged, then ``c_proj``.
    ``c_attn`` is an ``nn.Linear(d, 3 d)``, ``c_proj`` an ``nn.Linear(d, d)``."""
    for seed, (B, T, d, H) in enumerate(((2, 5, 12, 3), (1, 7, 8, 2), (3, 4, 16, 4))):
        torch.manual_seed(404 + seed)  # the checker runs inside fork_rng: nothing leaks out
        c_attn = torch.nn.Linear(d, 3 * d).double()
        c_proj = torch.nn.Linear(d, d).double()
        x = torch.randn(B, T, d, dtype=torch.float64)
        ref, wrong = _fused_variants(x, c_attn, c_proj, H)
        ans = _call(fused_attention, x.clone(), copy.deepcopy(c_attn), copy.deepcopy(c_proj), H,
                    name="fused_attention",
                    on_error="hint: q, k, v = c_attn(x).split(d, dim=-1); view each as "
                             "(B, T, H, head_dim) and .transpose(1, 2)")
        if isinstance(ans, tuple):
            raise _Wrong("return only the output tensor (B, T, d), not a tuple")
        got = _arr(ans, "the output")
        _shape(got, (B, T, d), "the output", "(B, T, d), like x")
        if _close(got, ref):
            continue
        _diagnose(got, wrong)
        raise _Wrong(f"the output differs from GPT-2-style attention by up to "
                     f"{_maxdiff(got, ref)} (case B = {B}, T = {T}, d = {d}, num_heads = {H})")
    return "one projection for Q, K and V, every head in one SDPA call: GPT-2's c_attn form."


# --------------------------------------------------------------------------------------------
# 4.5 Grouped-query attention
# --------------------------------------------------------------------------------------------
def _gqa(Q, K, V, group):
    K = np.repeat(K, group, axis=-3)  # kv head j serves query heads j*group ... (j+1)*group - 1
    V = np.repeat(V, group, axis=-3)
    return _softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])) @ V


@_checker
def check_grouped_query_attention(grouped_query_attention):
    """``grouped_query_attention(Q, K, V)`` -> ``(B, H, T_q, d_v)``: Q ``(B, H, T_q, d_k)``, K
    ``(B, H_kv, T_k, d_k)`` and V ``(B, H_kv, T_k, d_v)`` with ``H`` a multiple of ``H_kv``;
    query head ``h`` uses key/value head ``h // (H // H_kv)``; scaled, no mask."""
    rng = _rng(405)
    # (B, H, H_kv, T_q, T_k, d_k, d_v): groups of 2, 4 (hard-coded 2 fails), 1 (plain MHA) and
    # H_kv = 1 (multi-query); T_q != T_k (a few new queries against a longer cache)
    cases = ((2, 4, 2, 3, 5, 4, 4), (1, 8, 2, 4, 4, 3, 2), (2, 3, 3, 2, 6, 4, 5),
             (1, 6, 1, 5, 3, 2, 3))
    for B, H, H_kv, T_q, T_k, d_k, d_v in cases:
        Q = rng.normal(size=(B, H, T_q, d_k))
        K = rng.normal(size=(B, H_kv, T_k, d_k))
        V = rng.normal(size=(B, H_kv, T_k, d_v))
        g = H // H_kv
        ref = _gqa(Q, K, V, g)
        got = _arr(_call(grouped_query_attention, _t(Q.copy()), _t(K.copy()), _t(V.copy()),
                         name="grouped_query_attention",
                         on_error="hint: give every query head its key/value head first, e.g. "
                                  "K.repeat_interleave(H // H_kv, dim=1)"), "the output")
        if got.shape == (B, H_kv, T_q, d_v) and H_kv != H:
            raise _Wrong(f"the output has {H_kv} heads, one per key/value head: every query head "
                         f"keeps its own output, shape (B, H, T_q, d_v) = {(B, H, T_q, d_v)}")
        _shape(got, (B, H, T_q, d_v), "the output", "(B, H, T_q, d_v): one output per query head")
        if _close(got, ref):
            continue
        cyc = np.tile(np.arange(H_kv), g)  # what .repeat(1, g, 1, 1) gives: kv head h % H_kv
        _diagnose(got, [
            ("query head h must use key/value head h // (H // H_kv): neighbouring query heads "
             "share one; .repeat(...) cycles the key/value heads (h % H_kv), use "
             ".repeat_interleave(H // H_kv, dim=1)",
             _softmax(Q @ np.swapaxes(K[:, cyc], -1, -2) / math.sqrt(d_k)) @ V[:, cyc]),
            ("forgot the scaling: divide the scores by sqrt(d_k)",
             _gqa(Q * math.sqrt(d_k), K, V, g)),
            ("grouped-query attention has no causal mask here: every query may look at every key",
             None if T_q != T_k else
             _softmax(np.where(np.tril(np.ones((T_q, T_k), dtype=bool)),
                               Q @ np.swapaxes(np.repeat(K, g, axis=-3), -1, -2), -np.inf)
                      / math.sqrt(d_k)) @ np.repeat(V, g, axis=-3)),
        ])
        raise _Wrong(f"the output differs from attention with each key/value head shared by "
                     f"{g} query heads by up to {_maxdiff(got, ref)} (case H = {H}, "
                     f"H_kv = {H_kv})")
    return ("query heads share key/value heads in groups: the KV cache shrinks by "
            "H / H_kv, the queries keep their own heads.")

