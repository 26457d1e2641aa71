"""Cut the features of a tensor into attention heads and glue them back (notebook 04).

Head ``h`` owns the features ``h*head_dim:(h+1)*head_dim`` of the last axis, the course's layout
(the columns of the math's ``W_q``), which is also ``nn.MultiheadAttention``'s and GPT-2's.
"""

from __future__ import annotations

import torch

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, T, num_heads * head_dim)`` -> ``(B, num_heads, T, head_dim)``.

    A view of ``x`` (no copy): ``x.view(B, T, num_heads, head_dim).transpose(1, 2)``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (B, T, d); got {type(x).__name__}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int; got {num_heads!r}")
    if x.ndim != 3:
        raise ValueError(f"x must be 3-D (B, T, d); got shape {tuple(x.shape)} ({x.ndim}-D)")
    B, T, d = x.shape
    if d % num_heads:
        raise ValueError(f"the last dimension d = {d} of x {tuple(x.shape)} is not divisible by "
                         f"num_heads = {num_heads}")
    return x.view(B, T, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """``(B, num_heads, T, head_dim)`` -> ``(B, T, num_heads * head_dim)``, heads side by side.

    Undoes ``split_heads``; copies when ``y`` is not contiguous in that order (after a transpose).
    """
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor (B, num_heads, T, head_dim); got "
                        f"{type(y).__name__}")
    if y.ndim != 4:
        raise ValueError(f"y must be 4-D (B, num_heads, T, head_dim); got shape "
                         f"{tuple(y.shape)} ({y.ndim}-D)")
    B, H, T, head_dim = y.shape
    return y.transpose(1, 2).reshape(B, T, H * head_dim)
