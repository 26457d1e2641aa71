"""shared.heads: the split gives head h the features h*head_dim:(h+1)*head_dim (checked on
arange values, by hand), merge undoes it, and both agree with nn.MultiheadAttention's own heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.heads import merge_heads, split_heads


def test_split_on_arange_by_hand():
    x = torch.arange(12).reshape(1, 2, 6)  # B=1, T=2, d=6: token t, feature f holds 6t + f
    y = split_heads(x, 3)
    assert y.shape == (1, 3, 2, 2)
    assert y[0, 0].tolist() == [[0, 1], [6, 7]]  # head 0: features 0-1 of both tokens
    assert y[0, 2].tolist() == [[4, 5], [10, 11]]  # head 2: features 4-5


def test_split_is_a_view_and_merge_round_trips():
    x = torch.randn(2, 5, 12)
    y = split_heads(x, 4)
    assert y.data_ptr() == x.data_ptr()  # no copy
    for h in range(4):
        assert torch.equal(y[:, h], x[..., 3 * h:3 * (h + 1)])
    assert torch.equal(merge_heads(y), x)
    assert torch.equal(merge_heads(y.contiguous()), x)


def test_the_silent_wrong_view_differs():
    x = torch.arange(24.0).reshape(1, 4, 6)
    wrong = x.view(1, 3, 4, 2)  # the right shape, the wrong values
    assert wrong.shape == split_heads(x, 3).shape
    assert not torch.equal(wrong, split_heads(x, 3))


def test_heads_match_nn_multihead_attention():
    torch.manual_seed(0)
    d, H, T = 8, 2, 5
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True, bias=False).eval()
    x = torch.randn(3, T, d)
    W_q, W_k, W_v = mha.in_proj_weight.split(d)
    with torch.no_grad():
        ctx = F.scaled_dot_product_attention(*(split_heads(x @ W.T, H) for W in (W_q, W_k, W_v)))
        ours = merge_heads(ctx) @ mha.out_proj.weight.T
        ref = mha(x, x, x, need_weights=False)[0]
    assert torch.allclose(ours, ref, atol=1e-6)


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(2, 3, 7), 2), "not divisible by num_heads = 2"),
    ((torch.zeros(3, 6), 2), r"3-D \(B, T, d\); got shape \(3, 6\)"),
    ((torch.zeros(1, 3, 6), 0), "positive int"),
    (([[1.0]], 1), "torch.Tensor"),
])
def test_split_errors(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        split_heads(*args)


def test_merge_errors():
    with pytest.raises(ValueError, match=r"4-D \(B, num_heads, T, head_dim\); got shape \(2, 3, 4\)"):
        merge_heads(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        merge_heads([1.0])
