"""shared.modules against the NumPy reference (shared.attention) and against PyTorch's own layers.

Weight layouts: the math's ``W_q`` (d_in, d_out) is ``SelfAttentionV1.W_query`` and the
transpose of every ``nn.Linear`` weight (``W_query.weight.T``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shared.attention import multi_head_attention, scaled_dot_product_attention, self_attention
from shared.modules import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_weights,
    naive_attention,
)

ATOL = 1e-5


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().astype(np.float64)


def W(lin: nn.Linear) -> np.ndarray:
    """The math's (d_in, d_out) matrix of an nn.Linear."""
    return np_(lin.weight.T)


def blocked(T_q: int, T_k: int) -> torch.Tensor:
    """nn.MultiheadAttention's boolean mask convention: True = may NOT attend."""
    return ~torch.ones(T_q, T_k, dtype=torch.bool).tril()


# ------------------------------------------------------------------ the functional core
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (5, 5, 4, 3), (4, 9, 8, 2), (7, 3, 16, 5)])
def test_naive_attention_matches_numpy_and_torch(shape, causal):
    T_q, T_k, d_k, d_v = shape
    g = torch.Generator().manual_seed(sum(shape) + causal)
    Q, K, V = (torch.randn(2, 3, T, d, generator=g) for T, d in ((T_q, d_k), (T_k, d_k), (T_k, d_v)))
    out, weights = naive_attention(Q, K, V, causal=causal)
    ref_out, ref_w = scaled_dot_product_attention(np_(Q), np_(K), np_(V), causal=causal)
    np.testing.assert_allclose(np_(out), ref_out, atol=ATOL)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)
    torch_out = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    assert torch.allclose(out, torch_out, atol=ATOL)
    assert torch.equal(attention_weights(Q, K, causal=causal), weights)


def test_hand_derived_weights():
    # Q = K = [[1, 0], [0, 1]], d_k = 2: scores [[1, 0], [0, 1]] / sqrt(2)
    Q = torch.eye(2)
    w = attention_weights(Q, Q)
    a = math.exp(1 / math.sqrt(2))
    assert torch.allclose(w, torch.tensor([[a, 1.0], [1.0, a]]) / (a + 1), atol=1e-6)
    # causal: the first query sees only itself
    assert torch.allclose(attention_weights(Q, Q, causal=True)[0], torch.tensor([1.0, 0.0]))


def test_attention_weights_guards_row_wise_and_keeps_a_nan_visible():
    # row 1 may see nothing; query 2 carries a NaN, as a bug upstream would
    g = torch.Generator().manual_seed(7)
    Q, K = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    Q[2, 0] = float("nan")
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    w = attention_weights(Q, K, mask=mask)
    assert torch.equal(w[1], torch.zeros(3))  # the empty row: zeros, as SDPA gives
    assert torch.isnan(w[2]).all()  # the NaN row stays NaN: not hidden by the guard
    assert torch.equal(w[0], torch.tensor([1.0, 0.0, 0.0]))
    # naive_attention keeps notebook 05's blunt nan_to_num: the same empty row, the NaN hidden
    _, w_naive = naive_attention(Q, K, torch.randn(3, 2, generator=g), mask=mask)
    assert torch.equal(w_naive[1], torch.zeros(3)) and torch.equal(w_naive[2], torch.zeros(3))
    # unmasked, no guard at all: a NaN input gives NaN weights
    assert torch.isnan(attention_weights(Q, K)[2]).all()


def test_fully_masked_row_gives_zeros_not_nan():
    Q = K = V = torch.randn(1, 3, 4)
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    out, w = naive_attention(Q, K, V, mask=mask)
    assert not torch.isnan(out).any()
    assert torch.equal(w[0, 1], torch.zeros(3)) and torch.equal(out[0, 1], torch.zeros(4))
    ref_out, _ = scaled_dot_product_attention(np_(Q), np_(K), np_(V), mask=mask.numpy())
    np.testing.assert_allclose(np_(out), ref_out, atol=ATOL)


