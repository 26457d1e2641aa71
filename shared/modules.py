"""Attention in PyTorch: the functional core and the modules notebooks 02-05 build and import.

Shapes follow the course's conventions: ``(..., T, d)`` tensors, boolean masks with True = may
attend, ``Q = X @ W_q``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["naive_attention"]


def naive_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False,
                    mask: torch.Tensor | None = None):
    """Attention the textbook way, materialising the whole score matrix.

    Shapes:
        Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``; mask boolean,
        broadcastable to ``(..., T_q, T_k)``, True = may attend; ``causal`` aligns top-left
        like ``F.scaled_dot_product_attention(is_causal=True)``.

    Returns:
        ``(output, weights)``: ``(..., T_q, d_v)`` and ``(..., T_q, T_k)``. A query that may
        attend to nothing gets zero weights and a zero output.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k)
    allowed = mask
    if causal:
        T_q, T_k = scores.shape[-2:]
        tri = torch.ones(T_q, T_k, dtype=torch.bool, device=scores.device).tril()
        allowed = tri if allowed is None else allowed & tri
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: 0, not NaN
    return weights @ V, weights
