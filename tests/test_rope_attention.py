"""shared.rope_attention.RoPEMultiHeadAttention against PyTorch's SDPA on rotated tensors, against
MultiHeadAttention when nothing is rotated, and its defining properties (shift invariance,
causality, the convention mapping)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.modules import MultiHeadAttention
from shared.positional import apply_rope, rope_permutation
from shared.rope_attention import RoPEMultiHeadAttention


def make(seed=0, **kwargs):
    torch.manual_seed(seed)
    args = {"d_in": 6, "d_out": 8, "num_heads": 2} | kwargs
    return RoPEMultiHeadAttention(**args).double().eval()


def x_of(seed=1, B=2, T=7, d_in=6):
    return torch.randn(B, T, d_in, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_sdpa_on_independently_rotated_tensors(interleaved, causal):
    m, x = make(interleaved=interleaved, causal=causal, qkv_bias=True), x_of()
    B, T, _ = x.shape
    pos = torch.arange(T) + 3
    with torch.no_grad():
        out, w = m(x, positions=pos, return_weights=True)
        heads = [lin(x).view(B, T, 2, 4).transpose(1, 2) for lin in (m.W_query, m.W_key, m.W_value)]
        Q, K = (apply_rope(t, pos, interleaved=interleaved) for t in heads[:2])
        ctx = F.scaled_dot_product_attention(Q, K, heads[2], is_causal=causal)
        ref = m.out_proj(ctx.transpose(1, 2).reshape(B, T, 8))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert w.shape == (B, 2, T, T)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, 2, T, dtype=torch.float64))


def test_at_position_zero_it_is_plain_multi_head_attention():
    m, x = make(), x_of()
    plain = MultiHeadAttention(6, 8, context_length=7, dropout=0.0, num_heads=2).double().eval()
    plain.load_state_dict(m.state_dict(), strict=False)
    with torch.no_grad():
        got = m(x, positions=torch.zeros(7, dtype=torch.long))
        differs = (m(x) - plain(x)).abs().max()
    torch.testing.assert_close(got, plain(x).detach(), atol=1e-12, rtol=0)
    assert differs > 1e-3  # with positions 0..T-1 the rotation does change the output


def test_shifting_every_position_changes_nothing():
    m, x = make(num_heads=1, d_out=16, base=100.0), x_of(T=9)
    with torch.no_grad():
        base_out = m(x)
        for offset in (1, 50, 10_000):
            torch.testing.assert_close(m(x, positions=torch.arange(9) + offset), base_out,
                                       atol=1e-9, rtol=0)


def test_causal_the_future_does_not_leak():
    m, x = make(), x_of(T=6)
    y = x.clone()
    y[:, 4:] = 100.0
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:, :4], m(y)[:, :4], atol=1e-12, rtol=0)


def test_interleaved_weights_permuted_per_head_run_under_half_split():
    inter = make(seed=3, interleaved=True, d_in=5, d_out=12, num_heads=3)
    half = make(seed=4, interleaved=False, d_in=5, d_out=12, num_heads=3)
    perm = torch.cat([h * 4 + rope_permutation(4) for h in range(3)])
    sd = inter.state_dict()
    sd["W_query.weight"] = sd["W_query.weight"][perm]  # (d_out, d_in): rows are output features
    sd["W_key.weight"] = sd["W_key.weight"][perm]
    half.load_state_dict(sd)
    x = x_of(d_in=5)
    with torch.no_grad():
        torch.testing.assert_close(half(x), inter(x), atol=1e-12, rtol=0)
        half.load_state_dict(inter.state_dict())  # the same weights, unconverted
        assert (half(x) - inter(x)).abs().max() > 1e-3


def test_gradients_reach_every_projection():
    m, x = make(), x_of()
    m(x).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bad_input():
    with pytest.raises(ValueError, match=r"head_dim = d_out // num_heads must be even; got head_dim = 3"):
        RoPEMultiHeadAttention(4, 6, num_heads=2)
    with pytest.raises(ValueError, match=r"d_out must be divisible by num_heads; got d_out = 8, num_heads = 3"):
        RoPEMultiHeadAttention(4, 8, num_heads=3)
    with pytest.raises(ValueError, match=r"base must be a finite number greater than 1; got 0.5"):
        RoPEMultiHeadAttention(4, 8, num_heads=2, base=0.5)
    m = make()
    with pytest.raises(ValueError, match=r"x must be 3-D \(B, T, d_in\) with d_in = 6; got shape \(7, 6\)"):
        m(torch.zeros(7, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"positions has 5 entries but x has T = 7 tokens"):
        m(x_of(), positions=torch.arange(5))
