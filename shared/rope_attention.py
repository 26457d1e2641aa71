"""Causal multi-head attention with rotary position embeddings (RoPE), as in LLaMA-style models
(notebook 07).

The only change from ``shared.modules.MultiHeadAttention`` is where position enters: not as a
vector added to the input, but as a rotation of every query and key (never the values) by an
angle proportional to the token's position, applied per head after the split into heads. The
scores then depend on positions only through the distance between query and key.

There is no position table and no fixed maximum length: any ``T`` works, and the causal mask is
built for the ``T`` at hand.
"""

from __future__ import annotations

import torch
from torch import nn

from shared.modules import _check_dropout, _check_positive_int, _check_x, attention_weights
from shared.positional import _check_base, apply_rope

__all__ = ["RoPEMultiHeadAttention"]


class RoPEMultiHeadAttention(nn.Module):
    """Multi-head self-attention with RoPE on the queries and keys.

    ``W_query``, ``W_key``, ``W_value`` are ``nn.Linear(d_in, d_out)`` split into ``num_heads``
    heads of ``head_dim = d_out // num_heads`` features (head ``h`` owns output features
    ``h*head_dim:(h+1)*head_dim``), ``out_proj`` is ``nn.Linear(d_out, d_out)``, exactly like
    ``shared.modules.MultiHeadAttention``. Per head, ``Q`` and ``K`` are rotated with
    ``shared.positional.apply_rope(..., base=base, interleaved=interleaved)``; ``head_dim`` must
    be even. ``causal=True`` (default) masks the future; dropout acts on the attention weights.
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, base: float = 10000.0,
                 interleaved: bool = False, dropout: float = 0.0, qkv_bias: bool = False,
                 causal: bool = True):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.num_heads = _check_positive_int("num_heads", num_heads)
        if d_out % num_heads:
            raise ValueError(
                f"d_out must be divisible by num_heads; got d_out = {d_out}, num_heads = "
                f"{num_heads} (d_out % num_heads = {d_out % num_heads})"
            )
        self.head_dim = d_out // num_heads
        if self.head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of features, so head_dim = d_out // num_heads must be even; "
                f"got head_dim = {self.head_dim} (d_out = {d_out}, num_heads = {num_heads})"
            )
        self.base = _check_base(base)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be True or False; got {interleaved!r}")
        self.interleaved = interleaved
        self.causal = bool(causal)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(_check_dropout(dropout))

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_out)`` -> ``(B, num_heads, T, head_dim)``."""
        B, T, _ = t.shape
        return t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def rotated_qkv(self, x: torch.Tensor, positions=None):
        """The per-head tensors attention runs on: ``(Q_rot, K_rot, V)``, each
        ``(B, num_heads, T, head_dim)``; ``Q`` and ``K`` rotated by ``positions``, ``V`` not.

        Shapes: x ``(B, T, d_in)``; positions ``(T,)`` integers (default ``0 .. T-1``).
        """
        _check_x("x", x, self.d_in)
        T = x.shape[1]
        if positions is None:
            positions = torch.arange(T)
        Q = self._split_heads(self.W_query(x))  # (B, H, T, head_dim)
        K = self._split_heads(self.W_key(x))
        V = self._split_heads(self.W_value(x))
        Q = apply_rope(Q, positions, base=self.base, interleaved=self.interleaved)
        K = apply_rope(K, positions, base=self.base, interleaved=self.interleaved)
        return Q, K, V

    def forward(self, x: torch.Tensor, positions=None, return_weights: bool = False):
        """Shapes: x ``(B, T, d_in)``; positions ``(T,)`` integers, the position of each token
        (default ``0 .. T-1``; shifting them all by the same offset changes nothing but
        rounding).

        Returns ``out`` ``(B, T, d_out)``, or ``(out, weights)`` with weights
        ``(B, num_heads, T, T)`` (after dropout) when ``return_weights``.
        """
        Q, K, V = self.rotated_qkv(x, positions)
        B, _, T, _ = Q.shape
        weights = attention_weights(Q, K, causal=self.causal)  # (B, H, T, T)
        weights = self.dropout(weights)
        context = weights @ V  # (B, H, T, head_dim)
        context = context.transpose(1, 2).contiguous().view(B, T, self.d_out)
        out = self.out_proj(context)  # (B, T, d_out)
        return (out, weights) if return_weights else out
