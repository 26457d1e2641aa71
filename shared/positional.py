"""Positional encodings: telling attention where each token sits.

Attention itself is blind to order (permute the tokens and the outputs permute the same way). Two
ways to give it positions:

* add an encoding to the token embeddings before the first layer: ``sinusoidal_positional_encoding``
  (notebook 02, NumPy);
* put position inside the query-key product itself (notebook 07, PyTorch): rotary embeddings
  (``apply_rope`` rotates queries and keys, ``rope_frequencies`` gives the angles per position,
  ``rope_permutation`` maps one layout convention onto the other) and linear biases
  (``alibi_slopes``, ``alibi_bias``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "sinusoidal_positional_encoding",
    "rope_frequencies",
    "apply_rope",
    "rope_permutation",
    "alibi_slopes",
    "alibi_bias",
]


def sinusoidal_positional_encoding(T: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The fixed sine/cosine encoding of "Attention Is All You Need" (Vaswani et al., 2017).

    ``PE[pos, 2i] = sin(pos / base**(2i / d_model))`` and
    ``PE[pos, 2i + 1] = cos(pos / base**(2i / d_model))`` for ``i = 0 .. d_model/2 - 1``:
    each pair of columns is a clock turning at its own speed, fast on the left, slow on the right.

    Shapes: returns a float64 array ``(T, d_model)``, one row per position ``0 .. T-1``.
    ``d_model`` must be even (the columns come in sin/cos pairs).
    """
    for name, value in (("T", T), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos column pairs); got d_model = {d_model}")
    if not base > 1:
        raise ValueError(f"base must be a number greater than 1; got {base!r}")
    pos = np.arange(T, dtype=np.float64)[:, None]  # (T, 1)
    i2 = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, d_model/2): the even indices 2i
    angles = pos / base ** (i2 / d_model)  # (T, d_model/2)
    pe = np.empty((T, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# --------------------------------------------------------------------------------------------
# Rotary position embeddings (RoPE): rotate each pair of features of q and k by an angle that
# grows with the position, so that q_m . k_n depends on the positions only through m - n.
# --------------------------------------------------------------------------------------------
def _check_head_dim(head_dim) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2:
        raise ValueError(f"head_dim must be a positive even integer; got {head_dim!r}")
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of features, so the last dimension d must be even; got d = "
            f"{head_dim}"
        )
    return int(head_dim)


def _check_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)) \
            or not math.isfinite(base) or not base > 1:
        raise ValueError(f"base must be a finite number greater than 1; got {base!r}")
    return float(base)


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The angle per position of each feature pair: ``theta_i = base ** (-2i / head_dim)``.

    Pair ``i`` of a vector at position ``m`` is rotated by ``m * theta_i``: pair 0 turns one
    radian per position, the last pair barely moves (``base`` sets how slowly).

    Shapes: returns a float64 tensor ``(head_dim // 2,)``; ``head_dim`` must be even.
    """
    head_dim, base = _check_head_dim(head_dim), _check_base(base)
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def _check_positions(positions, T: int) -> torch.Tensor:
    """``positions`` as a 1-D int64 CPU tensor of length ``T``, or a clear error."""
    if isinstance(positions, torch.Tensor):
        if positions.dtype == torch.bool or positions.is_floating_point() \
                or positions.is_complex():
            raise TypeError(
                f"positions must be integers (e.g. torch.arange(T)); got a tensor of dtype "
                f"{positions.dtype}"
            )
        pos = positions.detach().to(device="cpu", dtype=torch.int64)
    else:
        if not isinstance(positions, (Sequence, np.ndarray)) or isinstance(positions, str):
            raise TypeError(
                "positions must be a 1-D tensor, array or list of integers (e.g. "
                f"torch.arange(T)); got {type(positions).__name__}"
            )
        arr = np.asarray(positions)
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(
                f"positions must be integers (e.g. torch.arange(T)); got {type(positions).__name__}"
                f" with dtype {arr.dtype}"
            )
        pos = torch.from_numpy(arr.astype(np.int64).reshape(arr.shape))
    if pos.ndim != 1:
        raise ValueError(
            f"positions must be 1-D, one position per token: shape (T,) = ({T},); got shape "
            f"{tuple(pos.shape)}"
        )
    if pos.shape[0] != T:
        raise ValueError(
            f"positions has {pos.shape[0]} entries but x has T = {T} tokens (x.shape[-2]); "
            "give one position per token"
        )
    return pos


def apply_rope(x: torch.Tensor, positions, base: float = 10000.0,
               interleaved: bool = False, scale: float = 1.0) -> torch.Tensor:
    """Rotary position embedding: rotate every feature pair of ``x`` by ``position * theta_i``.

    Token ``t`` (row ``x[..., t, :]``) sits at ``positions[t]``; its pair ``i`` is turned by the
    angle ``positions[t] * theta_i`` with ``theta_i = base ** (-2i / d)``
    (``rope_frequencies``). Which features form pair ``i`` is a convention:

    * ``interleaved=False`` (default, "half-split": GPT-NeoX, Hugging Face's LLaMA code):
      features ``(i, i + d/2)``;
    * ``interleaved=True`` (RoFormer, GPT-J, Meta's original LLaMA code): features
      ``(2i, 2i + 1)``.

    A rotation keeps lengths, so ``|apply_rope(x)| = |x|`` row by row, and for a query at
    position m and a key at position n the dot product of the rotated vectors depends on m - n
    only. The two conventions give different results on the same ``x``; ``rope_permutation``
    maps one onto the other.

    ``scale > 1`` is *position interpolation* (Chen et al., 2023): every position is divided by
    ``scale`` before it is turned into angles, so ``scale`` times as many tokens fit into the
    range of angles a model saw in training (``scale = 1``, the default, is plain RoPE).

    Shapes:
        x ``(..., T, d)`` floating-point tensor, ``d`` even (e.g. ``(B, H, T, head_dim)``);
        positions ``(T,)`` integers (tensor, array or list; negative is allowed).

    Returns:
        a tensor like ``x`` (same shape, dtype and device). The angles are computed in float64.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (..., T, d); got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"x must be a floating-point tensor (e.g. torch.float32); got dtype {x.dtype}"
        )
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, d); got shape {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(
            "RoPE rotates pairs of features, so the last dimension d must be even; got d = "
            f"{d} (x has shape {tuple(x.shape)})"
        )
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be True or False; got {interleaved!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 \
            or not math.isfinite(scale):
        raise ValueError(f"scale must be a positive finite number (1 = plain RoPE); got {scale!r}")
    theta = rope_frequencies(d, base)  # (d/2,) float64
    pos = _check_positions(positions, T)  # (T,) int64
    angles = (pos.to(torch.float64) / float(scale))[:, None] * theta[None, :]  # (T, d/2)
    cos = angles.cos().to(device=x.device, dtype=x.dtype)
    sin = angles.sin().to(device=x.device, dtype=x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]  # pair i = features (2i, 2i + 1)
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]  # pair i = features (i, i + d/2)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rope_permutation(head_dim: int) -> torch.Tensor:
    """The feature order that turns the interleaved layout into the half-split one:
    ``[0, 2, 4, ..., d-2, 1, 3, ..., d-1]``.

    With ``perm = rope_permutation(d)``,
    ``apply_rope(x[..., perm], p) == apply_rope(x, p, interleaved=True)[..., perm]``, so a model
    trained with interleaved RoPE runs unchanged under half-split RoPE once the output features
    of its ``W_q`` and ``W_k`` are reordered by ``perm`` within every head (the dot products
    ``q . k`` do not change when both vectors are permuted the same way).
    ``torch.argsort(perm)`` is the way back.

    Shapes: returns an int64 tensor ``(head_dim,)``; ``head_dim`` must be even.
    """
    head_dim = _check_head_dim(head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


# --------------------------------------------------------------------------------------------
# ALiBi (attention with linear biases): no rotation, a penalty that grows linearly with distance
# --------------------------------------------------------------------------------------------
def _check_num_heads(num_heads) -> int:
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) \
            or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer; got {num_heads!r}")
    return int(num_heads)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The per-head slopes ``m_h`` of ALiBi (Press, Smith & Lewis, 2022).

    For a power of two ``H``: the geometric sequence ``m_h = 2 ** (-8h / H)``, ``h = 1 .. H``
    (for 8 heads: 1/2, 1/4, ..., 1/256). Otherwise, as in the paper's code: the slopes for the
    nearest lower power of two ``P``, then every other slope of the sequence for ``2P``.

    Shapes: returns a float64 tensor ``(num_heads,)``.
    """
    num_heads = _check_num_heads(num_heads)
    P = 2 ** int(math.floor(math.log2(num_heads)))

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    slopes = geometric(P) + geometric(2 * P)[0::2][: num_heads - P]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(num_heads: int, T: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The causal ALiBi bias as an additive float mask: ``-m_h * (i - j)`` for a query at ``i``
    and a key at ``j <= i``, ``-inf`` for the future ``j > i``.

    Add it to the scaled scores ``Q K^T / sqrt(d)`` before the softmax; pass it as
    ``attn_mask=`` to ``F.scaled_dot_product_attention``, which adds float masks to exactly
    those scores (do not also set ``is_causal``: the ``-inf`` entries already are the causal
    mask). Every row keeps its diagonal (bias 0), so no row is fully masked.

    Shapes: returns ``(num_heads, T, T)`` of ``dtype`` (broadcasts over a batch
    ``(B, num_heads, T, T)``); slopes from ``alibi_slopes(num_heads)``.
    """
    slopes = alibi_slopes(num_heads)
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"T must be a positive integer; got {T!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype; got {dtype!r}")
    i = torch.arange(T, dtype=torch.float64)
    j_minus_i = i[None, :] - i[:, None]  # (T, T): -(distance), negative for past keys
    bias = slopes[:, None, None] * j_minus_i  # (H, T, T): -m_h * (i - j), 0 on the diagonal
    bias = bias.masked_fill(j_minus_i > 0, float("-inf"))  # the future: may not attend
    return bias.to(dtype)