# ------------------------------------------------------------------ v1 and v2
@pytest.mark.parametrize("d_in, d_out, T", [(3, 2, 6), (4, 4, 1), (8, 5, 7)])
def test_v1_matches_numpy_reference_and_sdpa(d_in, d_out, T):
    torch.manual_seed(d_in * 10 + d_out)
    v1 = SelfAttentionV1(d_in, d_out)
    x = torch.randn(T, d_in)
    out, weights = v1(x, return_weights=True)
    ref_out, ref_w = self_attention(np_(x), np_(v1.W_query), np_(v1.W_key), np_(v1.W_value))
    np.testing.assert_allclose(np_(out), ref_out, atol=ATOL)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)
    Q, K, V = x @ v1.W_query, x @ v1.W_key, x @ v1.W_value
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V), atol=ATOL)
    assert torch.equal(v1(x), out)
    # batched input gives the same as row by row
    xb = torch.stack([x, x.flip(0)])
    assert torch.allclose(v1(xb)[1], v1(x.flip(0)), atol=1e-6)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_v2_equals_v1_after_copying_transposed_weights(qkv_bias):
    torch.manual_seed(1)
    v1, v2 = SelfAttentionV1(5, 3), SelfAttentionV2(5, 3, qkv_bias=qkv_bias)
    x = torch.randn(2, 6, 5)
    with torch.no_grad():
        v2.W_query.weight.copy_(v1.W_query.T)
        v2.W_key.weight.copy_(v1.W_key.T)
        v2.W_value.weight.copy_(v1.W_value.T)
        if qkv_bias:  # zero bias: the same function; a non-zero one must change it
            for lin in (v2.W_query, v2.W_key, v2.W_value):
                lin.bias.zero_()
    assert torch.allclose(v1(x), v2(x), atol=1e-6)
    ref_out, _ = self_attention(np_(x), W(v2.W_query), W(v2.W_key), W(v2.W_value))
    np.testing.assert_allclose(np_(v2(x)), ref_out, atol=ATOL)
    if qkv_bias:
        with torch.no_grad():
            v2.W_value.bias.fill_(1.0)
        assert torch.allclose(v2(x), v1(x) + 1.0, atol=1e-5)  # weights sum to 1: V + 1 -> out + 1


def test_v2_without_bias_has_none_and_weight_layout_is_out_in():
    v2 = SelfAttentionV2(5, 3)
    assert v2.W_query.bias is None
    assert tuple(v2.W_query.weight.shape) == (3, 5)
    assert tuple(SelfAttentionV1(5, 3).W_query.shape) == (5, 3)


# ------------------------------------------------------------------ causal attention
@pytest.mark.parametrize("B, T, ctx, d_in, d_out", [(1, 1, 1, 2, 2), (2, 6, 6, 3, 2), (3, 5, 10, 8, 4)])
def test_causal_attention_matches_numpy_and_sdpa(B, T, ctx, d_in, d_out):
    torch.manual_seed(B + T + ctx)
    ca = CausalAttention(d_in, d_out, context_length=ctx, dropout=0.0)
    x = torch.randn(B, T, d_in)
    out, weights = ca(x, return_weights=True)
    assert out.shape == (B, T, d_out) and weights.shape == (B, T, T)
    ref_out, ref_w = self_attention(np_(x), W(ca.W_query), W(ca.W_key), W(ca.W_value), causal=True)
    np.testing.assert_allclose(np_(out), ref_out, atol=ATOL)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)
    sdpa = F.scaled_dot_product_attention(ca.W_query(x), ca.W_key(x), ca.W_value(x), is_causal=True)
    assert torch.allclose(out, sdpa, atol=ATOL)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # nothing from the future


def test_mask_is_a_buffer_of_context_length_sliced_to_T():
    torch.manual_seed(0)
    ca = CausalAttention(4, 3, context_length=8, dropout=0.0)
    assert "mask" in dict(ca.named_buffers()) and "mask" not in ca.state_dict()  # derived state
    assert "mask" not in dict(ca.named_parameters())
    assert ca.mask.dtype == torch.bool and ca.mask.shape == (8, 8)
    assert torch.equal(ca.mask, torch.ones(8, 8, dtype=torch.bool).tril())
    x = torch.randn(2, 5, 4)
    before = ca(x)
    with torch.no_grad():  # corrupt the part beyond T = 5: the output must not change
        ca.mask[5:, :] = False
        ca.mask[:, 5:] = True
    assert torch.equal(ca(x), before)
    with torch.no_grad():  # corrupt the used (5, 5) corner: now it must change
        ca.mask[4, 3] = False
    assert not torch.allclose(ca(x), before)


