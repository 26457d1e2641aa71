"""Tiled attention with an online softmax (the idea behind FlashAttention), in plain PyTorch.

Naive attention materialises the whole ``(..., T_q, T_k)`` score matrix. Here the queries are cut
into blocks of ``block_size`` rows and, for each query block, the keys and values are visited in
blocks of ``block_size`` columns. Per query row three running quantities are kept:

* ``m``: the largest score seen so far,
* ``l``: the sum of ``exp(score - m)`` over the keys seen so far,
* ``acc``: the sum of ``exp(score - m) * v`` over the keys seen so far.

When a new key block raises the maximum from ``m_old`` to ``m_new``, the old ``l`` and ``acc`` are
rescaled by ``exp(m_old - m_new)``; after the last block the output is ``acc / l``. With
``causal=True`` key blocks entirely above the diagonal are skipped and only the blocks the diagonal
crosses are masked.

Memory: besides the output ``(..., T_q, d_v)``, what exists at any moment is one
``(N, block_size, block_size)`` score tile, where ``N`` is the product of the batch dimensions
(batch x heads), plus per query block the scaled queries ``(N, block_size, d_k)``, the accumulator
``(N, block_size, d_v)`` and ``m``, ``l`` ``(N, block_size, 1)``. None of it grows with ``T``.
(Inputs whose batch dimensions must be broadcast, or that are not contiguous, are first copied
into one ``(N, T, d)`` tensor each: linear in ``T``.)

Precision: like real FlashAttention kernels, the scores, ``m``, ``l`` and ``acc`` are kept in
float32 when the inputs are float16 or bfloat16 (each tile of Q, K and V is converted as it is
used); only the final output is rounded to the inputs' dtype. float32 and float64 inputs are
computed in their own dtype.

A query that may attend to nothing (its row of ``mask`` is all False) gets a zero output, never
NaN: a row whose scores so far are all ``-inf`` is rescaled by 0 instead of
``exp(-inf - (-inf)) = nan``, and ``acc / l`` with ``l = 0`` is taken as 0.

For training (notebook 10, ``shared.flash_backward``), ``return_lse=True`` also returns each
row's log-sum-exp ``L = m + log(l)`` of its scaled scores: the one number per query that lets a
backward pass recompute any tile of the weights as ``exp(S_tile - L)``. A row that may attend to
nothing gets ``L = +inf`` (as FlashAttention stores it), so that recomputation gives 0 there.
"""

from __future__ import annotations

import math

import torch

from shared.attention import check_qkv_shapes

__all__ = ["tiled_attention", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 256


def _check_inputs(Q, K, V, causal, block_size, return_lse=False) -> None:
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (..., T, d); got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")
        if x.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., T, d); got shape {tuple(x.shape)}"
            )
    if not (Q.dtype == K.dtype == V.dtype):
        raise TypeError(f"Q, K and V must share one dtype; got {Q.dtype}, {K.dtype} and {V.dtype}")
    if not (Q.device == K.device == V.device):
        raise ValueError(
            f"Q, K and V must be on one device; got {Q.device}, {K.device} and {V.device}"
        )
    check_qkv_shapes(Q.shape, K.shape, V.shape)
    if Q.shape[-2] == 0 or K.shape[-2] == 0 or Q.shape[-1] == 0:
        raise ValueError(
            f"T_q, T_k and d_k must be at least 1; got Q {tuple(Q.shape)} and K {tuple(K.shape)}"
        )
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")


def _check_mask(mask, batch, T_q: int, T_k: int, device) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = f"dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean torch.Tensor (True = may attend); got {got}")
    target = (*batch, T_q, T_k)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"{target} (..., T_q, T_k)"
        )
    if mask.device != device:
        raise ValueError(f"mask must be on the inputs' device {device}; got {mask.device}")


def _mask_tile(mask: torch.Tensor, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """``mask[..., q0:q1, k0:k1]``, except that a query or key dimension of size 1 (a mask that
    broadcasts along it, e.g. a ``(B, 1, 1, T_k)`` padding mask) is kept whole, not sliced away."""
    rows = slice(None) if mask.shape[-2] == 1 else slice(q0, q1)
    cols = slice(None) if mask.shape[-1] == 1 else slice(k0, k1)
    return mask[..., rows, cols]


def _batch_and_sizes(Q, K, V, mask) -> tuple[torch.Size, int, int, int, int]:
    """``(batch, T_q, T_k, d_k, d_v)`` of checked inputs: the broadcast leading dimensions and
    the sizes; a mask that does not fit them raises here."""
    try:
        batch = torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "the leading (batch) dimensions must broadcast; "
            f"got Q {tuple(Q.shape)}, K {tuple(K.shape)} and V {tuple(V.shape)}"
        ) from None
    T_q, d_k = Q.shape[-2:]
    T_k, d_v = V.shape[-2:]
    if mask is not None:
        _check_mask(mask, batch, T_q, T_k, Q.device)
    return batch, T_q, T_k, d_k, d_v


