"""shared.llama.LlamaStyleAttention against Hugging Face transformers' LlamaAttention (same random
weights, eval mode): all tokens at once, and prefill + chunk + decode through a cache against
transformers' DynamicCache; plus the error messages for bad input."""

from __future__ import annotations

import pytest
import torch

from shared.generation import KVCache, causal_mask
from shared.llama import LlamaStyleAttention
from shared.positional import apply_rope

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding  # noqa: E402


def additive(T_q, T_k):
    """transformers' eager attention takes an additive (B, 1, T_q, T_k) mask."""
    return torch.zeros(T_q, T_k).masked_fill(~causal_mask(T_q, T_k), float("-inf"))[None, None]


def pair(hidden, heads, kv_heads, head_dim=None, theta=10000.0, seed=0):
    kwargs = {"head_dim": head_dim} if head_dim else {}
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         rope_theta=theta, attention_bias=False, **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    theirs = LlamaAttention(config, layer_idx=0).eval()
    ours = LlamaStyleAttention(hidden, heads, kv_heads, head_dim=head_dim, rope_base=theta).eval()
    ours.load_state_dict(theirs.state_dict())  # strict: the same names and shapes, no biases
    return config, theirs, LlamaRotaryEmbedding(config), ours


@pytest.mark.parametrize("hidden, heads, kv_heads, head_dim, theta", [
    (64, 8, 2, None, 10000.0),      # GQA, Llama-2's base
    (64, 4, 4, None, 500000.0),     # multi-head, Llama-3's base
    (48, 6, 1, None, 10000.0),      # multi-query
    (40, 4, 2, 16, 10000.0),        # an explicit head_dim (Gemma-style), 4 * 16 != 40
])
def test_matches_transformers_llama_attention(hidden, heads, kv_heads, head_dim, theta):
    config, theirs, rope, ours = pair(hidden, heads, kv_heads, head_dim, theta)
    x = torch.randn(2, 11, hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference, _ = theirs(x, rope(x, torch.arange(11)[None]), additive(11, 11))
        assert torch.allclose(ours(x), reference, atol=1e-5)
        # prefill 5, a chunk of 4 (bottom-right mask), then 2 decode steps, through both caches
        their_cache, our_cache, theirs_out, ours_out = DynamicCache(config=config), ours.new_cache(), [], []
        for a, b in ((0, 5), (5, 9), (9, 10), (10, 11)):
            theirs_out.append(theirs(x[:, a:b], rope(x, torch.arange(a, b)[None]), additive(b - a, b),
                                     past_key_values=their_cache)[0])
            ours_out.append(ours(x[:, a:b], our_cache))
        assert torch.allclose(torch.cat(ours_out, dim=1), torch.cat(theirs_out, dim=1), atol=1e-5)
        assert torch.allclose(torch.cat(ours_out, dim=1), reference, atol=1e-5)
        # both caches hold the keys AFTER rotation, at their absolute positions
        assert torch.allclose(our_cache.K, their_cache.layers[0].keys, atol=1e-5)
        raw = ours.k_proj(x).view(2, 11, kv_heads, ours.head_dim).transpose(1, 2)
        assert torch.allclose(our_cache.K, apply_rope(raw, torch.arange(11), theta), atol=1e-6)


def test_has_no_biases_and_counts_parameters():
    layer = LlamaStyleAttention(4096, 32, 8)  # one Llama-3-8B attention layer
    assert all(m.bias is None for m in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj))
    assert sum(p.numel() for p in layer.parameters()) == 2 * 4096**2 + 2 * 4096 * 1024


def test_window_equals_banded_recompute():
    torch.manual_seed(3)
    layer = LlamaStyleAttention(32, 4, 2, window=3).eval()
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = layer(x)
        cache = layer.new_cache()
        steps = torch.cat([layer(x[:, i:i + 1], cache) for i in range(9)], dim=1)
    assert len(cache) == 3
    assert torch.allclose(steps, full, atol=1e-6)


@pytest.mark.parametrize("call, error, match", [
    (lambda: LlamaStyleAttention(30, 4), ValueError, "hidden_size must be divisible by num_heads"),
    (lambda: LlamaStyleAttention(32, 4, 3), ValueError, "num_heads must be a multiple of num_kv_heads"),
    (lambda: LlamaStyleAttention(30, 2, head_dim=15), ValueError, "head_dim must be even; got 15"),
    (lambda: LlamaStyleAttention(32, 4)(torch.randn(1, 3, 16)), ValueError, "32"),
    (lambda: LlamaStyleAttention(32, 4)(torch.randn(1, 3, 32), cache="cache"), TypeError,
     "cache must be a KVCache; got str"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_cache_type_is_the_course_cache():
    assert isinstance(LlamaStyleAttention(8, 2).new_cache(), KVCache)


def test_transformers_wrapper_matches_ours_at_once_and_cached():
    """The notebook's wrapper against the direct calls above: the same numbers, through its cache too."""
    from shared.llama import TransformersLlamaAttention

    ref = TransformersLlamaAttention(64, 8, 2, rope_base=10000.0, seed=3)
    _, theirs, rope, _ = pair(64, 8, 2, seed=3)
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        direct, _ = theirs(x, rope(x, torch.arange(7)[None]), additive(7, 7))
    assert torch.equal(ref(x), direct)
    cache = ref.new_cache()
    stepped = torch.cat([ref(x[:, a:b], cache) for a, b in ((0, 4), (4, 6), (6, 7))], dim=1)
    assert torch.allclose(stepped, direct, atol=1e-5)
    assert ref.cached_keys(cache).shape == (2, 2, 7, 8)


def test_transformers_reference_skips_loudly_on_old_versions(monkeypatch, capsys):
    from shared.llama import transformers_llama_attention

    assert transformers_llama_attention(16, 2, 1) is not None  # the installed version is >= 5
    capsys.readouterr()
    import sys

    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")  # the module transformers left there
    assert transformers_llama_attention(16, 2, 1) is None
    printed = capsys.readouterr().out
    assert "SKIPPED" in printed and "transformers >= 5" in printed and "4.57.1" in printed
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    assert transformers_llama_attention(16, 2, 1) is None
    assert "SKIPPED" in capsys.readouterr().out
