"""shared.generation against independent references: full recomputation, PyTorch's SDPA
(``enable_gqa=True``, ``causal_lower_right``), ``nn.MultiheadAttention``, closed forms and
published model configurations; plus the error messages for bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from shared.generation import (
    GroupedQueryAttention,
    KVCache,
    causal_mask,
    gqa_attention,
    kv_cache_bytes,
    positions_mask,
    repeat_kv,
    window_mask,
)
from shared.modules import MultiHeadAttention

ATOL = 1e-5


def randn(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------ masks
@pytest.mark.parametrize("T_q, T_k", [(1, 1), (1, 7), (3, 7), (5, 5), (4, 9)])
def test_causal_mask_bottom_right_is_a_shifted_lower_triangle(T_q, T_k):
    expected = torch.ones(T_q, T_k, dtype=torch.bool).tril(diagonal=T_k - T_q)
    assert torch.equal(causal_mask(T_q, T_k), expected)
    assert torch.equal(causal_mask(T_q, T_k, align="top_left"),
                       torch.ones(T_q, T_k, dtype=torch.bool).tril())


@pytest.mark.parametrize("T_q, T_k", [(1, 6), (3, 7), (6, 6)])
def test_causal_mask_matches_pytorch_causal_lower_right(T_q, T_k):
    Q, K, V = randn(1, 2, 3, T_q, 4), randn(2, 2, 3, T_k, 4), randn(3, 2, 3, T_k, 5)
    ours = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_mask(T_q, T_k))
    theirs = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_lower_right(T_q, T_k))
    assert torch.allclose(ours, theirs, atol=1e-12)
    # and the last T_q rows of full causal attention over the T_k tokens
    Q_full = torch.cat([randn(4, 2, 3, T_k - T_q, 4), Q], dim=2)
    full = F.scaled_dot_product_attention(Q_full, K, V, is_causal=True)
    assert torch.allclose(ours, full[:, :, T_k - T_q:], atol=1e-12)


@pytest.mark.parametrize("T_q, T_k, w", [(6, 6, 3), (1, 9, 4), (3, 8, 2), (5, 5, 1), (4, 4, 10)])
def test_window_mask_by_brute_force(T_q, T_k, w):
    expected = torch.zeros(T_q, T_k, dtype=torch.bool)
    for i in range(T_q):
        p = T_k - T_q + i  # the query's position
        for j in range(T_k):
            expected[i, j] = p - w < j <= p
    assert torch.equal(window_mask(T_q, T_k, window=w), expected)
    assert int(expected.sum(dim=-1).max()) == min(w, T_k)


def test_window_at_least_T_is_causal_and_positions_mask_handles_gaps():
    assert torch.equal(window_mask(5, 5, window=5), causal_mask(5))
    # a cache that kept position 0 (a sink) and positions 6..8, queried at 8 and 9
    m = positions_mask(torch.tensor([8, 9]), torch.tensor([0, 6, 7, 8, 9]), window=3)
    assert m.tolist() == [[False, True, True, True, False], [False, False, True, True, True]]


@pytest.mark.parametrize("call, match", [
    (lambda: causal_mask(5, 3), r"T_q <= T_k .*T_q = 5, T_k = 3"),
    (lambda: causal_mask(2, 3, align="bottom"), "align must be 'bottom_right' or 'top_left'"),
    (lambda: causal_mask(0), "T_q must be a positive integer; got 0"),
    (lambda: window_mask(3, 3, window=0), "window must be a positive integer; got 0"),
    (lambda: window_mask(4, 2, window=1), "T_q <= T_k"),
    (lambda: positions_mask(torch.tensor([1.0]), torch.tensor([0])),
     "q_pos must be a 1-D integer tensor of positions"),
])
def test_mask_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ grouped-query attention
@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (6, 3), (4, 1)])
def test_repeat_kv_gives_query_head_h_the_kv_head_h_over_g(H, H_kv):
    K = randn(5, 2, H_kv, 3, 4)
    expected = torch.stack([K[:, h // (H // H_kv)] for h in range(H)], dim=1)
    assert torch.equal(repeat_kv(K, H), expected)


@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (6, 3), (4, 1)])
@pytest.mark.parametrize("T_q, T_k, window", [(5, 5, None), (1, 9, None), (3, 8, None), (6, 6, 2)])
def test_gqa_attention_matches_sdpa_enable_gqa(H, H_kv, T_q, T_k, window):
    Q = randn(H + T_q, 2, H, T_q, 8)
    K, V = randn(H_kv + 10, 2, H_kv, T_k, 8), randn(H_kv + 20, 2, H_kv, T_k, 6)
    mask = causal_mask(T_q, T_k) if window is None else window_mask(T_q, T_k, window=window)
    out, weights = gqa_attention(Q, K, V, mask)
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True)
    assert out.shape == (2, H, T_q, 6) and weights.shape == (2, H, T_q, T_k)
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(2, H, T_q, dtype=torch.float64))


def test_gqa_attention_errors():
    Q, K = randn(0, 1, 6, 3, 4), randn(1, 1, 4, 3, 4)
    with pytest.raises(ValueError, match="num_heads = 6, num_kv_heads = 4"):
        gqa_attention(Q, K, K)
    with pytest.raises(ValueError, match=r"Q must be 4-D \(B, heads, T, head_dim\); got \(6, 3, 4\)"):
        gqa_attention(Q[0], K, K)
    with pytest.raises(ValueError, match="K and V must agree"):
        gqa_attention(Q, K[:, :2], K[:, :2, :2])
    with pytest.raises(ValueError, match="must agree in B and head_dim"):
        gqa_attention(Q, K[:, :2, :, :3], K[:, :2])
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        repeat_kv(K, 6)


# ------------------------------------------------------------------ the KV cache
def split(x, heads):
    B, T, d = x.shape
    return x.view(B, T, heads, d // heads).transpose(1, 2)


def test_cache_update_appends_in_order_and_records_positions():
    cache = KVCache()
    k, v = randn(0, 2, 3, 4, 5), randn(1, 2, 3, 4, 6)  # v may have its own head_dim
    K, V, pos = cache.update(k[:, :, :3], v[:, :, :3])
    assert torch.equal(K, k[:, :, :3]) and pos.tolist() == [0, 1, 2]
    K, V, pos = cache.update(k[:, :, 3:], v[:, :, 3:])
    assert torch.equal(K, k) and torch.equal(V, v) and pos.tolist() == [0, 1, 2, 3]
    assert len(cache) == 4 and cache.seen == 4
    assert cache.nbytes == (k.nelement() + v.nelement()) * 8
    cache.crop(2)
    assert len(cache) == 2 and cache.seen == 2 and torch.equal(cache.K, k[:, :, :2])
    cache.reset()
    assert len(cache) == 0 and cache.seen == 0 and cache.nbytes == 0


@pytest.mark.parametrize("window, sinks", [(3, 0), (4, 1), (2, 2)])
def test_windowed_cache_keeps_sinks_and_the_last_window(window, sinks):
    cache = KVCache(window=window, sinks=sinks)
    k = torch.arange(12.0).view(1, 1, 12, 1)  # each key holds its position
    for p in range(12):
        K, _, pos = cache.update(k[:, :, p:p + 1], k[:, :, p:p + 1])
        assert torch.equal(K.flatten().long(), pos)  # the view's positions label its keys
        expected = [j for j in range(p + 1) if j < sinks or j > p - window]
        assert pos.tolist() == expected  # one decode query needs exactly these
        assert cache.positions.tolist() == expected
        assert len(cache) <= window + sinks
    # a chunk of 3 queries gets what its earliest query needs, then the cache trims
    K, _, pos = cache.update(torch.zeros(1, 1, 3, 1), torch.zeros(1, 1, 3, 1))
    assert pos.tolist() == list(range(sinks)) + list(range(12 - window + 1, 15))
    assert cache.positions.tolist() == list(range(sinks)) + list(range(15 - window, 15))


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
def test_prefill_then_decode_equals_full_recomputation(num_kv_heads, window):
    torch.manual_seed(num_kv_heads)
    layer = GroupedQueryAttention(16, 16, num_heads=4, num_kv_heads=num_kv_heads,
                                  window=window).double()
    x = randn(7, 2, 11, 16)
    # independent reference: projections + SDPA with the full (T, T) mask + output projection
    Q, K, V = split(layer.W_query(x), 4), split(layer.W_key(x), num_kv_heads), \
        split(layer.W_value(x), num_kv_heads)
    mask = causal_mask(11) if window is None else window_mask(11, 11, window=window)
    ctx = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True)
    ref = layer.out_proj(ctx.transpose(1, 2).reshape(2, 11, 16))
    assert torch.allclose(layer(x), ref, atol=1e-12)
    cache = layer.new_cache()
    chunks = [x[:, :4], x[:, 4:5], x[:, 5:6], x[:, 6:9], x[:, 9:10], x[:, 10:]]
    out = torch.cat([layer(c, cache) for c in chunks], dim=1)  # prefill, decode, a chunk, ...
    assert torch.allclose(out, ref, atol=1e-12)
    assert len(cache) == (11 if window is None else window)


def test_multi_head_layer_equals_torch_multihead_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 12, context_length=8, dropout=0.0, num_heads=3, qkv_bias=True)
    layer = GroupedQueryAttention.from_multi_head(mha, num_kv_heads=3)
    x = torch.randn(2, 8, 12)
    torch_mha = mha.to_torch()
    blocked = ~torch.ones(8, 8, dtype=torch.bool).tril()  # PyTorch's convention: True = blocked
    ref, _ = torch_mha(x, x, x, attn_mask=blocked, need_weights=False)
    assert torch.allclose(layer(x), ref, atol=ATOL)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_from_multi_head_averages_each_group(qkv_bias):
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 16, context_length=8, dropout=0.0, num_heads=4, qkv_bias=qkv_bias)
    gqa = GroupedQueryAttention.from_multi_head(mha, num_kv_heads=2)
    for new, old in ((gqa.W_key, mha.W_key), (gqa.W_value, mha.W_value)):
        heads = [old.weight[h * 4:(h + 1) * 4] for h in range(4)]  # (head_dim, d_in) per head
        expected = torch.cat([(heads[0] + heads[1]) / 2, (heads[2] + heads[3]) / 2])
        assert torch.allclose(new.weight, expected)
        if qkv_bias:
            b = [old.bias[h * 4:(h + 1) * 4] for h in range(4)]
            assert torch.allclose(new.bias, torch.cat([(b[0] + b[1]) / 2, (b[2] + b[3]) / 2]))
    assert torch.equal(gqa.W_query.weight, mha.W_query.weight)
    assert torch.equal(gqa.out_proj.weight, mha.out_proj.weight)
    # MQA: every key head is the mean of all four
    mqa = GroupedQueryAttention.from_multi_head(mha, num_kv_heads=1)
    assert torch.allclose(mqa.W_key.weight, mha.W_key.weight.view(4, 4, 16).mean(dim=0))


def test_cache_errors_name_what_differs():
    cache = KVCache()
    cache.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"k of this step has shape \(1, 4, 1, 8\) but the cache "
                                         r"holds keys of shape .* = \(1, 2, 3, 8\): num_kv_heads "
                                         r"differs \(4 vs 2\) \(did you pass all the query heads"):
        cache.update(torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8))
    with pytest.raises(ValueError, match=r"head_dim differs \(16 vs 8\)"):
        cache.update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 8))
    with pytest.raises(ValueError, match=r"v of this step .* head_dim_v differs \(4 vs 8\)"):
        cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"B differs \(2 vs 1\)"):
        cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8))
    with pytest.raises(ValueError, match=r"k must be 4-D .* got shape \(1, 1, 8\) \(3-D\): split "
                                         r"the heads first"):
        cache.update(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))
    with pytest.raises(ValueError, match=r"k and v must agree in \(B, num_kv_heads, T_new\)"):
        cache.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 1, 8))
    with pytest.raises(ValueError, match="torch.float64 on cpu but the cache holds torch.float32"):
        cache.update(torch.zeros(1, 2, 1, 8, dtype=torch.float64),
                     torch.zeros(1, 2, 1, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="k must be a torch.Tensor; got list"):
        cache.update([0.0], torch.zeros(1, 2, 1, 8))
    assert len(cache) == 3 and cache.seen == 3  # a rejected step changes nothing
    with pytest.raises(ValueError, match=r"T must be an integer in \[0, 3\]"):
        cache.crop(4)
    with pytest.raises(ValueError, match="crop needs a cache without a window"):
        KVCache(window=2).crop(0)
    with pytest.raises(ValueError, match="sinks only make sense with a window"):
        KVCache(sinks=2)
    with pytest.raises(ValueError, match="window must be a positive integer; got 0"):
        KVCache(window=0)


def test_layer_errors():
    with pytest.raises(ValueError, match="num_heads = 4, num_kv_heads = 3"):
        GroupedQueryAttention(8, 8, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="d_out must be divisible by num_heads"):
        GroupedQueryAttention(8, 6, num_heads=4)
    layer = GroupedQueryAttention(8, 8, num_heads=4, num_kv_heads=2, window=4)
    x = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="keeps only the last 2 tokens, but the layer attends to "
                                         "the last 4"):
        layer(x, KVCache(window=2))
    with pytest.raises(ValueError, match="every earlier token"):
        GroupedQueryAttention(8, 8, num_heads=4)(x, KVCache(window=8))
    with pytest.raises(TypeError, match="cache must be a KVCache; got dict"):
        layer(x, {})
    with pytest.raises(ValueError, match="x's last dimension must be d_in = 8"):
        layer(torch.zeros(1, 2, 6))
    with pytest.raises(ValueError, match="causal=False"):
        GroupedQueryAttention.from_multi_head(
            MultiHeadAttention(8, 8, 4, 0.0, num_heads=2, causal=False), 1)


# ------------------------------------------------------------------ cache size
def test_kv_cache_bytes_closed_forms():
    # Llama-2-7B: 32 layers x 32 heads x 128 dims, K and V, 2 bytes: 512 KiB per token, 2 GiB at 4096
    assert kv_cache_bytes(32, 32, 128, T=1) == 512 * 2**10
    assert kv_cache_bytes(32, 32, 128, T=4096) == 2 * 2**30
    # Llama-3-8B / Mistral-7B (8 kv heads): a quarter; Mistral's 4096 window caps it
    assert kv_cache_bytes(32, 8, 128, T=4096) * 4 == kv_cache_bytes(32, 32, 128, T=4096)
    assert kv_cache_bytes(32, 8, 128, T=32768, window=4096) == kv_cache_bytes(32, 8, 128, T=4096)
    assert kv_cache_bytes(2, 3, 4, T=5, batch_size=6, dtype=torch.float32) == 2 * 2 * 6 * 3 * 5 * 4 * 4


def test_kv_cache_bytes_from_transformers_configs():
    """The published shapes the notebook uses, as transformers' own default configs hold them."""
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2Config()  # defaults = GPT-2 small
    assert (gpt2.n_layer, gpt2.n_head, gpt2.n_embd // gpt2.n_head, gpt2.n_positions) == (12, 12, 64, 1024)
    assert kv_cache_bytes(gpt2.n_layer, gpt2.n_head, 64, T=1) == 36 * 2**10
    mistral = transformers.MistralConfig()  # defaults = Mistral-7B
    head_dim = mistral.hidden_size // mistral.num_attention_heads
    assert (mistral.num_hidden_layers, mistral.num_key_value_heads, head_dim,
            mistral.sliding_window) == (32, 8, 128, 4096)
    llama = transformers.LlamaConfig()  # defaults = Llama-2-7B's shapes
    assert (llama.num_hidden_layers, llama.num_attention_heads, llama.hidden_size,
            llama.intermediate_size, llama.vocab_size) == (32, 32, 4096, 11008, 32000)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_layers": 0}, ValueError, "num_layers must be a positive integer; got 0"),
    ({"T": 2.5}, ValueError, "T must be a positive integer; got 2.5"),
    ({"dtype": "float16"}, TypeError, "dtype must be a torch.dtype"),
    ({"window": 0}, ValueError, "window must be a positive integer"),
])
def test_kv_cache_bytes_errors(kwargs, error, match):
    args = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "T": 8, **kwargs}
    with pytest.raises(error, match=match):
        kv_cache_bytes(**args)


def test_decode_query_needs_no_mask_and_is_causal_gives_the_first_value():
    """The fact notebook 08 shows: SDPA's is_causal=True is top-left aligned."""
    Q, K, V = randn(0, 1, 2, 1, 4), randn(1, 1, 2, 6, 4), randn(2, 1, 2, 6, 4)
    wrong = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    assert torch.allclose(wrong, V[:, :, :1])
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(4), dim=-1)
    assert torch.allclose(gqa_attention(Q, K, V, causal_mask(1, 6))[0], weights @ V)
