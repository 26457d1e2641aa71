"""A LLaMA/Mistral-style attention layer assembled from the course's pieces (notebook 08).

``LlamaStyleAttention`` is what the attention sub-layer of Llama-2/3 and Mistral computes:

* bias-free projections ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (the names and shapes of
  Hugging Face's ``LlamaAttention``, so its ``state_dict`` loads as it is);
* RoPE (``shared.positional.apply_rope``, half-split pairs) on queries and keys at their
  **absolute** positions, before the keys enter the cache (the cache holds rotated keys);
* grouped-query attention (``shared.generation.gqa_attention``) with ``num_kv_heads`` key/value
  heads and a causal mask built from positions (``positions_mask``: bottom-right aligned, so a
  chunk of several new tokens works too), optionally banded by a sliding ``window`` (Mistral v0.1);
* an optional ``shared.generation.KVCache`` for prefill and decode.
"""

from __future__ import annotations

import torch
from torch import nn

from shared.generation import KVCache, _check_groups, gqa_attention, positions_mask
from shared.modules import _check_positive_int, _check_x
from shared.positional import apply_rope

__all__ = ["LlamaStyleAttention", "TransformersLlamaAttention", "transformers_llama_attention"]


class LlamaStyleAttention(nn.Module):
    """Causal self-attention as in LLaMA/Mistral: RoPE + grouped-query attention + a KV cache.

    ``q_proj`` ``(hidden_size -> num_heads * head_dim)``, ``k_proj`` and ``v_proj``
    ``(hidden_size -> num_kv_heads * head_dim)``, ``o_proj`` ``(num_heads * head_dim ->
    hidden_size)``, all without bias. ``head_dim`` defaults to ``hidden_size // num_heads``; a
    config may set it explicitly (Gemma). ``rope_base`` is ``rope_theta`` in a ``config.json``
    (10000 for Llama-2, 500000 for Llama-3).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, rope_base: float = 10000.0,
                 window: int | None = None):
        super().__init__()
        self.hidden_size = _check_positive_int("hidden_size", hidden_size)
        self.num_heads = _check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = _check_positive_int("num_kv_heads", num_kv_heads)
        _check_groups(num_heads, num_kv_heads)
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size must be divisible by num_heads when head_dim is not "
                                 f"given; got hidden_size = {hidden_size}, num_heads = {num_heads}")
            head_dim = hidden_size // num_heads
        self.head_dim = _check_positive_int("head_dim", head_dim)
        if self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of features: head_dim must be even; got "
                             f"{head_dim}")
        self.rope_base = float(rope_base)
        self.window = None if window is None else _check_positive_int("window", window)
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def new_cache(self) -> KVCache:
        """An empty ``KVCache`` for this layer (the last ``window`` tokens if it has a window)."""
        return KVCache(window=self.window)

    def _split(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, head_dim)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                return_weights: bool = False):
        """Shapes: x ``(B, T_new, hidden_size)``: all tokens (no cache; positions ``0..T-1``) or
        the new ones (with a cache; positions ``cache.seen ..``).

        Returns ``out`` ``(B, T_new, hidden_size)``, or ``(out, weights)`` with weights
        ``(B, num_heads, T_new, T_k)`` when ``return_weights``.
        """
        _check_x("x", x, self.hidden_size)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache; got {type(cache).__name__}")
        B, T_new, _ = x.shape
        start = 0 if cache is None else cache.seen
        q_pos = torch.arange(start, start + T_new)  # absolute positions of the new tokens
        Q = apply_rope(self._split(self.q_proj(x), self.num_heads), q_pos, self.rope_base)
        k = apply_rope(self._split(self.k_proj(x), self.num_kv_heads), q_pos, self.rope_base)
        v = self._split(self.v_proj(x), self.num_kv_heads)
        if cache is None:
            K, V, k_pos = k, v, q_pos
        else:
            K, V, k_pos = cache.update(k, v)  # the cache stores keys already rotated
        mask = positions_mask(q_pos, k_pos, self.window).to(x.device)  # (T_new, T_k)
        context, weights = gqa_attention(Q, K, V, mask)  # (B, num_heads, T_new, head_dim)
        out = self.o_proj(context.transpose(1, 2).reshape(B, T_new, self.num_heads * self.head_dim))
        return (out, weights) if return_weights else out


class TransformersLlamaAttention:
    """Hugging Face ``transformers``' ``LlamaAttention`` (eager path, random weights), called like
    ``LlamaStyleAttention``: ``ref(x, cache)`` with x ``(B, T_new, hidden_size)`` returns
    ``(B, T_new, hidden_size)``; without a cache the tokens sit at positions ``0..T_new-1``, with
    one (from ``new_cache()``, a ``DynamicCache``) at the next ``T_new`` positions after those it
    holds. It builds what ``LlamaAttention`` takes besides ``x``: RoPE's cosines and sines from
    ``LlamaRotaryEmbedding`` and an additive bottom-right causal mask ``(1, 1, T_new, T_k)``.
    Needs ``transformers >= 5`` (its call signature and cache layout); see
    ``transformers_llama_attention``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int,
                 rope_base: float = 10000.0, seed: int = 0):
        from transformers import DynamicCache, LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        self._DynamicCache = DynamicCache
        self.config = LlamaConfig(hidden_size=hidden_size, num_attention_heads=num_heads,
                                  num_key_value_heads=num_kv_heads, rope_theta=rope_base,
                                  attention_bias=False, attn_implementation="eager")
        torch.manual_seed(seed)
        self.layer = LlamaAttention(self.config, layer_idx=0).eval()
        self.rotary = LlamaRotaryEmbedding(self.config)

    def state_dict(self):
        """The layer's weights: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (no biases)."""
        return self.layer.state_dict()

    def new_cache(self):
        """An empty ``transformers.DynamicCache``."""
        return self._DynamicCache(config=self.config)

    @staticmethod
    def cached_keys(cache) -> torch.Tensor:
        """The keys a ``DynamicCache`` holds for this layer, ``(B, H_kv, T, head_dim)``."""
        return cache.layers[0].keys

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        T_new = x.shape[1]
        start = 0 if cache is None else cache.get_seq_length()
        positions = torch.arange(start, start + T_new)
        # (T_new, T_k), bottom-right causal
        visible = positions_mask(positions, torch.arange(start + T_new))
        additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))[None, None]
        out, _ = self.layer(x, self.rotary(x, positions[None]), additive, past_key_values=cache)
        return out


def transformers_llama_attention(hidden_size: int, num_heads: int, num_kv_heads: int,
                                 rope_base: float = 10000.0, seed: int = 0):
    """``TransformersLlamaAttention(...)``, or ``None`` after printing one sentence that says which
    comparison will not run and why (``transformers`` missing, or older than version 5)."""
    try:
        import transformers
    except ImportError:
        print("SKIPPED: the comparison with transformers' LlamaAttention did not run: "
              "transformers is not installed (pip install 'transformers>=5'); only the "
              "course's own checks run.")
        return None
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        print(f"SKIPPED: the comparison with transformers' LlamaAttention did not run: it needs "
              f"transformers >= 5 (its call signature and cache layout), found "
              f"{transformers.__version__}; only the course's own checks run.")
        return None
    return TransformersLlamaAttention(hidden_size, num_heads, num_kv_heads, rope_base, seed)
