"""shared.positional: the sinusoidal encoding against hand-derived values; RoPE against an
independent complex-number implementation and the LLaMA / GPT-J code in transformers; ALiBi against
its closed form, BLOOM's slopes and SDPA."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shared.positional import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_frequencies,
    rope_permutation,
    sinusoidal_positional_encoding,
)


def test_sinusoidal_positional_encoding_values():
    pe = sinusoidal_positional_encoding(50, 8)
    assert pe.shape == (50, 8) and pe.dtype == np.float64
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-12)  # sin 0, cos 0
    # hand-derived: column pair i turns at frequency 1 / 10000**(2i/8)
    for pos in (1, 7, 49):
        for i in range(4):
            f = 10000 ** (-2 * i / 8)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(pos * f), abs=1e-12)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(pos * f), abs=1e-12)
    np.testing.assert_allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, 1.0, atol=1e-12)
    assert len({tuple(np.round(r, 6)) for r in pe}) == 50  # every position is distinct


def test_sinusoidal_positional_encoding_bad_input():
    with pytest.raises(ValueError, match="d_model must be even .*; got d_model = 5"):
        sinusoidal_positional_encoding(4, 5)
    with pytest.raises(ValueError, match="T must be a positive integer; got 0"):
        sinusoidal_positional_encoding(0, 4)


# ---------------------------------------------------------------------------------------------
# RoPE: apply_rope against an independent complex-number implementation
# ---------------------------------------------------------------------------------------------
def rope_complex(x, positions, base=10000.0, interleaved=False):
    """RoPE as complex multiplication: pair i is the complex number z_i, rotated by
    exp(1j * position * base**(-2i/d)). Written from the definition, not from shared/."""
    x = x.double()
    d = x.shape[-1]
    pos = torch.as_tensor(positions, dtype=torch.float64)
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    rotation = torch.polar(torch.ones(len(pos), d // 2, dtype=torch.float64),
                           pos[:, None] * theta[None, :])  # (T, d/2) unit complex numbers
    if interleaved:  # pairs (2i, 2i+1)
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(z * rotation).reshape(x.shape)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:])  # pairs (i, i + d/2)
    w = z * rotation
    return torch.cat([w.real, w.imag], dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10000.0, 100.0, 500000.0])
def test_apply_rope_matches_complex_multiplication(interleaved, base):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 16, generator=g, dtype=torch.float64)  # (B, H, T, d)
    positions = torch.tensor([0, 1, 2, 5, 100, -3, 4096])
    got = apply_rope(x, positions, base=base, interleaved=interleaved)
    assert got.shape == x.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, rope_complex(x, positions, base, interleaved),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_float32_and_other_position_types(interleaved):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=g)  # (T, d) float32, no batch dims
    ref = rope_complex(x, range(5), interleaved=interleaved)
    for positions in (torch.arange(5), torch.arange(5, dtype=torch.int32), range(5),
                      [0, 1, 2, 3, 4], np.arange(5), np.arange(5, dtype=np.uint8)):
        got = apply_rope(x, positions, interleaved=interleaved)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_apply_rope_keeps_low_precision_dtypes(dtype):
    x = torch.randn(3, 10, 8, generator=torch.Generator().manual_seed(6))
    got = apply_rope(x.to(dtype), torch.arange(10) * 100)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), rope_complex(x.to(dtype), torch.arange(10) * 100),
                               atol=0.05, rtol=0.02)


def test_apply_rope_by_hand():
    # d = 2: one pair turning one radian per position (theta_0 = base**0 = 1)
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    got = apply_rope(x, [0, 1, 2])
    expected = [[1, 0], [math.cos(1), math.sin(1)], [-2 * math.sin(2), 2 * math.cos(2)]]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    # d = 4, position 1: pair 0 turns 1 rad, pair 1 turns base**(-1/2) = 0.01 rad
    e = torch.eye(4, dtype=torch.float64)[[0]]
    half = apply_rope(e, [1])[0]  # feature 0 pairs with feature 2
    torch.testing.assert_close(half, torch.tensor([math.cos(1), 0, math.sin(1), 0],
                                                  dtype=torch.float64))
    inter = apply_rope(e, [1], interleaved=True)[0]  # feature 0 pairs with feature 1
    torch.testing.assert_close(inter, torch.tensor([math.cos(1), math.sin(1), 0, 0],
                                                   dtype=torch.float64))
    torch.testing.assert_close(rope_frequencies(4), torch.tensor([1.0, 0.01], dtype=torch.float64))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_position(interleaved):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(6, 32, generator=g, dtype=torch.float64)
    k = torch.randn(6, 32, generator=g, dtype=torch.float64)
    pos = torch.arange(6)

    def scores(offset_q, offset_k):
        Q = apply_rope(q, pos + offset_q, interleaved=interleaved)
        K = apply_rope(k, pos + offset_k, interleaved=interleaved)
        return Q @ K.T

    base = scores(0, 0)
    for offset in (1, 17, 1000, -250):
        torch.testing.assert_close(scores(offset, offset), base, atol=1e-10, rtol=0)
    assert (scores(3, 0) - base).abs().max() > 0.1  # shifting only the queries does change them
    # q_m . k_n = q . R_{n-m} k: the query at 0 and the key moved by n - m
    m, n = 4, 1
    lhs = apply_rope(q[[0]], [m]) @ apply_rope(k[[0]], [n]).T
    rhs = q[[0]] @ apply_rope(k[[0]], [n - m]).T
    torch.testing.assert_close(lhs, rhs, atol=1e-12, rtol=0)
    # lengths are kept: a rotation
    torch.testing.assert_close(apply_rope(q, pos * 37).norm(dim=-1), q.norm(dim=-1))


def test_the_two_conventions_differ_and_a_permutation_maps_one_onto_the_other():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 12, generator=g, dtype=torch.float64)
    pos = torch.arange(9) * 3
    inter, half = apply_rope(x, pos, interleaved=True), apply_rope(x, pos)
    assert (inter - half).abs().max() > 0.1
    perm = rope_permutation(12)
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]
    torch.testing.assert_close(apply_rope(x[..., perm], pos), inter[..., perm], atol=1e-12,
                               rtol=0)
    inv = torch.argsort(perm)
    torch.testing.assert_close(apply_rope(x, pos, interleaved=True),
                               apply_rope(x[..., perm], pos)[..., inv], atol=1e-12, rtol=0)
    # scores survive the conversion: permute q and k the same way
    k = torch.randn(2, 9, 12, generator=g, dtype=torch.float64)
    s_inter = inter @ apply_rope(k, pos, interleaved=True).transpose(-1, -2)
    s_half = apply_rope(x[..., perm], pos) @ apply_rope(k[..., perm], pos).transpose(-1, -2)
    torch.testing.assert_close(s_half, s_inter, atol=1e-12, rtol=0)


def test_apply_rope_matches_the_llama_and_gptj_code_in_transformers():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    g = torch.Generator().manual_seed(4)
    B, H, T, d = 2, 3, 5, 8
    q = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    pos = torch.arange(T)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = pos[:, None].double() * inv_freq[None, :]  # (T, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)[None]  # (1, T, d), as LlamaRotaryEmbedding builds it
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    torch.testing.assert_close(apply_rope(q, pos), q_hf, atol=1e-12, rtol=0)
    torch.testing.assert_close(apply_rope(k, pos), k_hf, atol=1e-12, rtol=0)
    # GPT-J: (B, T, H, d) layout, sin/cos (B, T, d/2) repeated pairwise -> interleaved pairs
    q_bthd = q.transpose(1, 2)
    q_gptj = gptj.apply_rotary_pos_emb(q_bthd, freqs.sin()[None], freqs.cos()[None])
    torch.testing.assert_close(apply_rope(q, pos, interleaved=True), q_gptj.transpose(1, 2),
                               atol=1e-12, rtol=0)


def test_apply_rope_bad_input():
    x = torch.zeros(4, 6)
    with pytest.raises(ValueError, match=r"d must be even; got d = 5 \(x has shape \(2, 4, 5\)\)"):
        apply_rope(torch.zeros(2, 4, 5), torch.arange(4))
    with pytest.raises(ValueError, match=r"positions has 3 entries but x has T = 4 tokens"):
        apply_rope(x, torch.arange(3))
    with pytest.raises(TypeError, match=r"positions must be integers .*dtype torch.float32"):
        apply_rope(x, torch.arange(4.0))
    with pytest.raises(TypeError, match=r"positions must be integers .*dtype float64"):
        apply_rope(x, [0.0, 1.0, 2.0, 3.5])
    with pytest.raises(TypeError, match=r"positions must be integers .*dtype torch.bool"):
        apply_rope(x, torch.ones(4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"positions must be a 1-D tensor, array or list .*got int"):
        apply_rope(x, 4)
    with pytest.raises(ValueError, match=r"positions must be 1-D, one position per token: shape \(T,\) = \(4,\); got shape \(1, 4\)"):
        apply_rope(x, torch.arange(4)[None])
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor .*got ndarray"):
        apply_rope(np.zeros((4, 6)), torch.arange(4))
    with pytest.raises(TypeError, match=r"floating-point tensor .*got dtype torch.int64"):
        apply_rope(torch.zeros(4, 6, dtype=torch.int64), torch.arange(4))
    with pytest.raises(ValueError, match=r"x must have shape \(..., T, d\); got shape \(6,\)"):
        apply_rope(torch.zeros(6), torch.arange(1))
    with pytest.raises(ValueError, match=r"base must be a finite number greater than 1; got 1.0"):
        apply_rope(x, torch.arange(4), base=1.0)
    with pytest.raises(TypeError, match=r"interleaved must be True or False; got 'yes'"):
        apply_rope(x, torch.arange(4), interleaved="yes")
    with pytest.raises(ValueError, match=r"d must be even; got d = 7"):
        rope_permutation(7)


# ---------------------------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------------------------
def test_alibi_slopes_by_hand_and_against_bloom():
    assert alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]  # 1/2 ... 1/256
    assert alibi_slopes(4).tolist() == [2.0 ** (-2 * h) for h in range(1, 5)]  # 1/4 ... 1/256
    # 6 heads: the 4-head slopes, then every other one of the 8-head slopes (1/2, 1/8)
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for H in range(1, 17):
        torch.testing.assert_close(alibi_slopes(H).float(), bloom._get_alibi_slopes(H, "cpu"))


def test_alibi_bias_values_and_sdpa():
    bias = alibi_bias(2, 4, dtype=torch.float64)
    m = alibi_slopes(2)  # 1/16, 1/256
    assert bias.shape == (2, 4, 4) and bias.dtype == torch.float64
    for h in range(2):
        for i in range(4):
            for j in range(4):
                expected = -m[h] * (i - j) if j <= i else -math.inf
                assert bias[h, i, j] == expected
    g = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(3, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=bias)
    scores = Q @ K.transpose(-1, -2) / math.sqrt(8)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    dist = torch.arange(4)[:, None] - torch.arange(4)[None, :]
    naive = torch.softmax((scores - m[:, None, None] * dist).masked_fill(~causal, -math.inf), -1) @ V
    torch.testing.assert_close(out, naive, atol=1e-12, rtol=0)


def test_alibi_bad_input():
    with pytest.raises(ValueError, match="num_heads must be a positive integer; got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="T must be a positive integer; got 2.5"):
        alibi_bias(2, 2.5)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        alibi_bias(2, 3, dtype=torch.int64)


def test_apply_rope_scale_divides_the_positions():
    """Position interpolation: scale s at position 2s equals plain RoPE at position 2."""
    from shared.positional import apply_rope

    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64)
    scaled = apply_rope(x, [0, 4, 8], scale=4.0)
    plain = apply_rope(x, [0, 1, 2])
    torch.testing.assert_close(scaled, plain, atol=1e-12, rtol=0)
    torch.testing.assert_close(apply_rope(x, [0, 1, 2], scale=1.0), plain, atol=0, rtol=0)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            apply_rope(x, [0, 1, 2], scale=bad)