def test_causal_attention_future_tokens_do_not_change_the_past():
    torch.manual_seed(2)
    ca = CausalAttention(4, 4, context_length=6, dropout=0.0)
    x = torch.randn(1, 6, 4)
    y = x.clone()
    y[0, 4:] = torch.randn(2, 4)
    assert torch.allclose(ca(x)[0, :4], ca(y)[0, :4], atol=1e-6)
    assert not torch.allclose(ca(x)[0, 4:], ca(y)[0, 4:])


def test_dropout_train_vs_eval():
    p = 0.5
    torch.manual_seed(3)
    ca = CausalAttention(6, 4, context_length=16, dropout=p)
    x = torch.randn(4, 16, 6)
    ca.eval()
    out_eval, w_eval = ca(x, return_weights=True)
    assert torch.equal(ca(x), out_eval)  # eval: deterministic
    ref_out, _ = self_attention(np_(x), W(ca.W_query), W(ca.W_key), W(ca.W_value), causal=True)
    np.testing.assert_allclose(np_(out_eval), ref_out, atol=ATOL)  # eval: no dropout at all
    ca.train()
    torch.manual_seed(10)
    out_a, w_train = ca(x, return_weights=True)
    torch.manual_seed(10)
    out_b = ca(x)
    assert torch.equal(out_a, out_b)  # seeded: reproducible
    assert not torch.allclose(out_a, out_eval)
    # each allowed weight is either dropped (0) or scaled up by 1 / (1 - p)
    allowed = w_eval > 0
    kept = w_train[allowed] != 0
    assert torch.allclose(w_train[allowed][kept], w_eval[allowed][kept] / (1 - p), atol=1e-6)
    assert 0.4 < (~kept).float().mean().item() < 0.6
    assert torch.allclose(out_a, w_train @ ca.W_value(x), atol=1e-6)  # the returned weights were used


def test_dropout_zero_in_train_mode_changes_nothing():
    torch.manual_seed(4)
    ca = CausalAttention(3, 2, context_length=5, dropout=0.0).train()
    x = torch.randn(2, 5, 3)
    assert torch.equal(ca(x), ca.eval()(x))


# ------------------------------------------------------------------ multi-head
def copy_wrapper_into_mha(wrapper: MultiHeadAttentionWrapper, mha: MultiHeadAttention) -> None:
    """Head h's (d_out_per_head, d_in) weights become rows h*hd:(h+1)*hd; out_proj = identity."""
    hd = mha.head_dim
    with torch.no_grad():
        for h, head in enumerate(wrapper.heads):
            for name in ("W_query", "W_key", "W_value"):
                getattr(mha, name).weight[h * hd:(h + 1) * hd] = getattr(head, name).weight
        mha.out_proj.weight.copy_(torch.eye(mha.d_out))
        mha.out_proj.bias.zero_()


