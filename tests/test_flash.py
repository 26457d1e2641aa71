"""shared.flash.tiled_attention against PyTorch's SDPA and the NumPy reference, plus bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.attention import scaled_dot_product_attention
from shared.flash import DEFAULT_BLOCK_SIZE, tiled_attention

ATOL = 1e-5


def qkv(seed, *batch, T_q, T_k, d_k=8, d_v=8, dtype=torch.float64, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    Q = torch.randn(*batch, T_q, d_k, generator=gen, dtype=dtype) * spread
    K = torch.randn(*batch, T_k, d_k, generator=gen, dtype=dtype) * spread
    V = torch.randn(*batch, T_k, d_v, generator=gen, dtype=dtype)
    return Q, K, V


def sdpa(Q, K, V, causal):
    return F.scaled_dot_product_attention(Q, K, V, is_causal=causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "batch, T, block_size",
    [
        ((), 1, 1),  # one token
        ((), 7, 3),  # odd length, block does not divide T
        ((2,), 16, 4),  # blocks divide T
        ((2, 3), 37, 8),  # two batch dims, odd length
        ((1, 4), 100, 33),  # block size that does not divide T
        ((2,), 5, 64),  # block larger than the sequence
        ((1, 2), 130, DEFAULT_BLOCK_SIZE),  # the default block size
    ],
)
def test_matches_sdpa(batch, T, block_size, causal, dtype):
    Q, K, V = qkv(T * 10 + block_size, *batch, T_q=T, T_k=T, d_k=16, d_v=12, dtype=dtype)
    out = tiled_attention(Q, K, V, causal=causal, block_size=block_size)
    assert out.shape == (*batch, T, 12)
    assert out.dtype == dtype
    torch.testing.assert_close(out, sdpa(Q, K, V, causal), atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T_q, T_k, block_size", [(5, 9, 2), (9, 5, 4), (1, 17, 16), (33, 3, 8)])
def test_different_query_and_key_lengths(T_q, T_k, block_size, causal):
    """Cross-attention shapes; with causal the mask is aligned top-left like SDPA's."""
    Q, K, V = qkv(T_q + 100 * T_k, 2, T_q=T_q, T_k=T_k, d_k=4, d_v=6)
    out = tiled_attention(Q, K, V, causal=causal, block_size=block_size)
    torch.testing.assert_close(out, sdpa(Q, K, V, causal), atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_reference(causal):
    Q, K, V = qkv(3, 2, T_q=11, T_k=11, d_k=5, d_v=3)
    expected, _ = scaled_dot_product_attention(Q.numpy(), K.numpy(), V.numpy(), causal=causal)
    out = tiled_attention(Q, K, V, causal=causal, block_size=4).numpy()
    np.testing.assert_allclose(out, expected, atol=ATOL, rtol=0)


def test_broadcasts_batch_dimensions():
    Q, _, _ = qkv(0, 3, 1, T_q=6, T_k=6)
    _, K, V = qkv(1, 1, 2, T_q=6, T_k=6)
    out = tiled_attention(Q, K, V, block_size=4)
    assert out.shape == (3, 2, 6, 8)
    torch.testing.assert_close(out, sdpa(Q.expand(3, 2, 6, 8), K.expand(3, 2, 6, 8),
                                         V.expand(3, 2, 6, 8), False), atol=ATOL, rtol=0)


def test_large_scores_do_not_overflow():
    """Scores of several hundred overflow a plain exp; the running max keeps them finite."""
    Q, K, V = qkv(7, 2, T_q=20, T_k=20, d_k=4, dtype=torch.float32, spread=30.0)
    out = tiled_attention(Q, K, V, block_size=3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, sdpa(Q, K, V, False), atol=ATOL, rtol=0)


def test_later_block_with_larger_scores_rescales_earlier_ones():
    """Hand-built: the first key block has small scores, the second a much larger one, so the
    running max jumps and what was accumulated must be rescaled by exp(m_old - m_new).

    One query q = [1], keys 0, 0 | 10 (block size 2), values 1, 2 | 3: the weights are
    softmax([0, 0, 10]) and the output is their average of the values, derived by hand."""
    Q = torch.tensor([[1.0]], dtype=torch.float64)
    K = torch.tensor([[0.0], [0.0], [10.0]], dtype=torch.float64)
    V = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    e = np.exp(-10.0)  # exp(0 - 10): the weight of a zero score relative to the score 10
    expected = (1.0 * e + 2.0 * e + 3.0) / (2 * e + 1)
    out = tiled_attention(Q, K, V, block_size=2)
    assert abs(out.item() - expected) < 1e-12


@settings(max_examples=40, deadline=None)
@given(
    T_q=st.integers(1, 40),
    T_k=st.integers(1, 40),
    block_size=st.integers(1, 48),
    causal=st.booleans(),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_property_any_lengths_and_blocks(T_q, T_k, block_size, causal, heads, seed):
    Q, K, V = qkv(seed, heads, T_q=T_q, T_k=T_k, d_k=4, d_v=3)
    out = tiled_attention(Q, K, V, causal=causal, block_size=block_size)
    torch.testing.assert_close(out, sdpa(Q, K, V, causal), atol=ATOL, rtol=0)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 30), b1=st.integers(1, 32), b2=st.integers(1, 32), seed=st.integers(0, 999))
