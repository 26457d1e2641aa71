"""Training through tiled attention: FlashAttention's backward pass, in plain PyTorch (notebook 10).

For ``O = softmax(S) V`` with ``S = Q K^T / sqrt(d_k)`` and ``P = softmax(S)``, the gradients of a
loss with upstream gradient ``dO`` are

* ``dV = P^T dO`` and ``dP = dO V^T``;
* ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)`` (one number per query: the softmax backward);
* ``dQ = dS K / sqrt(d_k)`` and ``dK = dS^T Q / sqrt(d_k)``.

Autograd on naive attention keeps ``P`` ``(..., T_q, T_k)`` from the forward pass for this. The
flash backward keeps only the output ``O`` and each row's log-sum-exp ``L`` (from
``shared.flash.tiled_attention(..., return_lse=True)``) and recomputes every tile of ``P`` as
``exp(S_tile - L)`` when it needs it. The loop is that of FlashAttention's backward pass (Dao et
al. 2022, Algorithm 4): the outer loop walks the key/value blocks and keeps that block's ``dK``
and ``dV`` as running sums; the inner loop walks the query blocks and adds each tile's share into
``dQ``. Keeping the single ``L = m + log(l)`` per query instead of the running max ``m`` and sum
``l`` is FlashAttention-2's (Dao 2023), which also runs one GPU thread block per key block in the
backward and adds into ``dQ`` atomically. Extra memory beyond the inputs and their gradients:
``D`` and ``L`` ``(N, T_q)`` and a few ``(N, block_size, block_size)`` tiles, where ``N`` is
batch x heads; nothing of size ``T_q x T_k``.

Masks follow the course: boolean, True = may attend, ``causal`` aligned top-left like
``F.scaled_dot_product_attention(is_causal=True)``. A query that may attend to nothing gets a zero
output and zero gradients, never NaN: its ``L`` is set to ``+inf`` (a convention FlashAttention's
kernels share; the true log-sum-exp, ``-inf``, would make ``exp(S - L)`` NaN), so its
recomputed ``P`` is 0. float16/bfloat16 inputs are computed in float32 and the gradients rounded
back at the end.
"""

from __future__ import annotations

import math

import torch

from shared.flash import (
    DEFAULT_BLOCK_SIZE,
    _batch_and_sizes,
    _check_inputs,
    _mask_tile,
    tiled_attention,
)

__all__ = ["FlashAttentionFunction", "flash_attention", "flash_backward", "saved_tensor_bytes"]


def flash_backward(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, O: torch.Tensor,
                   L: torch.Tensor, dO: torch.Tensor, causal: bool = False,
                   block_size: int = DEFAULT_BLOCK_SIZE, mask: torch.Tensor | None = None,
                   batch: tuple | None = None):
    """``(dQ, dK, dV)`` of attention, recomputing the weights tile by tile from ``Q``, ``K``, ``L``.

    Shapes: Q ``(N, T_q, d_k)``, K ``(N, T_k, d_k)``, V ``(N, T_k, d_v)``, O and dO
    ``(N, T_q, d_v)``, L ``(N, T_q)`` (``+inf`` for a query that may attend to nothing), where
    ``N`` is the product of the batch dimensions ``batch`` (default ``(N,)``); mask ``None`` or
    boolean, broadcastable to ``(*batch, T_q, T_k)`` (True = may attend; each tile is expanded
    as it is used, so a ``(B, 1, 1, T_k)`` padding mask never grows to ``T_q x T_k`` per head).
    Returns tensors shaped like Q, K and V, in their dtype.
    """
    N, T_q, d_k = Q.shape
    batch = (N,) if batch is None else tuple(batch)
    T_k, d_v = V.shape[-2:]
    acc = torch.promote_types(Q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d_k)
    q, k, v = Q.to(acc), K.to(acc), V.to(acc)
    dO = dO.to(acc)
    D = (dO * O.to(acc)).sum(dim=-1, keepdim=True)  # (N, T_q, 1): rowsum(dO * O)
    L = L.to(acc).unsqueeze(-1)  # (N, T_q, 1)
    dQ = torch.zeros(N, T_q, d_k, dtype=acc, device=Q.device)
    dK = torch.empty(N, T_k, d_k, dtype=acc, device=Q.device)
    dV = torch.empty(N, T_k, d_v, dtype=acc, device=Q.device)
    for k0 in range(0, T_k, block_size):  # outer loop: one key/value block
        k1 = min(k0 + block_size, T_k)
        k_blk, v_blk = k[:, k0:k1], v[:, k0:k1]
        dK_blk = torch.zeros(N, k1 - k0, d_k, dtype=acc, device=Q.device)
        dV_blk = torch.zeros(N, k1 - k0, d_v, dtype=acc, device=Q.device)
        # Causal: queries i < k0 see none of these keys -> start at the block holding query k0.
        q_start = (k0 // block_size) * block_size if causal else 0
        for q0 in range(q_start, T_q, block_size):  # inner loop: every query block
            q1 = min(q0 + block_size, T_q)
            s = torch.bmm(q[:, q0:q1], k_blk.transpose(1, 2)).mul_(scale)  # (N, bq, bk)
            blocked = None
            if mask is not None:
                tile = _mask_tile(mask, q0, q1, k0, k1).expand(*batch, q1 - q0, k1 - k0)
                blocked = ~tile.reshape(N, q1 - q0, k1 - k0)
            if causal and k1 - 1 > q0:  # the diagonal crosses this tile
                above = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=Q.device)
                above.triu_(diagonal=q0 - k0 + 1)
                blocked = above if blocked is None else blocked | above
            if blocked is not None:
                s.masked_fill_(blocked, float("-inf"))
            p = s.sub_(L[:, q0:q1]).exp_()  # P tile, recomputed: exp(S - L); masked -> 0
            dO_blk = dO[:, q0:q1]
            dV_blk.baddbmm_(p.transpose(1, 2), dO_blk)  # dV_j += P^T dO_i
            dP = torch.bmm(dO_blk, v_blk.transpose(1, 2))  # dP = dO_i V_j^T
            dS = dP.sub_(D[:, q0:q1]).mul_(p)  # dS = P * (dP - D), in place of dP
            del p, s
            dQ[:, q0:q1].baddbmm_(dS, k_blk, alpha=scale)  # dQ_i += dS K_j / sqrt(d)
            # dK_j += dS^T Q_i / sqrt(d)
            dK_blk.baddbmm_(dS.transpose(1, 2), q[:, q0:q1], alpha=scale)
            del dS, dP
        dK[:, k0:k1] = dK_blk
        dV[:, k0:k1] = dV_blk
    return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype)