@pytest.mark.parametrize("B, T, d_in, head_dim, H", [(1, 4, 3, 2, 2), (2, 6, 8, 4, 3), (3, 7, 5, 1, 4)])
def test_wrapper_matches_numpy_and_equals_mha(B, T, d_in, head_dim, H):
    torch.manual_seed(B * H + T)
    wrapper = MultiHeadAttentionWrapper(d_in, head_dim, context_length=T, dropout=0.0, num_heads=H)
    x = torch.randn(B, T, d_in)
    out, weights = wrapper(x, return_weights=True)
    assert out.shape == (B, T, H * head_dim) and weights.shape == (B, H, T, T)
    cat = {n: np.concatenate([W(getattr(h, n)) for h in wrapper.heads], axis=1)
           for n in ("W_query", "W_key", "W_value")}
    ref_out, ref_w = multi_head_attention(np_(x), cat["W_query"], cat["W_key"], cat["W_value"],
                                          num_heads=H, causal=True)
    np.testing.assert_allclose(np_(out), ref_out, atol=ATOL)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)
    mha = MultiHeadAttention(d_in, H * head_dim, context_length=T, dropout=0.0, num_heads=H)
    copy_wrapper_into_mha(wrapper, mha)
    mha_out, mha_w = mha(x, return_weights=True)
    assert torch.allclose(mha_out, out, atol=1e-6)
    assert torch.allclose(mha_w, weights, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B, T, d_in, d_out, H", [(1, 1, 4, 4, 1), (2, 5, 6, 6, 2), (3, 8, 5, 12, 4), (2, 7, 16, 16, 8)])
def test_mha_matches_numpy_reference(B, T, d_in, d_out, H, causal):
    torch.manual_seed(B + T + H)
    mha = MultiHeadAttention(d_in, d_out, context_length=10, dropout=0.0, num_heads=H,
                             causal=causal)
    x = torch.randn(B, T, d_in)
    out, weights = mha(x, return_weights=True)
    assert out.shape == (B, T, d_out) and weights.shape == (B, H, T, T)
    ref_out, ref_w = multi_head_attention(
        np_(x), W(mha.W_query), W(mha.W_key), W(mha.W_value), num_heads=H,
        W_o=W(mha.out_proj), causal=causal,
    )
    np.testing.assert_allclose(np_(out), ref_out + np_(mha.out_proj.bias), atol=ATOL)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B, T, d, H", [(1, 3, 4, 1), (2, 6, 8, 2), (3, 9, 12, 4), (2, 5, 768 // 16, 12 // 4)])
def test_mha_equals_torch_multiheadattention(B, T, d, H, causal, qkv_bias):
    torch.manual_seed(B * T + d + H)
    ours = MultiHeadAttention(d, d, context_length=T, dropout=0.0, num_heads=H, qkv_bias=qkv_bias,
                              causal=causal).eval()
    theirs = ours.to_torch().eval()
    assert tuple(theirs.in_proj_weight.shape) == (3 * d, d)
    assert torch.equal(theirs.in_proj_weight[:d], ours.W_query.weight)  # [W_q; W_k; W_v], (out, in)
    assert torch.equal(theirs.in_proj_weight[2 * d:], ours.W_value.weight)
    x = torch.randn(B, T, d)
    out, weights = ours(x, return_weights=True)
    ref, ref_w = theirs(x, x, x, attn_mask=blocked(T, T) if causal else None, need_weights=True,
                        average_attn_weights=False)
    assert torch.allclose(out, ref, atol=ATOL)
    assert torch.allclose(weights, ref_w, atol=ATOL)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mha_loads_weights_from_torch(qkv_bias):
    torch.manual_seed(5)
    d, H, T = 8, 2, 5
    theirs = nn.MultiheadAttention(d, H, bias=qkv_bias, batch_first=True).eval()
    ours = MultiHeadAttention(d, d, context_length=T, dropout=0.0, num_heads=H, qkv_bias=qkv_bias,
                              causal=False).load_from_torch(theirs)
    assert torch.equal(ours.W_key.weight, theirs.in_proj_weight[d:2 * d])
    x = torch.randn(3, T, d)
    ref, _ = theirs(x, x, x)
    assert torch.allclose(ours(x), ref, atol=ATOL)


def test_load_from_torch_refuses_a_bias_it_cannot_hold():
    theirs = nn.MultiheadAttention(4, 2, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_bias.fill_(0.5)
    ours = MultiHeadAttention(4, 4, context_length=3, dropout=0.0, num_heads=2, qkv_bias=False)
    with pytest.raises(ValueError, match="qkv_bias=True"):
        ours.load_from_torch(theirs)
    with pytest.raises(ValueError, match="num_heads = 4"):
        MultiHeadAttention(4, 4, 3, 0.0, num_heads=4).load_from_torch(theirs)
    with pytest.raises(ValueError, match="d_in == d_out"):
        MultiHeadAttention(3, 4, 3, 0.0, num_heads=2).to_torch()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T_q, T_k", [(3, 7), (6, 2), (4, 4)])
def test_cross_attention_matches_sdpa_and_numpy(T_q, T_k, causal):
    torch.manual_seed(T_q * 10 + T_k)
    d, H = 8, 2
    mha = MultiHeadAttention(d, d, context_length=8, dropout=0.0, num_heads=H, causal=causal)
    x, x_kv = torch.randn(2, T_q, d), torch.randn(2, T_k, d)
    out, weights = mha(x, x_kv, return_weights=True)
    assert out.shape == (2, T_q, d) and weights.shape == (2, H, T_q, T_k)

    def heads(t):  # (B, T, d) -> (B, H, T, head_dim), written independently of the module
        return t.reshape(t.shape[0], t.shape[1], H, d // H).permute(0, 2, 1, 3)

    Q, K, V = heads(mha.W_query(x)), heads(mha.W_key(x_kv)), heads(mha.W_value(x_kv))
    sdpa = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    expected = mha.out_proj(sdpa.permute(0, 2, 1, 3).reshape(2, T_q, d))
    assert torch.allclose(out, expected, atol=ATOL)
    ref_ctx, ref_w = scaled_dot_product_attention(np_(Q), np_(K), np_(V), causal=causal)
    np.testing.assert_allclose(np_(weights), ref_w, atol=ATOL)
    theirs = mha.to_torch().eval()
    ref, _ = theirs(x, x_kv, x_kv, attn_mask=blocked(T_q, T_k) if causal else None)
    assert torch.allclose(out, ref, atol=ATOL)


def test_head_split_puts_head_h_in_its_own_columns():
    # Only head 1's value columns are non-zero: head 0's part of the context must be zero.
    torch.manual_seed(6)
    mha = MultiHeadAttention(4, 4, context_length=3, dropout=0.0, num_heads=2)
    with torch.no_grad():
        mha.W_value.weight[:2] = 0.0
        mha.out_proj.weight.copy_(torch.eye(4))
        mha.out_proj.bias.zero_()
    out = mha(torch.randn(1, 3, 4))
    assert torch.equal(out[..., :2], torch.zeros(1, 3, 2))
    assert (out[..., 2:] != 0).any()


def test_mha_dropout_train_vs_eval():
    torch.manual_seed(7)
    mha = MultiHeadAttention(8, 8, context_length=12, dropout=0.3, num_heads=2)
    x = torch.randn(2, 12, 8)
    mha.eval()
    out_eval = mha(x)
    assert torch.allclose(out_eval, mha.to_torch().eval()(x, x, x, attn_mask=blocked(12, 12))[0],
                          atol=ATOL)
    mha.train()
    assert not torch.allclose(mha(x), out_eval)


def test_parameter_count_gpt2_small():
    d, H = 768, 12
    expected = 4 * d * d + 4 * d  # W_q, W_k, W_v, W_o and their biases
    assert expected == 2_362_368
    ours = MultiHeadAttention(d, d, context_length=1024, dropout=0.0, num_heads=H, qkv_bias=True)
    assert sum(p.numel() for p in ours.parameters()) == expected
    assert sum(p.numel() for p in nn.MultiheadAttention(d, H).parameters()) == expected


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "make, x, match",
    [
        (lambda: CausalAttention(3, 2, 4), torch.randn(4, 3), r"3-D \(B, T, d_in\).*got shape \(4, 3\).*unsqueeze"),
        (lambda: CausalAttention(3, 2, 4), torch.randn(1, 4, 5), r"d_in = 3; got shape \(1, 4, 5\)"),
        (lambda: CausalAttention(3, 2, 4), torch.randn(1, 5, 3), r"T = 5 .*context_length = 4"),
        (lambda: CausalAttention(3, 2, 4), np.zeros((1, 2, 3)), r"torch.Tensor; got ndarray"),
        (lambda: CausalAttention(3, 2, 4), torch.ones(1, 2, 3, dtype=torch.long), r"floating-point.*torch.int64"),
        (lambda: MultiHeadAttention(4, 4, 3, 0.0, 2), torch.randn(2, 2, 2, 4), r"3-D \(B, T, d_in\).*4-D"),
        (lambda: MultiHeadAttention(4, 4, 3, 0.0, 2), torch.randn(1, 4, 4), r"T = 4 .*context_length = 3"),
        (lambda: SelfAttentionV1(3, 2), torch.randn(2, 4), r"d_in = 3; got shape \(2, 4\)"),
        (lambda: SelfAttentionV2(3, 2), torch.randn(3), r"\(T, d_in\) or \(B, T, d_in\).*got shape \(3,\)"),
        (lambda: MultiHeadAttentionWrapper(3, 2, 4, 0.0, 2), torch.randn(4, 3), r"3-D"),
    ],
)
def test_bad_input_messages(make, x, match):
    module = make()
    with pytest.raises((ValueError, TypeError), match=match):
        module(x)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"divisible by num_heads; got d_out = 6, num_heads = 4"):
        MultiHeadAttention(4, 6, 8, 0.0, num_heads=4)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\); got 1.5"):
        CausalAttention(3, 2, 4, dropout=1.5)
    with pytest.raises(ValueError, match="context_length must be a positive integer; got 0"):
        CausalAttention(3, 2, 0)
    with pytest.raises(ValueError, match="d_out must be a positive integer"):
        SelfAttentionV1(3, 2.5)