def test_property_block_size_does_not_change_the_result(T, b1, b2, seed):
    Q, K, V = qkv(seed, 2, T_q=T, T_k=T)
    a = tiled_attention(Q, K, V, causal=True, block_size=b1)
    b = tiled_attention(Q, K, V, causal=True, block_size=b2)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_causal_first_query_copies_first_value():
    """Under a causal mask query 0 sees only key 0, so its output is exactly V[0]."""
    Q, K, V = qkv(5, 3, T_q=9, T_k=9)
    out = tiled_attention(Q, K, V, causal=True, block_size=4)
    torch.testing.assert_close(out[:, 0], V[:, 0], atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------- bad input
def test_rejects_non_tensors():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(TypeError, match="Q must be a torch.Tensor"):
        tiled_attention(Q.numpy(), K, V)


def test_rejects_integer_tensors():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(TypeError, match="K must be a floating-point tensor; got dtype torch.int64"):
        tiled_attention(Q, K.long(), V)


def test_rejects_mixed_dtypes():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(TypeError, match="share one dtype"):
        tiled_attention(Q.float(), K, V)


def test_rejects_1d_input():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(ValueError, match=r"at least 2 dimensions .*got shape \(8,\)"):
        tiled_attention(Q[0], K, V)


def test_rejects_mismatched_d_k():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(ValueError, match=r"share their last dimension d_k; got Q \(3, 8\) and K \(3, 5\)"):
        tiled_attention(Q, K[:, :5], V)


def test_rejects_mismatched_key_value_lengths():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(ValueError, match=r"same number of tokens T_k .*K \(3, 8\) and V \(2, 8\)"):
        tiled_attention(Q, K, V[:2])


def test_rejects_batch_dims_that_do_not_broadcast():
    Q, _, _ = qkv(0, 2, T_q=3, T_k=3)
    _, K, V = qkv(0, 3, T_q=3, T_k=3)
    with pytest.raises(ValueError, match=r"must broadcast; got Q \(2, 3, 8\), K \(3, 3, 8\)"):
        tiled_attention(Q, K, V)


def test_rejects_empty_sequences():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(ValueError, match="at least 1"):
        tiled_attention(Q[:0], K, V)


@pytest.mark.parametrize("block_size", [0, -4, 2.5, True, "8"])
def test_rejects_bad_block_size(block_size):
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        tiled_attention(Q, K, V, block_size=block_size)


def test_rejects_non_bool_causal():
    Q, K, V = qkv(0, T_q=3, T_k=3)
    with pytest.raises(TypeError, match="causal must be a bool"):
        tiled_attention(Q, K, V, causal=1)


# ------------------------------------------------------- precision: float32 accumulation
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32_like_sdpa(dtype):
    """Scores, running max/sum and accumulator in float32, output rounded once: the error against
    a float64 reference is no larger than that of PyTorch's own SDPA (which accumulates in
    float32), and clearly smaller than the same loop kept in the half-precision dtype."""
    Q, K, V = qkv(11, 1, 4, T_q=256, T_k=256, d_k=64, d_v=64)
    reference = sdpa(Q, K, V, False)
    q, k, v = (x.to(dtype) for x in (Q, K, V))
    out = tiled_attention(q, k, v, block_size=32)
    assert out.dtype == dtype
    err = (out.double() - reference).abs().max().item()
    err_sdpa = (sdpa(q, k, v, False).double() - reference).abs().max().item()
    assert err <= 1.1 * err_sdpa, (err, err_sdpa)

    def loop_in(dtype):  # the same online softmax with every running quantity in `dtype`
        m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=dtype)
        for k0 in range(0, 256, 32):
            s = (q / 8) @ k[..., k0:k0 + 32, :].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
            l, acc, m = alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v[..., k0:k0 + 32, :], m_new
        return acc / l

    err_low = (loop_in(dtype).double() - reference).abs().max().item()
    assert err < err_low, (err, err_low)


