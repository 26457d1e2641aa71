"""shared.flash_backward: gradients against autograd on naive attention and on PyTorch's SDPA,
gradcheck in float64, masks (causal, padding, fully masked rows), bad input; plus the logsumexp
that shared.flash.tiled_attention returns for it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from shared.flash import tiled_attention
from shared.flash_backward import flash_attention, flash_backward, saved_tensor_bytes


def qkv(seed, *batch, T_q, T_k, d_k=8, d_v=8, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    Q = torch.randn(*batch, T_q, d_k, generator=gen, dtype=dtype)
    K = torch.randn(*batch, T_k, d_k, generator=gen, dtype=dtype)
    V = torch.randn(*batch, T_k, d_v, generator=gen, dtype=dtype)
    return [x.requires_grad_() for x in (Q, K, V)]


def padding_mask(seed, B, T_k, empty_row=None):
    """(B, 1, 1, T_k) key-padding mask, True = a real token; ``empty_row`` pads every key of
    that sequence (all its queries then attend to nothing)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T_k + 1, (B,), generator=gen)
    mask = torch.arange(T_k) < lengths[:, None]
    if empty_row is not None:
        mask[empty_row] = False
    return mask[:, None, None, :]


def sdpa_with_mask(Q, K, V, causal, mask):
    """SDPA's boolean attn_mask (True = may attend); PyTorch's own implementation. Rows with no
    allowed key give NaN in SDPA, so those are compared separately."""
    allowed = mask
    if causal:
        tri = torch.ones(Q.shape[-2], K.shape[-2], dtype=torch.bool).tril()
        allowed = tri if allowed is None else allowed & tri
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed)


def grads(out, inputs, dO):
    return torch.autograd.grad(out, inputs, dO)


# ---- the logsumexp from the forward pass ------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_lse_matches_torch_logsumexp(causal):
    Q, K, V = (x.detach() for x in qkv(1, 2, 3, T_q=13, T_k=13, d_k=4))
    out, L = tiled_attention(Q, K, V, causal=causal, block_size=5, return_lse=True)
    S = Q @ K.transpose(-1, -2) / 2.0
    if causal:
        S = S.masked_fill(~torch.ones(13, 13, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(L, torch.logsumexp(S, dim=-1), atol=1e-12, rtol=0)
    assert L.shape == (2, 3, 13)
    torch.testing.assert_close(out, tiled_attention(Q, K, V, causal=causal, block_size=5))


def test_lse_is_inf_for_a_row_with_no_key_and_output_unchanged():
    Q, K, V = (x.detach() for x in qkv(2, 3, T_q=6, T_k=6))
    mask = padding_mask(3, 3, 6, empty_row=1)[:, 0]  # (3, 1, 6)
    out, L = tiled_attention(Q, K, V, block_size=4, mask=mask, return_lse=True)
    assert torch.isposinf(L[1]).all() and torch.isfinite(L[0]).all()
    assert (out[1] == 0).all()


def test_lse_float32_for_half_inputs():
    Q, K, V = (x.detach().to(torch.bfloat16) for x in qkv(4, 2, T_q=9, T_k=9))
    out, L = tiled_attention(Q, K, V, block_size=4, return_lse=True)
    assert out.dtype == torch.bfloat16 and L.dtype == torch.float32


def test_return_lse_must_be_bool():
    Q, K, V = (x.detach() for x in qkv(0, T_q=3, T_k=3))
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        tiled_attention(Q, K, V, return_lse=1)


# ---- gradcheck (float64, small) -----------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_gradcheck(causal, padded):
    Q, K, V = qkv(10 + causal + 2 * padded, 2, T_q=7, T_k=7, d_k=3, d_v=2)
    mask = padding_mask(5, 2, 7) if padded else None
    mask = mask[:, 0] if padded else None  # (2, 1, 7) for batch (2,)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, block_size=3, mask=mask),
        (Q, K, V), eps=1e-6, atol=1e-7)


def test_gradcheck_cross_attention_lengths():
    Q, K, V = qkv(20, 1, 2, T_q=5, T_k=9, d_k=4, d_v=3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal=True, block_size=4), (Q, K, V))


# ---- float32 against SDPA's own gradients -------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("T, block_size", [(1, 1), (50, 16), (97, 32), (130, 64)])
def test_float32_gradients_match_sdpa(T, block_size, causal, padded):
    seed = T * 7 + block_size + causal + 2 * padded
    Q, K, V = qkv(seed, 2, 3, T_q=T, T_k=T, d_k=16, d_v=16, dtype=torch.float32)
    dO = torch.randn(2, 3, T, 16, generator=torch.Generator().manual_seed(seed + 1))
    mask = padding_mask(seed, 2, T) if padded else None
    out = flash_attention(Q, K, V, causal=causal, block_size=block_size, mask=mask)
    ref = sdpa_with_mask(Q, K, V, causal, mask) if padded else \
        F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    for got, want in zip(grads(out, (Q, K, V), dO), grads(ref, (Q, K, V), dO), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def naive(Q, K, V, causal=False, mask=None):
    """Autograd on the textbook formula (an independent implementation): masked rows -> 0."""
    S = Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1])
    allowed = mask
    if causal:
        tri = torch.ones(S.shape[-2:], dtype=torch.bool).tril()
        allowed = tri if allowed is None else allowed & tri
    if allowed is not None:
        S = S.masked_fill(~allowed, float("-inf"))
    return torch.softmax(S, dim=-1).nan_to_num(0.0) @ V