def test_cross_attention_batch_mismatch():
    mha = MultiHeadAttention(4, 4, 5, 0.0, 2)
    with pytest.raises(ValueError, match=r"same batch size B; got x \(2, 3, 4\) and x_kv \(1, 3, 4\)"):
        mha(torch.randn(2, 3, 4), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="x_kv's last dimension must be d_in = 4"):
        mha(torch.randn(2, 3, 4), torch.randn(2, 3, 5))


# ------------------------------------------------------------------ FusedQKVAttention (04)
def fused_pair(d=12, H=3, causal=True, seed=0):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d, d, 16, 0.0, H, qkv_bias=True, causal=causal).eval()
    from shared.modules import FusedQKVAttention

    fused = FusedQKVAttention(d, d, H, causal=causal).eval().load_from(mha)
    return mha, fused


@pytest.mark.parametrize("causal", [True, False])
def test_fused_qkv_equals_multi_head_attention(causal):
    mha, fused = fused_pair(causal=causal)
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), mha(x), atol=ATOL, rtol=0)
    # c_attn stacks W_query, W_key, W_value row-wise: one d -> 3d projection
    assert fused.c_attn.weight.shape == (36, 12)
    assert torch.equal(fused.c_attn.weight[12:24], mha.W_key.weight)


def test_fused_qkv_equals_torch_multihead_attention():
    from shared.modules import FusedQKVAttention

    torch.manual_seed(1)
    torch_mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    fused = FusedQKVAttention(8, 8, 2, causal=True).eval().load_from(torch_mha)
    x = torch.randn(3, 5, 8)
    blocked = ~torch.ones(5, 5, dtype=torch.bool).tril()  # nn.MultiheadAttention: True = blocked
    with torch.no_grad():
        ref = torch_mha(x, x, x, attn_mask=blocked, need_weights=False)[0]
        torch.testing.assert_close(fused(x), ref, atol=ATOL, rtol=0)