def test_float32_and_float64_stay_in_their_dtype():
    for dtype in (torch.float32, torch.float64):
        Q, K, V = qkv(12, 2, T_q=9, T_k=9, dtype=dtype)
        assert tiled_attention(Q, K, V, block_size=4).dtype == dtype


# ------------------------------------------------------------- masks and the -inf guard
def blocked_keys(T_q, T_k, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(2, 1, T_q, T_k, generator=gen) > 0.4  # True = may attend


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 3, 8])
def test_boolean_mask_matches_sdpa(causal, block_size):
    Q, K, V = qkv(20 + block_size, 2, 3, T_q=10, T_k=10)
    mask = blocked_keys(10, 10, block_size)
    mask[..., :, 0] = True  # every row keeps one key, so SDPA's convention cannot differ
    expected = F.scaled_dot_product_attention(
        Q, K, V, attn_mask=mask & torch.ones(10, 10, dtype=torch.bool).tril() if causal else mask)
    out = tiled_attention(Q, K, V, causal=causal, block_size=block_size, mask=mask)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_broadcast_over_queries(causal):
    """A (B, 1, 1, T_k) padding mask has size 1 along the queries: every query block must see
    it whole (slicing rows q0:q1 of a size-1 dimension would leave nothing to broadcast)."""
    Q, K, V = qkv(25, 2, 3, T_q=11, T_k=11)
    mask = (torch.arange(11) < torch.tensor([7, 11])[:, None])[:, None, None, :]
    allowed = mask & torch.ones(11, 11, dtype=torch.bool).tril() if causal else mask
    expected = F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed)
    out = tiled_attention(Q, K, V, causal=causal, block_size=4, mask=mask)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_first_key_block_fully_masked_is_no_nan():
    """Keys 0..3 (the whole first block of 4) are masked for every query: the running max stays
    -inf through that block, where exp(-inf - (-inf)) would be nan without the guard."""
    Q, K, V = qkv(30, 2, T_q=6, T_k=10)
    mask = torch.ones(6, 10, dtype=torch.bool)
    mask[:, :4] = False
    out = tiled_attention(Q, K, V, block_size=4, mask=mask)
    assert not out.isnan().any()
    expected, _ = scaled_dot_product_attention(Q.numpy(), K.numpy(), V.numpy(), mask=mask.numpy())
    np.testing.assert_allclose(out.numpy(), expected, atol=ATOL, rtol=0)


def test_query_that_may_attend_to_nothing_gets_zeros():
    """The course's rule (and the NumPy reference's): a fully masked query row gives a zero
    output, never nan; the other rows are untouched."""
    Q, K, V = qkv(31, 3, T_q=7, T_k=7)
    mask = torch.ones(7, 7, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    mask[5, :4] = False  # query 5 only to keys 4..6, all in the second block of 4
    for causal in (False, True):
        out = tiled_attention(Q, K, V, causal=causal, block_size=4, mask=mask)
        assert not out.isnan().any()
        assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))
        expected, _ = scaled_dot_product_attention(Q.numpy(), K.numpy(), V.numpy(),
                                                   mask=mask.numpy(), causal=causal)
        np.testing.assert_allclose(out.numpy(), expected, atol=ATOL, rtol=0)


def test_rejects_bad_masks():
    Q, K, V = qkv(0, T_q=3, T_k=4)
    with pytest.raises(TypeError, match=r"mask must be a boolean torch.Tensor .*got dtype torch.float32"):
        tiled_attention(Q, K, V, mask=torch.ones(3, 4))
    with pytest.raises(TypeError, match="mask must be a boolean torch.Tensor .*got ndarray"):
        tiled_attention(Q, K, V, mask=np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3\) does not broadcast to .*\(3, 4\)"):
        tiled_attention(Q, K, V, mask=torch.ones(4, 3, dtype=torch.bool))


def test_docstring_memory_claim_one_tile_not_t_times_block():
    """Peak memory beyond the output does not grow with T: one block x block tile and a few
    block-row buffers per (batch, head), as the module docstring says."""
    from shared.benchmark import cpu_peak_memory

    def extra(T, block=32):
        Q, K, V = qkv(T, 1, 2, T_q=T, T_k=T, d_k=16, d_v=16, dtype=torch.float32)
        return cpu_peak_memory(lambda: tiled_attention(Q, K, V, block_size=block)) - 2 * T * 16 * 4

    small, large = extra(128), extra(512)
    assert small == large  # T quadrupled, the extra memory did not move
    tile, rows = 2 * 32 * 32 * 4, 2 * 32 * (16 + 16 + 2) * 4  # tile; q block, acc, m and l
    assert large <= 2 * (tile + rows)