@pytest.mark.parametrize("causal", [False, True])
def test_fully_masked_rows_zero_output_and_zero_gradient(causal):
    """Sequence 1 is all padding: its queries attend to nothing. Output 0, gradients 0, no NaN;
    the other sequence's gradients match autograd on naive attention."""
    Q, K, V = qkv(30 + causal, 2, 2, T_q=11, T_k=11)
    mask = padding_mask(31, 2, 11, empty_row=1)
    dO = torch.randn(2, 2, 11, 8, generator=torch.Generator().manual_seed(32), dtype=torch.float64)
    out = flash_attention(Q, K, V, causal=causal, block_size=4, mask=mask)
    g = grads(out, (Q, K, V), dO)
    assert (out[1] == 0).all()
    for t in g:
        assert torch.isfinite(t).all()
        assert (t[1] == 0).all()
    ref = naive(Q, K, V, causal, mask)
    for got, want in zip(g, grads(ref, (Q, K, V), dO), strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_one_query_row_with_no_key():
    """A (T_q, T_k) mask whose row 2 is all False: only that query's gradient share is zero."""
    Q, K, V = qkv(40, 3, T_q=6, T_k=8)
    mask = torch.rand(6, 8, generator=torch.Generator().manual_seed(41)) > 0.4
    mask[:, 0] = True
    mask[2] = False
    out = flash_attention(Q, K, V, block_size=3, mask=mask)
    dQ, dK, dV = grads(out, (Q, K, V), torch.ones_like(out))
    assert (dQ[:, 2] == 0).all() and torch.isfinite(dK).all() and torch.isfinite(dV).all()
    want = grads(naive(Q, K, V, mask=mask), (Q, K, V), torch.ones_like(out))
    for got, w in zip((dQ, dK, dV), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-12, rtol=0)


def test_broadcast_batch_dimensions_sum_gradients():
    """K and V shared by every head (shape (B, 1, T, d)): their gradients are summed over heads,
    as autograd does for naive attention."""
    Q, _, _ = qkv(50, 2, 3, T_q=9, T_k=9)
    _, K, V = qkv(51, 2, 1, T_q=9, T_k=9)
    out = flash_attention(Q, K, V, causal=True, block_size=4)
    assert out.shape == (2, 3, 9, 8)
    got = grads(out.sum(), (Q, K, V), None)
    want = grads(naive(Q, K, V, causal=True).sum(), (Q, K, V), None)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)


def test_bfloat16_gradients_close_to_float32():
    Q, K, V = qkv(60, 2, T_q=40, T_k=40, d_k=16, d_v=16, dtype=torch.float32)
    dO = torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(61))
    ref = grads(flash_attention(Q, K, V, block_size=16), (Q, K, V), dO)
    low = [x.detach().to(torch.bfloat16).requires_grad_() for x in (Q, K, V)]
    out = flash_attention(*low, block_size=16)
    got = grads(out, low, dO.to(torch.bfloat16))
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == torch.bfloat16
        assert (g.float() - r).abs().max() < 0.1


def test_flash_backward_direct_call_matches_autograd():
    Q, K, V = qkv(70, 3, T_q=10, T_k=10)
    O, L = tiled_attention(Q.detach(), K.detach(), V.detach(), block_size=4, return_lse=True)
    dO = torch.randn(3, 10, 8, generator=torch.Generator().manual_seed(71), dtype=torch.float64)
    got = flash_backward(Q.detach(), K.detach(), V.detach(), O, L, dO, block_size=4)
    want = grads(naive(Q, K, V), (Q, K, V), dO)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)


# ---- memory: nothing T x T is saved ------------------------------------------------------------
def test_saves_no_score_sized_tensor():
    T = 256
    Q, K, V = qkv(80, 1, 2, T_q=T, T_k=T, d_k=16, d_v=16, dtype=torch.float32)
    flash = saved_tensor_bytes(lambda: flash_attention(Q, K, V, causal=True, block_size=64),
                               exclude=(Q, K, V))
    # O (2, T, 16) and L (2, T) in float32, nothing else
    assert flash == (2 * T * 16 + 2 * T) * 4
    naive_saved = saved_tensor_bytes(lambda: naive(Q, K, V, causal=True), exclude=(Q, K, V))
    assert naive_saved >= 2 * T * T * 4  # at least the weights P


def test_saved_tensor_bytes_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        saved_tensor_bytes(3)


# ---- bad input -----------------------------------------------------------------------------------
def test_bad_inputs_are_named():
    Q, K, V = qkv(90, 2, T_q=4, T_k=4)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(Q, K, V, block_size=0)
    with pytest.raises(TypeError, match="mask must be a boolean"):
        flash_attention(Q, K, V, mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="does not broadcast"):
        flash_attention(Q, K, V, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="share one dtype"):
        flash_attention(Q, K.float(), V)
    with pytest.raises(ValueError, match="batch"):
        flash_attention(Q, *qkv(91, 3, T_q=4, T_k=4)[1:])