def tiled_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False,
                    block_size: int = DEFAULT_BLOCK_SIZE,
                    mask: torch.Tensor | None = None, return_lse: bool = False):
    """``softmax(Q K^T / sqrt(d_k)) V`` computed block by block with an online softmax.

    Shapes:
        Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``; the leading (batch)
        dimensions broadcast. ``T_q`` may differ from ``T_k``; ``block_size`` need not divide
        either. ``causal=True`` lets query ``i`` attend to keys ``j <= i`` (aligned top-left,
        like ``F.scaled_dot_product_attention(is_causal=True)``). ``mask``: boolean,
        broadcastable to ``(..., T_q, T_k)``, True = may attend (combined with ``causal`` by
        AND), like SDPA's boolean ``attn_mask``.

    Returns:
        The output ``(..., T_q, d_v)`` in the inputs' dtype (the weights are never formed). A
        query that may attend to nothing gets a zero output. With ``return_lse=True``, the pair
        ``(output, L)``: ``L`` ``(..., T_q)`` is each row's ``logsumexp`` of its scaled,
        masked scores, in float32 for float16/bfloat16 inputs (else the inputs' dtype), and
        ``+inf`` for a query that may attend to nothing.

    Raises:
        TypeError for non-tensors, non-float or mixed dtypes, a non-boolean mask; ValueError for
        mismatched shapes, empty sequences, a non-positive ``block_size`` or a mask that does
        not broadcast.
    """
    _check_inputs(Q, K, V, causal, block_size, return_lse)
    batch, T_q, T_k, d_k, d_v = _batch_and_sizes(Q, K, V, mask)
    # Flatten the batch dimensions into one so every step is a single batched matmul (bmm).
    q = Q.expand(*batch, T_q, d_k).reshape(-1, T_q, d_k)
    k = K.expand(*batch, T_k, d_k).reshape(-1, T_k, d_k)
    v = V.expand(*batch, T_k, d_v).reshape(-1, T_k, d_v)
    N = q.shape[0]
    # float16/bfloat16 -> float32 for everything that is summed; float32/float64 stay as they are.
    acc_dtype = torch.promote_types(Q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d_k)
    kT = k.transpose(1, 2)  # (N, d_k, T_k), a view: bmm reads it without a copy
    out = torch.empty(N, T_q, d_v, dtype=Q.dtype, device=Q.device)
    lse = torch.empty(N, T_q, dtype=acc_dtype, device=Q.device) if return_lse else None
    neg_inf = float("-inf")

    for q0 in range(0, T_q, block_size):
        q1 = min(q0 + block_size, T_q)
        # scale the small query block, not the big score tile
        q_blk = q[:, q0:q1].to(acc_dtype) * scale
        m = torch.full((N, q1 - q0, 1), neg_inf, dtype=acc_dtype, device=Q.device)  # running max
        l = torch.zeros((N, q1 - q0, 1), dtype=acc_dtype, device=Q.device)  # running sum
        acc = torch.zeros((N, q1 - q0, d_v), dtype=acc_dtype, device=Q.device)  # running numerator
        # Causal: keys k0 > q1 - 1 are masked for every query of this block -> skip them.
        k_end = min(T_k, q1) if causal else T_k
        for k0 in range(0, k_end, block_size):
            k1 = min(k0 + block_size, k_end)
            s = torch.bmm(q_blk, kT[:, :, k0:k1].to(acc_dtype))  # (N, bq, bk) scores of this tile
            blocked = None
            if mask is not None:
                tile = _mask_tile(mask, q0, q1, k0, k1)
                blocked = ~tile.expand(*batch, q1 - q0, k1 - k0).reshape(N, q1 - q0, k1 - k0)
            if causal and k1 - 1 > q0:  # the diagonal crosses this tile: mask keys above it
                above = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=Q.device)
                above.triu_(diagonal=q0 - k0 + 1)
                blocked = above if blocked is None else blocked | above
            if blocked is not None:
                s.masked_fill_(blocked, neg_inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            # A row whose scores so far are all -inf (masked) has m_new = -inf, and
            # exp(-inf - (-inf)) would be nan: measure from 0 instead, so its alpha and p are 0.
            m_ref = torch.where(m_new == neg_inf, 0.0, m_new)
            alpha = torch.exp(m - m_ref)  # exp(m_old - m_new): rescales what was summed so far
            s.sub_(m_ref).exp_()  # p = exp(s - m_new), in place
            l.mul_(alpha).add_(s.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(s, v[:, k0:k1].to(acc_dtype))  # acc = alpha * acc + p @ V_blk
            m = m_new
            del s  # free this tile before the next one is allocated: one tile alive at a time
        if lse is not None:  # L = m + log(l); l = 0 (attended to nothing) -> +inf
            lse[:, q0:q1] = torch.where(l > 0, m + torch.log(l), float("inf")).squeeze(-1)
        # Normalise once, at the end; a row that attended to nothing has l = 0 and acc = 0 -> 0.
        l = torch.where(l > 0, l, 1.0)
        if acc_dtype == out.dtype:
            torch.div(acc, l, out=out[:, q0:q1])
        else:
            out[:, q0:q1] = acc.div_(l)  # rounded to the inputs' dtype only here
    out = out.reshape(*batch, T_q, d_v)
    if lse is not None:
        return out, lse.reshape(*batch, T_q)
    return out