def test_fused_qkv_mask_is_may_attend_and_combines_with_causal():
    _, fused = fused_pair(d=8, H=2)
    x = torch.randn(1, 6, 8)
    keep = torch.ones(6, 6, dtype=torch.bool)
    keep[:, 1] = False  # nobody may attend to token 1 (padding)
    with torch.no_grad():
        q, k, v = fused.c_attn(x).split(8, dim=-1)
        q, k, v = (t.view(1, 6, 2, 4).transpose(1, 2) for t in (q, k, v))
        ctx, _ = naive_attention(q, k, v, causal=True, mask=keep)
        ref = fused.c_proj(ctx.transpose(1, 2).reshape(1, 6, 8))
        torch.testing.assert_close(fused(x, mask=keep), ref, atol=ATOL, rtol=0)
    with pytest.raises(TypeError, match="mask must be a boolean tensor .*got dtype torch.float32"):
        fused(x, mask=keep.float())


def test_fused_qkv_gpt2_layout_round_trip():
    from shared.modules import FusedQKVAttention

    _, fused = fused_pair()
    state = fused.gpt2_state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "c_attn.weight": (12, 36), "c_attn.bias": (36,), "c_proj.weight": (12, 12), "c_proj.bias": (12,)}
    assert torch.equal(state["c_attn.weight"], fused.c_attn.weight.T)  # Conv1D: (in, out)
    other = FusedQKVAttention(12, 12, 3).eval().load_gpt2_state_dict(state)
    x = torch.randn(2, 4, 12)
    with torch.no_grad():
        torch.testing.assert_close(other(x), fused(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"c_attn.weight must have shape \(12, 36\) .*got \(36, 12\)"):
        other.load_gpt2_state_dict({**state, "c_attn.weight": state["c_attn.weight"].T})
    with pytest.raises(KeyError, match="missing 'c_proj.bias'"):
        other.load_gpt2_state_dict({k: v for k, v in state.items() if k != "c_proj.bias"})


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_fused_qkv_matches_hugging_face_gpt2_attention(impl):
    """The mapping to GPT-2's c_attn/c_proj, checked against transformers' own GPT2Attention
    (random weights, no download). The module alone gets its causal mask passed explicitly."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    from shared.modules import FusedQKVAttention

    config = GPT2Config(n_embd=16, n_head=4, n_positions=32, attn_pdrop=0.0, resid_pdrop=0.0)
    config._attn_implementation = impl
    torch.manual_seed(2)
    theirs = GPT2Attention(config, layer_idx=0).eval()
    ours = FusedQKVAttention(16, 16, 4).eval().load_gpt2_state_dict(theirs.state_dict())
    x = torch.randn(2, 7, 16)
    additive_causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x, attention_mask=additive_causal)[0],
                                   atol=ATOL, rtol=0)


def test_gpt2_small_parameter_budget():
    """Notebook 04's context: 12 attention layers of 4d^2 + 4d = 2,362,368 parameters are 28.3 M
    of GPT-2 small's 124,439,808 (counted by transformers on the meta device: no memory, no
    download)."""
    from transformers import GPT2Config, GPT2Model

    with torch.device("meta"):
        model = GPT2Model(GPT2Config())
    total = sum(p.numel() for p in model.parameters())
    attention = sum(p.numel() for name, p in model.named_parameters() if ".attn." in name)
    assert total == 124_439_808
    assert attention == 12 * (4 * 768 * 768 + 4 * 768) == 28_348_416


def test_fused_qkv_dropout_only_in_training():
    _, fused = fused_pair()
    fused.dropout = 0.5
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        torch.testing.assert_close(fused.eval()(x), fused.eval()(x))
        torch.manual_seed(0)
        a = fused.train()(x)
        torch.manual_seed(1)
        b = fused.train()(x)
    assert not torch.allclose(a, b)


def test_fused_qkv_bad_input():
    from shared.modules import FusedQKVAttention

    with pytest.raises(ValueError, match=r"divisible by num_heads; got d_out = 10, num_heads = 4"):
        FusedQKVAttention(8, 10, 4)
    fused = FusedQKVAttention(8, 8, 2)
    with pytest.raises(ValueError, match=r"3-D \(B, T, d_in\) with d_in = 8; got shape \(5, 8\)"):
        fused(torch.randn(5, 8))
    with pytest.raises(TypeError, match="expected a MultiHeadAttention or a torch.nn.MultiheadAttention"):
        fused.load_from(nn.Linear(8, 8))
    with pytest.raises(ValueError, match=r"shape mismatch: the source has \(d_in, d_out, num_heads\) = \(8, 8, 4\)"):
        fused.load_from(MultiHeadAttention(8, 8, 4, 0.0, 4))
    with pytest.raises(ValueError, match="qkv_bias=True"):
        FusedQKVAttention(8, 8, 2, qkv_bias=False).gpt2_state_dict()


# ---------------------------------------------------------------------------------------------
# Interop with Raschka's ch. 3 modules: same attribute names, opposite mask convention
# ---------------------------------------------------------------------------------------------
class BookCausalAttention(nn.Module):
    """The textbook's layout, written here from its published names: nn.Linear W_query, W_key,
    W_value and a float buffer ``mask`` = torch.triu(ones, diagonal=1), 1 = blocked (saved)."""

    def __init__(self, d_in, d_out, context_length, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length),
                                                diagonal=1))

    def attend(self, q, k, v):  # q, k, v: (..., T, head_dim)
        T = q.shape[-2]
        s = (q @ k.transpose(-2, -1)).masked_fill(self.mask.bool()[:T, :T], -torch.inf)
        return torch.softmax(s / k.shape[-1] ** 0.5, dim=-1) @ v

    def forward(self, x):
        return self.attend(self.W_query(x), self.W_key(x), self.W_value(x))


class BookMultiHeadAttention(BookCausalAttention):
    def __init__(self, d_in, d_out, context_length, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, qkv_bias)
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for lin in (self.W_query, self.W_key, self.W_value))
        return self.out_proj(self.attend(q, k, v).transpose(1, 2).reshape(B, T, -1))


def _book_pairs():
    torch.manual_seed(11)
    yield BookCausalAttention(4, 6, 8, qkv_bias=True), CausalAttention(4, 6, 8, qkv_bias=True)
    yield (BookMultiHeadAttention(6, 6, 8, num_heads=2),
           MultiHeadAttention(6, 6, 8, dropout=0.0, num_heads=2))


@pytest.mark.parametrize("book,ours", list(_book_pairs()), ids=["causal", "multi_head"])
def test_a_book_state_dict_loads_with_its_mask_understood(book, ours):
    state = book.state_dict()
    assert torch.equal(state["mask"], torch.triu(torch.ones(8, 8), diagonal=1))  # 1 = blocked
    result = ours.eval().load_state_dict(state)  # strict: no missing or unexpected key
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert "mask" in state  # the caller's dict is left as it was
    assert torch.equal(ours.mask, torch.ones(8, 8, dtype=torch.bool).tril())  # not flipped
    x = torch.randn(3, 7, book.W_query.in_features)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), book(x), atol=ATOL, rtol=0)
        y = x.clone()
        y[:, 5:] += 3.0  # the future moves, the past must not
        torch.testing.assert_close(ours(y)[:, :5], ours(x)[:, :5], atol=1e-6, rtol=0)


@pytest.mark.parametrize("book,ours", list(_book_pairs()), ids=["causal", "multi_head"])
def test_our_state_dict_into_the_book_module_fails_loudly_or_keeps_its_mask(book, ours):
    state = ours.state_dict()
    assert "mask" not in state
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"mask\""):
        book.load_state_dict(state)  # strict: a clear error, no silent NaN
    assert book.load_state_dict(state, strict=False).missing_keys == ["mask"]
    x = torch.randn(2, 6, book.W_query.in_features)
    with torch.no_grad():
        assert torch.isfinite(book(x)).all()
        torch.testing.assert_close(book(x), ours.eval()(x), atol=ATOL, rtol=0)


def test_a_mask_that_is_not_causal_is_refused_by_name():
    torch.manual_seed(12)
    book = BookCausalAttention(4, 4, 6)
    ours = CausalAttention(4, 4, 6)
    for bad in (torch.tril(torch.ones(6, 6)),  # float 1 = may attend: ambiguous, refused
                torch.triu(torch.ones(6, 6), diagonal=1) + torch.ones(6, 6).tril(-3),  # a window
                torch.ones(6, 6, dtype=torch.bool).triu(),  # bool True = blocked, diagonal too
                torch.zeros(6, 6), torch.ones(6)):
        state = {**book.state_dict(), "mask": bad}
        with pytest.raises(RuntimeError, match=r"'mask' .* is not a causal mask in either "
                                               r"convention .*1 = blocked above it"):
            ours.load_state_dict(state)
    nested = nn.Sequential(ours)  # the prefix of a submodule is honoured
    state = {f"0.{k}": v for k, v in book.state_dict().items()}
    nested.load_state_dict(state)
    state["0.mask"] = torch.zeros(6, 6)
    with pytest.raises(RuntimeError, match=r"'0.mask'"):
        nested.load_state_dict(state)
    legacy = {**ours.state_dict(), "mask": torch.ones(6, 6, dtype=torch.bool).tril()}
    ours.load_state_dict(legacy)  # an older course checkpoint (True = may attend) still loads
    assert torch.equal(ours.mask, torch.ones(6, 6, dtype=torch.bool).tril())