class FlashAttentionFunction(torch.autograd.Function):
    """Tiled attention with the flash backward: saves ``Q, K, V, O, L`` (no ``T_q x T_k`` tensor).

    ``FlashAttentionFunction.apply(Q, K, V, causal, block_size, mask)`` with Q ``(*batch, T_q,
    d_k)``, K ``(*batch, T_k, d_k)``, V ``(*batch, T_k, d_v)`` (one batch shape for all three),
    mask ``None`` or boolean broadcastable to ``(*batch, T_q, T_k)``; returns O ``(*batch, T_q,
    d_v)``. Use :func:`flash_attention`, which checks its inputs and broadcasts them.
    """

    @staticmethod
    def forward(ctx, Q, K, V, causal, block_size, mask):
        O, L = tiled_attention(Q, K, V, causal=causal, block_size=block_size, mask=mask,
                               return_lse=True)
        ctx.save_for_backward(Q, K, V, O, L)  # O(T) memory: no T_q x T_k tensor is kept
        ctx.mask = mask
        ctx.causal, ctx.block_size = causal, block_size
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        batch, (T_q, d_k), (T_k, d_v) = Q.shape[:-2], Q.shape[-2:], V.shape[-2:]
        dQ, dK, dV = flash_backward(
            Q.reshape(-1, T_q, d_k), K.reshape(-1, T_k, d_k), V.reshape(-1, T_k, d_v),
            O.reshape(-1, T_q, d_v), L.reshape(-1, T_q), dO.reshape(-1, T_q, d_v),
            ctx.causal, ctx.block_size, ctx.mask, batch)
        return (dQ.reshape(Q.shape), dK.reshape(K.shape), dV.reshape(V.shape),
                None, None, None)


def flash_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False,
                    block_size: int = DEFAULT_BLOCK_SIZE,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(d_k)) V``, tiled forwards and backwards (differentiable).

    Shapes:
        Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``; the leading (batch)
        dimensions broadcast (the gradients are summed back to each input's shape). ``mask``:
        boolean, broadcastable to ``(..., T_q, T_k)``, True = may attend, combined with
        ``causal`` by AND.

    Returns:
        The output ``(..., T_q, d_v)`` in the inputs' dtype; ``.backward()`` through it runs
        :func:`flash_backward`. A query that may attend to nothing gets a zero output and zero
        gradients.

    Raises:
        TypeError / ValueError as ``shared.flash.tiled_attention`` does (non-tensors, dtypes,
        shapes, block size, a mask that is not boolean or does not broadcast).
    """
    _check_inputs(Q, K, V, causal, block_size)
    batch = _batch_and_sizes(Q, K, V, mask)[0]
    # expand is differentiable: autograd sums the gradients back over broadcast dimensions
    Q, K, V = (x.expand(*batch, *x.shape[-2:]) for x in (Q, K, V))
    return FlashAttentionFunction.apply(Q, K, V, causal, block_size, mask)


def saved_tensor_bytes(fn, exclude=()) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``fn()`` runs.

    Every tensor an operation saves passes through ``torch.autograd.graph.saved_tensors_hooks``;
    their storages are counted once each (views share one), and storages of the tensors in
    ``exclude`` (e.g. the inputs ``Q, K, V``, which exist anyway) are left out. The result of
    ``fn()`` is returned to nobody: call this for the count, then run ``fn`` again to train."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments; got {type(fn).__name__}")
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()  # noqa: F841  (alive until the count is done)
    return sum(seen.values())
