"""The checkers of notebook 05: each accepts a reference solution, says "not attempted yet" for the
shipped stub, and rejects typical wrong answers with the hint for that mistake. The reference
solutions here are written independently of the checkers (and checked against PyTorch below)."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import torch

from shared import exercises as ex
from shared.benchmark import SimulatedGPU
from shared.exercises import nb05


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


# 5.2 ------------------------------------------------------------------------------------------
def merge_ok(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    ref = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key at all
    a1, a2 = torch.exp(m1 - ref), torch.exp(m2 - ref)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def merge_float32(m1, l1, acc1, m2, l2, acc2):
    return merge_ok(*(t.float() for t in (m1, l1, acc1, m2, l2, acc2)))


def merge_flat(m1, l1, acc1, m2, l2, acc2):  # (n,) statistics: acc / l would divide columns
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return m.squeeze(-1), l.squeeze(-1), acc


def merge_flat_l(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return m, l.squeeze(-1), acc


def merge_row_vector(m1, l1, acc1, m2, l2, acc2):  # (1, n): the right size, the wrong shape
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return m.mT, l.mT, acc


def merge_acc_batched(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return m, l, acc.unsqueeze(0)


def merge_wrong_order(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return l, m, acc


def merge_acc_first(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return acc, m, l


def merge_swapped_no_rescale(m1, l1, acc1, m2, l2, acc2):  # m and l swapped, acc wrong as well
    m, l, _ = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return l, m, acc1 + acc2


def merge_finite_empty_m(m1, l1, acc1, m2, l2, acc2):  # the finite reference returned as m
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m)), l, acc


def merge_very_negative_empty_m(m1, l1, acc1, m2, l2, acc2):  # -1e30 "as good as -inf"
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return torch.where(torch.isfinite(m), m, torch.full_like(m, -1e30)), l, acc


def merge_no_guard(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def merge_no_rescale(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def merge_rescale_second_only(m1, l1, acc1, m2, l2, acc2):
    m, _, _ = merge_ok(m1, l1, acc1, m2, l2, acc2)
    a2 = torch.exp(m2 - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    return m, l1 + a2 * l2, acc1 + a2 * acc2


def merge_inverted(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def merge_normalised(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = merge_ok(m1, l1, acc1, m2, l2, acc2)
    return m, l, torch.where(l > 0, acc / l.clamp(min=1e-300), torch.zeros_like(acc))


def merge_average_outputs(m1, l1, acc1, m2, l2, acc2):
    m, l, _ = merge_ok(m1, l1, acc1, m2, l2, acc2)
    o1 = torch.where(l1 > 0, acc1 / l1.clamp(min=1e-300), torch.zeros_like(acc1))
    o2 = torch.where(l2 > 0, acc2 / l2.clamp(min=1e-300), torch.zeros_like(acc2))
    return m, l, (o1 + o2) / 2


def merge_in_place(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    ref = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    a1, a2 = torch.exp(m1 - ref), torch.exp(m2 - ref)
    acc1.mul_(a1).add_(a2 * acc2)  # right numbers, but the caller's acc1 is gone
    return m, a1 * l1 + a2 * l2, acc1


def merge_one_max(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    finite = m[torch.isfinite(m)]
    m_all = finite.max().expand_as(m)
    a1, a2 = torch.exp(m1 - m_all), torch.exp(m2 - m_all)
    return m_all, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


# 5.3 ------------------------------------------------------------------------------------------
# naive attention's forward + backward peak with the nan_to_num guard, in score matrices, by hand:
# at nan_to_num's backward, dP_clean arriving + P (saved for softmax's backward) + isfinite(P)
# (bool, 1/4) + its float32 copy + dP made = 4.25; the same measured by
# test_no_guard_chain_peak_is_the_graph_bound measures PEAK_GRAPH; the guarded chain, PEAK_GUARDED
PEAK_GRAPH, PEAK_GUARDED, PEAK_P_TWICE, PEAK_ALL_MADE = 3, 4.25, 4, 6
PEAK_NO_SAVED, PEAK_OFF_QUARTER, PEAK_WITH_D_OVER_T, PEAK_HALF = 2, 3.1, 3.125, 3.5
PEAK_NOT_WHOLE = (2.5, 2.75, 3.02, PEAK_OFF_QUARTER, PEAK_WITH_D_OVER_T, 3.25, PEAK_HALF, PEAK_GUARDED, 4.5)


# 5.4 (a): which rows the colleague's loop gets right -------------------------------------------
def rows_ok(S, block_size):  # the row's maximum over all keys is reached inside the first block
    return S[..., :block_size].amax(dim=-1) >= S.amax(dim=-1)


def rows_numpy(S, block_size):  # a NumPy bool array is fine
    return rows_ok(S, block_size).numpy()


def rows_last_block(S, block_size):
    last = (S.shape[-1] - 1) // block_size * block_size
    return S[..., last:].amax(dim=-1) >= S.amax(dim=-1)


def rows_inverted(S, block_size):
    return ~rows_ok(S, block_size)


def rows_always_true(S, block_size):  # the colleague's test
    return torch.ones(S.shape[:-1], dtype=torch.bool)


def rows_always_false(S, block_size):
    return torch.zeros(S.shape[:-1], dtype=torch.bool)


def rows_strict(S, block_size):  # ties with a later block counted wrong
    later = S[..., block_size:]
    if later.shape[-1] == 0:
        return torch.ones(S.shape[:-1], dtype=torch.bool)
    return S[..., :block_size].amax(dim=-1) > later.amax(dim=-1)


def rows_all_first(S, block_size):  # every first-block score above every later one
    later = S[..., block_size:]
    if later.shape[-1] == 0:
        return torch.ones(S.shape[:-1], dtype=torch.bool)
    return S[..., :block_size].amin(dim=-1) >= later.amax(dim=-1)


def rows_tolerant(S, block_size):  # the rule with a tolerance: a later maximum a hair higher slips through
    return S[..., :block_size].amax(-1) >= S.amax(-1) - 1e-3


def rows_isclose(S, block_size):
    return torch.isclose(S[..., :block_size].amax(-1), S.amax(-1))


def rows_query_axis(S, block_size):  # the rule over the queries, one entry per key
    return S[..., :block_size, :].amax(dim=-2) >= S.amax(dim=-2)


def rows_float(S, block_size):
    return rows_ok(S, block_size).double()


def rows_list(S, block_size):
    return rows_ok(S, block_size).tolist()


def rows_one_block(S, block_size):  # right only when one block holds every key
    return torch.full(S.shape[:-1], S.shape[-1] <= block_size)


def rows_later_max_strict(S, block_size):  # natural, but amax of an empty slice raises when one block holds all
    return S[..., :block_size].amax(-1) > S[..., block_size:].amax(-1)


def rows_later_max(S, block_size):
    return S[..., :block_size].amax(-1) >= S[..., block_size:].amax(-1)


def rows_numpy_later_max(S, block_size):  # the same in NumPy: ValueError on an empty slice
    s = S.numpy()
    return torch.from_numpy(s[..., :block_size].max(-1) >= s[..., block_size:].max(-1))


def rows_keepdim(S, block_size):
    return S[..., :block_size].amax(dim=-1, keepdim=True) >= S.amax(dim=-1, keepdim=True)


# 5.4 (c): the fixed loop and typical wrong fixes ----------------------------------------------
def _key_blocks(Q, K, V, block_size, step):
    """The colleague's loop with its per-block update supplied by ``step(m, m_new, l, acc, s, v)``;
    returns what step's last state gives (acc / l unless step says otherwise)."""
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s, v = S[..., k0:k0 + block_size], V[..., k0:k0 + block_size, :]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        l, acc = step(m, m_new, l, acc, s, v)
        m = m_new
    return acc / l


def fix_ok(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_einsum_where(Q, K, V, block_size):  # ordinary ops of every kind, under the checker's mode
    scale = Q.shape[-1] ** -0.5
    m = l = acc = None
    for k0 in range(0, K.shape[-2], block_size):
        s = torch.einsum("...qd,...kd->...qk", Q, K[..., k0:k0 + block_size, :]) * scale
        m_blk = s.max(dim=-1, keepdim=True).values
        m_new = m_blk if m is None else torch.where(m > m_blk, m, m_blk)
        p = (s - m_new).exp()
        blk = torch.matmul(p, V.narrow(-2, k0, min(block_size, K.shape[-2] - k0)))
        if m is None:
            l, acc = p.sum(-1, keepdim=True), blk
        else:
            alpha = (m - m_new).exp()
            l = l.mul(alpha).add(p.sum(-1, keepdim=True))
            acc = acc * alpha
            acc += blk  # in place on its own tensor: fine
        m = m_new
    out = acc.div(l)
    assert bool(torch.isfinite(out).all()) and float(out.abs().max().item()) >= 0
    return out.contiguous().clone()


def fix_unchanged_bug(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        p = torch.exp(s - m_new)
        return l * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True), acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_l_not_rescaled(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        p = torch.exp(s - m_new)
        return l + p.sum(dim=-1, keepdim=True), torch.exp(m - m_new) * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_inverted(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        alpha = torch.exp(m_new - m)
        p = torch.exp(s - m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_inverted_guarded(Q, K, V, block_size):  # exp(m_new - m), the first block guarded: too large
    def step(m, m_new, l, acc, s, v):
        alpha = torch.where(torch.isfinite(m), torch.exp(m_new - m), torch.zeros_like(m))
        p = torch.exp(s - m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_normalised_in_loop(Q, K, V, block_size):  # acc divided by l in every block
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    out = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        out = (alpha * out + p @ V[..., k0:k0 + block_size, :]) / l
        m = m_new
    return out


def fix_no_max(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        p = torch.exp(s)
        return l + p.sum(dim=-1, keepdim=True), acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_rescale_after(Q, K, V, block_size):
    def step(m, m_new, l, acc, s, v):
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), (acc + p @ v) * alpha
    return _key_blocks(Q, K, V, block_size, step)


def fix_sdpa(Q, K, V, block_size):
    return torch.nn.functional.scaled_dot_product_attention(Q, K, V)


def fix_softmax_method(Q, K, V, block_size):
    return (Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])).softmax(dim=-1) @ V


def fix_torch_softmax(Q, K, V, block_size):
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def fix_functional_softmax(Q, K, V, block_size):
    return torch.nn.functional.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def fix_multihead(Q, K, V, block_size):  # nn.MultiheadAttention: the right idea's module, not the loop
    mha = torch.nn.MultiheadAttention(Q.shape[-1], 1, batch_first=True, dtype=Q.dtype)
    mha(Q.reshape(-1, *Q.shape[-2:]), K.reshape(-1, *K.shape[-2:]), K.reshape(-1, *K.shape[-2:]))
    return fix_ok(Q, K, V, block_size)


def fix_scales_q_in_place(Q, K, V, block_size):
    Q /= math.sqrt(Q.shape[-1])
    return fix_ok(Q * math.sqrt(Q.shape[-1]), K, V, block_size)


def fix_float64_out(Q, K, V, block_size):
    return fix_ok(Q.double(), K.double(), V.double(), block_size)


def fix_one_block_only(Q, K, V, block_size):  # the first block's keys only
    return fix_ok(Q, K[..., :block_size, :], V[..., :block_size, :], block_size)


def fix_two_pass(Q, K, V, block_size):  # the whole row's maximum first: right numbers, no block loop
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    p = torch.exp(S - S.amax(dim=-1, keepdim=True))
    return (p @ V) / p.sum(dim=-1, keepdim=True)


def _max_first(Q, K, V, block_size, row_max):  # two passes: the row's max first, then sums block by block
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = row_max(S)
    l, acc = torch.zeros_like(m), torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        p = torch.exp(S[..., k0:k0 + block_size] - m)
        l, acc = l + p.sum(dim=-1, keepdim=True), acc + p @ V[..., k0:k0 + block_size, :]
    return acc / l


def fix_global_max_first(Q, K, V, block_size):  # the max by Tensor.amax
    return _max_first(Q, K, V, block_size, lambda S: S.amax(dim=-1, keepdim=True))


def fix_torch_max_first(Q, K, V, block_size):  # the same with torch.max(S, dim=-1)
    return _max_first(Q, K, V, block_size, lambda S: torch.max(S, -1, keepdim=True).values)


def fix_dk_wide(Q, K, V, block_size):  # output d_k wide, not d_v
    return fix_ok(Q, K, K, block_size)


def fix_notebook_loop(Q, K, V, block_size):  # the colleague's loop verbatim, the one line fixed
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)   # running max, per query
    l = torch.zeros_like(m)                                         # running sum of exp(s - m)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)    # running sum of exp(s - m) v
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)
        l = l * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True)
        acc = acc * torch.exp(m - m_new) + p @ V[..., k0:k0 + block_size, :]
        m = m_new
    return acc / l


def fix_in_place(Q, K, V, block_size):  # in-place updates of its own l, acc and p
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, torch.amax(s, dim=-1, keepdim=True))
        alpha = (m - m_new).exp_()
        p = (s - m_new).exp_()
        l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
        acc.mul_(alpha).add_(p @ V[..., k0:k0 + block_size, :])
        m = m_new
    return acc.div_(l)


def fix_first_block_max_up_front(Q, K, V, block_size):  # m starts at the first block's max: one sweep
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = S[..., :block_size].amax(dim=-1, keepdim=True)
    l, acc = torch.zeros_like(m), torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        l, acc = alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ V[..., k0:k0 + block_size, :]
        m = m_new
    return acc / l


def _two_sweeps(Q, K, V, block_size, block_max):  # every block's max first, then the sums, no rescale
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = None
    for k0 in range(0, S.shape[-1], block_size):
        bm = block_max(S[..., k0:k0 + block_size])
        m = bm if m is None else torch.maximum(m, bm)
    l, acc = torch.zeros_like(m), torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        p = torch.exp(S[..., k0:k0 + block_size] - m)
        l, acc = l + p.sum(dim=-1, keepdim=True), acc + p @ V[..., k0:k0 + block_size, :]
    return acc / l


def fix_two_sweeps_sort(Q, K, V, block_size):  # every block's max by sort, then the sums
    return _two_sweeps(Q, K, V, block_size, lambda s: s.sort(dim=-1).values[..., -1:])


def fix_two_sweeps_topk(Q, K, V, block_size):
    return _two_sweeps(Q, K, V, block_size, lambda s: torch.topk(s, 1).values)


def fix_two_sweeps_kthvalue(Q, K, V, block_size):
    return _two_sweeps(Q, K, V, block_size, lambda s: s.kthvalue(s.shape[-1], keepdim=True).values)


def fix_two_sweeps_msort(Q, K, V, block_size):  # msort sorts along dim 0: the transposed block's keys
    return _two_sweeps(Q, K, V, block_size, lambda s: torch.msort(s.movedim(-1, 0))[-1].unsqueeze(-1))


def fix_two_sweeps_cummax(Q, K, V, block_size):
    return _two_sweeps(Q, K, V, block_size, lambda s: s.cummax(dim=-1).values[..., -1:])


def fix_row_max_by_sort(Q, K, V, block_size):  # the whole row's maximum by sort: a first pass
    return _max_first(Q, K, V, block_size, lambda S: S.sort(dim=-1).values[..., -1:])


def fix_numpy_max_first(Q, K, V, block_size):  # the row's maximum computed in NumPy, out of the checker's sight
    return _max_first(Q, K, V, block_size, lambda S: torch.from_numpy(S.numpy().max(-1, keepdims=True)))


def fix_asarray_max_first(Q, K, V, block_size):
    return _max_first(Q, K, V, block_size, lambda S: torch.from_numpy(np.asarray(S).max(-1, keepdims=True)))


def fix_tolist_max_first(Q, K, V, block_size):
    return _max_first(Q, K, V, block_size, lambda S: torch.tensor(S.tolist(), dtype=S.dtype).amax(-1, keepdim=True))


def fix_normalise_as_you_go(Q, K, V, block_size):  # keeps the output normalised: right, no division after the loop
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    out = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        l_new = alpha * l + p.sum(dim=-1, keepdim=True)
        out = (alpha * l * out + p @ V[..., k0:k0 + block_size, :]) / l_new
        m, l = m_new, l_new
    return out


def fix_topk_one_sweep(Q, K, V, block_size):  # each block's max by topk inside the one sweep: fine
    def step(m, m_new, l, acc, s, v):
        m_new = torch.maximum(m, s.topk(1, dim=-1).values)
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_two_sweeps(Q, K, V, block_size):
    return _two_sweeps(Q, K, V, block_size, lambda s: s.amax(dim=-1, keepdim=True))


def fix_two_sweeps_torch_max(Q, K, V, block_size):
    return _two_sweeps(Q, K, V, block_size, lambda s: torch.max(s, dim=-1, keepdim=True).values)


def fix_block_max(Q, K, V, block_size):  # each block's own max as the reference, no running max
    def step(m_old, l, acc, s, v):
        m_blk = s.amax(dim=-1, keepdim=True)
        alpha, p = torch.exp(m_old - m_blk), torch.exp(s - m_blk)
        return m_blk, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v

    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l, acc = torch.zeros_like(m), torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        m, l, acc = step(m, l, acc, S[..., k0:k0 + block_size], V[..., k0:k0 + block_size, :])
    return acc / l


def fix_exp_ratio(Q, K, V, block_size):  # exp(s) / exp(m_new): exp(s) itself overflows in float32
    def step(m, m_new, l, acc, s, v):
        alpha, p = torch.exp(m - m_new), torch.exp(s) / torch.exp(m_new)
        return alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    return _key_blocks(Q, K, V, block_size, step)


def fix_first_block_reference(Q, K, V, block_size):  # a fixed reference: right in float64 only
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    m = S[..., :block_size].amax(dim=-1, keepdim=True)
    l, acc = torch.zeros_like(m), torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        p = torch.exp(S[..., k0:k0 + block_size] - m)  # later scores far above m: inf
        l, acc = l + p.sum(dim=-1, keepdim=True), acc + p @ V[..., k0:k0 + block_size, :]
    return acc / l


# 5.4 (b): the smallest test that catches the bug ----------------------------------------------
def _t64(rows):
    return torch.tensor(rows, dtype=torch.float64)


ONE_Q, TWO_K = _t64([[1.0]]), _t64([[0.0], [2.0]])  # scores 0 then 2: the max arrives in block 2
CATCH_OK = (ONE_Q, TWO_K, _t64([[1.0, 0.0], [0.0, 1.0]]), 1)
CATCH_NUMPY = (np.array([[1.0]]), [[0.0], [2.0]], np.eye(2), np.int64(1))  # lists and NumPy
CATCH_EQUAL_V = (ONE_Q, TWO_K, _t64([[1.0], [1.0]]), 1)  # caught: the loop's weights sum past 1
CATCH_ONE_BLOCK = (ONE_Q, TWO_K, CATCH_OK[2], 2)
CATCH_MAX_FIRST = (ONE_Q, _t64([[2.0], [0.0]]), CATCH_OK[2], 1)
CATCH_ZERO_FIRST_V = (ONE_Q, TWO_K, _t64([[0.0, 0.0], [0.0, 1.0]]), 1)  # the stale term is 0 * v
CATCH_ZERO_V = (ONE_Q, TWO_K, torch.zeros(2, 3, dtype=torch.float64), 1)
CATCH_TINY = (ONE_Q, _t64([[0.0], [1e-5]]), CATCH_OK[2], 1)  # off by about 5e-6
CATCH_THREE_Q = (_t64([[1.0], [0.5], [2.0]]), TWO_K, CATCH_OK[2], 1)
CATCH_FOUR_K = (ONE_Q, _t64([[0.0], [2.0], [1.0], [0.0]]), torch.eye(4, dtype=torch.float64), 1)
CATCH_BOTH_BIG = (CATCH_THREE_Q[0], CATCH_FOUR_K[1], CATCH_FOUR_K[2], 1)
CATCH_BATCH = (ONE_Q.expand(2, 1, 1), TWO_K.expand(2, 2, 1), CATCH_OK[2].expand(2, 2, 2), 1)
CATCH_V_SHORT = (ONE_Q, TWO_K, _t64([[1.0], [0.0], [3.0]]), 1)
CATCH_DK_MISMATCH = (_t64([[1.0, 0.0]]), TWO_K, CATCH_OK[2], 1)
CATCH_BATCH_MISMATCH = (ONE_Q.expand(2, 1, 1), TWO_K, CATCH_OK[2], 1)
CATCH_FLAT_Q = (_t64([1.0]), TWO_K, CATCH_OK[2], 1)
CATCH_NAN = (_t64([[float("nan")]]), TWO_K, CATCH_OK[2], 1)
CATCH_INF_V = (ONE_Q, TWO_K, _t64([[float("inf"), 0.0], [0.0, 1.0]]), 1)
CATCH_FLOAT_BLOCK = (ONE_Q, TWO_K, CATCH_OK[2], 1.0)
CATCH_ZERO_BLOCK = (ONE_Q, TWO_K, CATCH_OK[2], 0)
CATCH_THREE_ITEMS = (ONE_Q, TWO_K, CATCH_OK[2])
CATCH_TEXT_Q = ("Q", TWO_K, CATCH_OK[2], 1)
CATCH_BOOL_V = (ONE_Q, TWO_K, torch.tensor([[True], [False]]), 1)
CATCH_ONE_KEY = (ONE_Q, _t64([[2.0]]), _t64([[1.0]]), 1)  # one key: one block whatever block_size is


# 5.5: the smallest head_dim at which S = Q @ K^T is compute-bound -----------------------------
# Q @ K^T reads Q and K (T x d each), writes S (T x T), e bytes per element, and does 2 T^2 d FLOPs:
# I(d) = 2 T^2 d / ((2 T d + T^2) e) grows with d towards T / e, so no d works when T <= balance * e.
H200, A100, T4 = 989e12 / 4.8e12, 312e12 / 2039e9, 65e12 / 320e9  # float16 balance points


def head_dim_ok(T, bytes_per_element, balance):  # the closed form: d (2T - 2 b e) >= b e T
    be = balance * bytes_per_element
    if T <= be:
        return None
    return math.ceil(be * T / (2 * (T - be)))


def head_dim_brute(T, bytes_per_element, balance):  # the FLOP and byte counts, d = 1, 2, ...
    if T <= balance * bytes_per_element:
        return None
    for d in range(1, 10**6):
        flops, nbytes = 2 * T * T * d, (T * d + T * d + T * T) * bytes_per_element
        if flops >= balance * nbytes:
            return d
    raise AssertionError("unreachable: the intensity tends to T / e > balance")


def head_dim_numpy_int(T, bytes_per_element, balance):
    d = head_dim_ok(T, bytes_per_element, balance)
    return None if d is None else np.int64(d)


def head_dim_no_write(T, bytes_per_element, balance):  # bytes of Q and K only: I = T / e for every d
    return 1 if T / bytes_per_element >= balance else None


def head_dim_no_reads(T, bytes_per_element, balance):  # bytes of S only: I = 2 d / e
    d = 1
    while 2 * T * T * d < balance * T * T * bytes_per_element:
        d += 1
    return d


def head_dim_one_flop(T, bytes_per_element, balance):  # T^2 d FLOPs: one per multiply-add
    if T <= 2 * balance * bytes_per_element:
        return None
    d = 1
    while T * T * d < balance * (2 * T * d + T * T) * bytes_per_element:
        d += 1
    return d


def head_dim_floor(T, bytes_per_element, balance):
    be = balance * bytes_per_element
    return None if T <= be else math.floor(be * T / (2 * (T - be)))


def head_dim_round(T, bytes_per_element, balance):
    be = balance * bytes_per_element
    return None if T <= be else round(be * T / (2 * (T - be)))


def head_dim_two_bytes(T, bytes_per_element, balance):
    return head_dim_ok(T, 2, balance)


def head_dim_four_bytes(T, bytes_per_element, balance):
    return head_dim_ok(T, 4, balance)


def head_dim_strict(T, bytes_per_element, balance):  # intensity > balance: one more at an exact bound
    if T <= balance * bytes_per_element:
        return None
    d = 1
    while 2 * T * T * d <= balance * (2 * T * d + T * T) * bytes_per_element:
        d += 1
    return d


def head_dim_int_plus_one(T, bytes_per_element, balance):  # int(x) + 1: the same as `>`
    be = balance * bytes_per_element
    return None if T <= be else int(be * T / (2 * (T - be))) + 1


def _with_none_as(value):
    def answer(T, bytes_per_element, balance):
        return value if T <= balance * bytes_per_element else head_dim_ok(T, bytes_per_element, balance)
    return answer


head_dim_zero, head_dim_negative = _with_none_as(0), _with_none_as(-1)
head_dim_inf, head_dim_huge = _with_none_as(math.inf), _with_none_as(10**9)


def head_dim_no_guard(T, bytes_per_element, balance):  # the bound without its condition: raises at T = b e
    be = balance * bytes_per_element
    return math.ceil(be * T / (2 * (T - be)))


def head_dim_numpy_no_guard(T, bytes_per_element, balance):  # in NumPy: inf or a negative number instead
    be = np.float64(balance) * bytes_per_element
    return int(np.ceil(be * T / (2 * (T - be)))) if T > be else np.ceil(be * T / (2 * (T - be)))


def head_dim_raises_float32(T, bytes_per_element, balance):
    if bytes_per_element == 4:
        raise ValueError("only float16 is supported")
    return head_dim_ok(T, bytes_per_element, balance)


def head_dim_unrounded(T, bytes_per_element, balance):
    be = balance * bytes_per_element
    return None if T <= be else be * T / (2 * (T - be))


def head_dim_np_ceil(T, bytes_per_element, balance):  # the right values as floats
    be = balance * bytes_per_element
    return None if T <= be else np.ceil(be * T / (2 * (T - be)))


def head_dim_bool(T, bytes_per_element, balance):
    return T > balance * bytes_per_element


def head_dim_text(T, bytes_per_element, balance):
    return str(head_dim_ok(T, bytes_per_element, balance))


def head_dim_always_none(T, bytes_per_element, balance):  # computed something, returned nothing
    d = balance * bytes_per_element / T  # noqa: F841


def head_dim_plus_one(T, bytes_per_element, balance):
    d = head_dim_ok(T, bytes_per_element, balance)
    return None if d is None else d + 1


def head_dim_minus_one(T, bytes_per_element, balance):
    d = head_dim_ok(T, bytes_per_element, balance)
    return None if d is None else d - 1


HEAD_DIM_MISTAKES = {  # each typical mistake -> the start of its hint
    head_dim_no_write: "you left out the write of S",
    head_dim_no_reads: "you left out the reads of Q and K",
    head_dim_one_flop: "count 2 FLOPs per multiply-add",
    head_dim_floor: "off by one where the bound is fractional",
    head_dim_round: "off by one where the bound is fractional",
    head_dim_two_bytes: "you used 2 bytes per element whatever bytes_per_element is",
    head_dim_four_bytes: "you used 4 bytes per element whatever bytes_per_element is",
    head_dim_strict: "compute-bound means an intensity of at least the balance point (>=)",
    head_dim_int_plus_one: "compute-bound means an intensity of at least the balance point (>=)",
    head_dim_zero: "you returned 0, but no head_dim works there",
    head_dim_negative: "you returned -1, but no head_dim works there",
    head_dim_inf: "you returned inf, but no head_dim works there",
    head_dim_huge: "you returned 1000000000, but no head_dim works there",
}


NA, OK = "not attempted yet", "correct!"
C = ex
CASES = [
    # 5.1 the prediction (13 launches of 5 us, divided by 10)
    # (50 + 2 + 2 + 10 * 2 ms, less the 15 us of warm-up launches, plus one 5 us launch) / 13
    (C.check_buggy_timing_prediction, (74.010 - 0.015) / 13, True, "divides by all 13 calls"),
    (C.check_buggy_timing_prediction, 74 / 13, True, "synchronise before its first reading and divide by the calls it timed"),
    (C.check_buggy_timing_prediction, 5.69, True, OK),
    (C.check_buggy_timing_prediction, 74 / 13, True, OK),
    (C.check_buggy_timing_prediction, None, None, NA),
    (C.check_buggy_timing_prediction, 2, False, "what a correct loop would report"),
    (C.check_buggy_timing_prediction, 26 / 13, False, "the slow 50 ms first call is left out"),  # 2.0
    (C.check_buggy_timing_prediction, 2.0, False, "`start = clock()` comes before `sync()`"),
    (C.check_buggy_timing_prediction, 20 / 13, False, "only the ten timed kernels"),  # bug 2 seen, not bug 1
    (C.check_buggy_timing_prediction, 7.4, False, "check what the loop divides"),  # bug 1 seen, not bug 2
    (C.check_buggy_timing_prediction, 72 / 13, False, "one 2 ms kernel off"),  # 2.7 % low
    (C.check_buggy_timing_prediction, 76 / 13, False, "one 2 ms kernel off"),  # 2.7 % high
    (C.check_buggy_timing_prediction, 5.6, False, "follow the simulated clock"),  # 1.6 % low
    (C.check_buggy_timing_prediction, 5692, False, "microseconds"),
    (C.check_buggy_timing_prediction, 0.00569, False, "in seconds"),
    (C.check_buggy_timing_prediction, 0.005, False, "does reach the clock"),  # launches only
    (C.check_buggy_timing_prediction, 0.0065, False, "does reach the clock"),
    (C.check_buggy_timing_prediction, 6.8, False, "follow the simulated clock"),  # section 3's no-warm-up line
    (C.check_buggy_timing_prediction, "5.69", False, "not a string"),
    # 5.1(b): a plan for the fastest-block timer, every position of the neighbour's stretch
    (C.check_timing_plan, (3, 39), True, "117 timed calls"),
    (C.check_timing_plan, (3, 39), True, "right on 2 hidden GPUs too"),
    (C.check_timing_plan, [3, 39], True, OK),
    (C.check_timing_plan, (np.int64(3), np.int64(39)), True, OK),
    # plans that work but time more calls than needed
    (C.check_timing_plan, (4, 38), False, "38 is the fewest calls per block, but not the cheapest plan"),
    (C.check_timing_plan, (4, 38), False, "with 152 timed calls"),
    # (5, 38): 38 calls per block is enough, but both the blocks and the plan are too many
    (C.check_timing_plan, (5, 38), False, "blocks of 38 calls need fewer than 5"),
    (C.check_timing_plan, (5, 38), False, "; and 38 is the fewest calls per block, but not the cheapest plan"),
    (C.check_timing_plan, (5, 40), False, "; and a plan with fewer calls works"),
    (C.check_timing_plan, (5, 40), False, "blocks of 40 calls need fewer than 5"),
    (C.check_timing_plan, (4, 39), False, "blocks of 39 calls need fewer than 4"),
    (C.check_timing_plan, (3, 50), False, "a plan with fewer calls works"),
    (C.check_timing_plan, [3, 66], False, "with 198 timed calls"),
    (C.check_timing_plan, None, None, NA),
    (C.check_timing_plan, (10, 20), False, "too few calls per block"),  # the default-like many small blocks
    (C.check_timing_plan, (10, 20), False, "a fixed 15 µs, 75% of a 20 µs call"),
    (C.check_timing_plan, (4, 37), False, "reports 2.03% too much"),  # one call short of the bound
    (C.check_timing_plan, (38, 4), False, "too few calls per block"),  # swapped
    (C.check_timing_plan, (38, 4), False, "the order is plan = (blocks, calls): yours times 38 blocks of 4 calls"),
    (C.check_timing_plan, (39, 3), False, "the order is plan = (blocks, calls): yours times 39 blocks of 3 calls"),
    (C.check_timing_plan, (200, 1), False, "over 1 call even a clean block"),
    (C.check_timing_plan, (2, 100), False, "too few blocks"),  # two blocks, both reachable
    (C.check_timing_plan, (2, 100), False, "touches both of your blocks of 100 calls"),
    (C.check_timing_plan, (3, 38), False, "touches all 3 of your blocks of 38 calls"),  # 40 kernels span 3
    (C.check_timing_plan, (1, 200), False, "touches your one block"),
    (C.check_timing_plan, (5, 50), False, "over budget: 5 blocks of 50 calls time 250 calls"),
    (C.check_timing_plan, (1, 201), False, "over budget: 1 block of 201 calls times 201 calls"),
    (C.check_timing_plan, (201, 1), False, "over budget: 201 blocks of 1 call time 201 calls"),
    (C.check_timing_plan, (4, 51), False, "the budget is 200"),
    (C.check_timing_plan, (4.0, 38), False, "write them as ints"),
    (C.check_timing_plan, (True, 38), False, "write them as ints"),
    (C.check_timing_plan, ("4", 38), False, "not strings"),
    (C.check_timing_plan, (0, 38), False, "at least 1"),
    (C.check_timing_plan, (4, -38), False, "at least 1"),
    (C.check_timing_plan, (4,), False, "two whole numbers"),
    (C.check_timing_plan, 152, False, "two whole numbers"),
    # 5.2
    (C.check_merge_partials, merge_ok, True, "Flash-Decoding"),
    (C.check_merge_partials, merge_float32, True, OK),
    (C.check_merge_partials, stub, None, NA),
    (C.check_merge_partials, merge_no_guard, False, "no keys in either part"),
    (C.check_merge_partials, merge_no_rescale, False, "forgot to rescale"),
    (C.check_merge_partials, merge_rescale_second_only, False, "rescale BOTH parts"),
    (C.check_merge_partials, merge_inverted, False, "not exp(m - m_i)"),
    (C.check_merge_partials, merge_normalised, False, "keep acc unnormalised"),
    (C.check_merge_partials, merge_average_outputs, False, "averaged the two parts' outputs"),
    (C.check_merge_partials, merge_in_place, False, "changed its input acc1 in place"),
    (C.check_merge_partials, merge_one_max, False, "m is per query row"),
    (C.check_merge_partials, merge_flat, False, "m has shape (4,); expected (n, 1) = (4, 1)"),
    (C.check_merge_partials, merge_flat_l, False, "l has shape (4,); expected (n, 1) = (4, 1)"),
    (C.check_merge_partials, merge_row_vector, False, "m has shape (1, 4); expected (n, 1) = (4, 1)"),
    (C.check_merge_partials, merge_acc_batched, False, "acc: wrong shape (1, 4, 3); expected (4, 3)"),
    (C.check_merge_partials, merge_wrong_order, False, "the order of the state is (m, l, acc)"),
    (C.check_merge_partials, merge_wrong_order, False, "you returned (l, m, acc)"),
    (C.check_merge_partials, merge_acc_first, False, "you returned (acc, m, l)"),
    (C.check_merge_partials, merge_swapped_no_rescale, False, "you returned (l, m, acc)"),
    (C.check_merge_partials, merge_finite_empty_m, False, "a row with no keys in either part leaves as it arrived: m = -inf"),
    (C.check_merge_partials, merge_finite_empty_m, False, "your m there is 0"),
    (C.check_merge_partials, merge_very_negative_empty_m, False, "your m there is -1e+30"),
    # 5.3: the graph's bound on the textbook chain; the notebook then measures both chains
    (C.check_training_peak, PEAK_GRAPH, True, "Now measure"),
    (C.check_training_peak, 3, True, OK),
    (C.check_training_peak, 3.0, True, "at the softmax's backward step"),
    (C.check_training_peak, None, None, NA),
    (C.check_training_peak, PEAK_GUARDED, False, "count whole score matrices"),  # the guarded chain, CPU float32
    (C.check_training_peak, 4.5, False, "count whole score matrices"),  # the guarded chain in the H200 record
    (C.check_training_peak, PEAK_P_TWICE, False, "one storage saved twice counts once"),
    (C.check_training_peak, PEAK_P_TWICE, False, "The peak is the longest list"),
    (C.check_training_peak, 5, False, "not the peak. Walk the backward steps"),
    (C.check_training_peak, PEAK_ALL_MADE, False, "alive at the same moment"),
    (C.check_training_peak, PEAK_NO_SAVED, False, "a saved tensor until the step that needs it has run"),
    (C.check_training_peak, 1, False, "not the peak. Walk the backward steps"),
    (C.check_training_peak, PEAK_OFF_QUARTER, False, "count whole score matrices"),
    (C.check_training_peak, PEAK_WITH_D_OVER_T, False, "vanish as T grows"),
    (C.check_training_peak, PEAK_HALF, False, "count whole score matrices"),
    (C.check_training_peak, 7, False, "more score matrices than are ever alive at one moment"),
    (C.check_training_peak, 12, False, "Walk the backward steps one by one"),
    (C.check_training_peak, 0, False, "not the peak. Walk the backward steps"),
    (C.check_training_peak, 1000, False, "does not grow"),
    (C.check_training_peak, 4096, False, "not elements or bytes"),
    (C.check_training_peak, "3", False, "not a string"),
    (C.check_training_peak, -1, False, "not negative"),
    # 5.4 (a): the rows the buggy loop still gets right
    (C.check_rows_right, rows_ok, True, "its maximum is in the first block"),
    (C.check_rows_right, rows_numpy, True, OK),
    (C.check_rows_right, stub, None, NA),
    (C.check_rows_right, stub_raises, None, NA),
    (C.check_rows_right, rows_last_block, False, "maximum lies in the LAST block"),
    (C.check_rows_right, rows_inverted, False, "inverted"),
    (C.check_rows_right, rows_always_true, False, "your colleague's test"),
    (C.check_rows_right, rows_always_false, False, "some rows are right"),
    (C.check_rows_right, rows_strict, False, "ties count as right"),
    (C.check_rows_right, rows_tolerant, False, "compare exactly, with no tolerance"),
    (C.check_rows_right, rows_isclose, False, "compare exactly, with no tolerance"),
    (C.check_rows_right, rows_all_first, False, "too strict: only the maximum matters"),
    (C.check_rows_right, rows_one_block, False, "with several blocks your rule marks every row wrong, but many rows are still right"),
    (C.check_rows_right, rows_one_block, False, "in which of them does a later block change m?"),
    (C.check_rows_right, rows_query_axis, False, "wrong axis: the blocks cut the keys"),
    (C.check_rows_right, rows_query_axis, False, "expected shape (2, 3, 7), got (2, 3, 19)"),
    (C.check_rows_right, rows_float, False, "return booleans"),
    (C.check_rows_right, rows_list, False, "got list"),
    (C.check_rows_right, rows_later_max_strict, False, "when block_size >= T_k (S of shape (4, 5, 9), block_size = 16, T_k = 9)"),
    (C.check_rows_right, rows_later_max, False, "one block holds every key and there are no later keys"),
    (C.check_rows_right, rows_numpy_later_max, False, "your rule raised ValueError"),
    (C.check_rows_right, rows_keepdim, False, "of shape S.shape[:-1] = (2, 3, 7) (one entry per query row); got shape (2, 3, 7, 1)"),
    # 5.4 (b): the smallest test that catches the bug
    (C.check_catching_test, CATCH_OK, True, "two keys in blocks of one, the second raising the max"),
    (C.check_catching_test, CATCH_NUMPY, True, OK),
    (C.check_catching_test, CATCH_EQUAL_V, True, "the loop is off by 0.762"),
    (C.check_catching_test, None, None, NA),
    (C.check_catching_test, CATCH_ONE_BLOCK, False, "one block: every maximum is in it, as in your colleague's test"),
    (C.check_catching_test, CATCH_ONE_KEY, False, "your one key is one block whatever block_size is"),
    (C.check_catching_test, CATCH_MAX_FIRST, False, "m never grows after the first block, so the missing rescale multiplies by 1"),
    (C.check_catching_test, CATCH_ZERO_FIRST_V, False, "before the maximum grew has a value row of zero"),
    (C.check_catching_test, CATCH_ZERO_V, False, "before the maximum grew has a value row of zero"),
    (C.check_catching_test, CATCH_TINY, False, "the error is only 5.0e-06: make the later maximum stand further above"),
    (C.check_catching_test, CATCH_THREE_Q, False, "it catches the bug (off by 0.964); now make it the smallest: how many queries do you need (you have 3)?"),
    (C.check_catching_test, CATCH_FOUR_K, False, "now make it the smallest: how many keys must there be for a maximum to arrive after the first block (you have 4)?"),
    (C.check_catching_test, CATCH_BOTH_BIG, False, "(you have 4), and how many queries do you need (you have 3)?"),
    (C.check_catching_test, CATCH_BATCH, False, "your batch dims (2,) repeat the test 2 times"),
    (C.check_catching_test, CATCH_V_SHORT, False, "the same T_k; got Q (1, 1), K (2, 1), V (3, 1)"),
    (C.check_catching_test, CATCH_DK_MISMATCH, False, "the same last dim d_k (a score is a dot product of a query and a key); got Q (1, 2), K (2, 1)"),
    (C.check_catching_test, CATCH_BATCH_MISMATCH, False, "the same batch dims in front (or none); got Q (2, 1, 1), K (2, 1)"),
    (C.check_catching_test, CATCH_FLAT_Q, False, "Q should have shape (T_q, d_k) (two dims, batch dims in front allowed); got shape (1,)"),
    (C.check_catching_test, CATCH_NAN, False, "Q has entries that are not finite"),
    (C.check_catching_test, CATCH_INF_V, False, "V has entries that are not finite"),
    (C.check_catching_test, CATCH_FLOAT_BLOCK, False, "block_size should be a positive int (a count of keys); got float 1.0"),
    (C.check_catching_test, CATCH_ZERO_BLOCK, False, "block_size should be a positive int (a count of keys); got 0"),
    (C.check_catching_test, CATCH_THREE_ITEMS, False, "write four things, catching_test = (Q, K, V, block_size); got 3 items"),
    (C.check_catching_test, CATCH_TEXT_Q, False, "Q should be a tensor of shape (T_q, d_k); got the text 'Q'"),
    (C.check_catching_test, CATCH_BOOL_V, False, "V should hold real numbers; got dtype torch.bool"),
    # 5.4 (c): the fix
    (C.check_key_block_fix, fix_ok, True, "FlashAttention-2 also defers the division"),
    (C.check_key_block_fix, fix_einsum_where, True, OK),
    (C.check_key_block_fix, fix_notebook_loop, True, "one rescale of l and acc"),
    (C.check_key_block_fix, fix_in_place, True, OK),
    (C.check_key_block_fix, fix_first_block_max_up_front, True, OK),
    (C.check_key_block_fix, fix_normalise_as_you_go, True, "FlashAttention-2 also defers the division by l"),
    (C.check_key_block_fix, fix_topk_one_sweep, True, OK),
    (C.check_key_block_fix, stub, None, NA),
    (C.check_key_block_fix, stub_raises, None, NA),
    (C.check_key_block_fix, fix_unchanged_bug, False, "this is the colleague's loop: rows whose maximum arrives after the first block"),
    (C.check_key_block_fix, fix_l_not_rescaled, False, "but l no longer is"),
    (C.check_key_block_fix, fix_inverted, False, "the factor is exp(m - m_new)"),
    (C.check_key_block_fix, fix_inverted_guarded, False, "the factor is exp(m - m_new)"),
    (C.check_key_block_fix, fix_normalised_in_loop, False, "normalise once, after the last block"),
    (C.check_key_block_fix, fix_no_max, False, "exp overflowed"),
    (C.check_key_block_fix, fix_rescale_after, False, "you multiplied the new block's p @ V by it too"),
    (C.check_key_block_fix, fix_sdpa, False, "fix the loop, do not replace it: your function calls F.scaled_dot_product_attention"),
    (C.check_key_block_fix, fix_softmax_method, False, "fix the loop, do not replace it: your function calls a softmax"),
    (C.check_key_block_fix, fix_torch_softmax, False, "fix the loop, do not replace it: your function calls a softmax"),
    (C.check_key_block_fix, fix_functional_softmax, False, "fix the loop, do not replace it: your function calls a softmax"),
    (C.check_key_block_fix, fix_multihead, False, "fix the loop, do not replace it: your function calls nn.MultiheadAttention"),
    (C.check_key_block_fix, fix_scales_q_in_place, False, "changed its input Q in place"),
    (C.check_key_block_fix, fix_float64_out, False, "expected dtype torch.float32 (the inputs'), got torch.float64"),
    (C.check_key_block_fix, fix_dk_wide, False, "expected shape (2, 3, 7, 5) (..., T_q, d_v), got (2, 3, 7, 8)"),
    (C.check_key_block_fix, fix_one_block_only, False, "when m grows, what must happen to l and to acc?"),
    (C.check_key_block_fix, fix_two_pass, False, "the maximum over all 19 keys at once, with block_size=5"),
    (C.check_key_block_fix, fix_global_max_first, False, "a first pass over the keys"),
    (C.check_key_block_fix, fix_torch_max_first, False, "a first pass over the keys"),
    (C.check_key_block_fix, fix_two_sweeps, False, "your loop sweeps the 19 keys twice, with block_size=5: every block's maximum first"),
    (C.check_key_block_fix, fix_two_sweeps, False, "rescales the running sums by exp(m - m_new) (old maximum minus new)"),
    (C.check_key_block_fix, fix_two_sweeps_torch_max, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_two_sweeps_sort, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_two_sweeps_topk, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_two_sweeps_kthvalue, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_two_sweeps_msort, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_two_sweeps_cummax, False, "sweeps the 19 keys twice"),
    (C.check_key_block_fix, fix_row_max_by_sort, False, "the maximum over all 19 keys at once"),
    (C.check_key_block_fix, fix_numpy_max_first, False, "keep the loop in PyTorch: your function leaves it (Tensor.numpy())"),
    (C.check_key_block_fix, fix_asarray_max_first, False, "leaves it (np.asarray / np.array)"),
    (C.check_key_block_fix, fix_tolist_max_first, False, "leaves it (Tensor.tolist())"),
    (C.check_key_block_fix, fix_block_max, False, "your reference is each block's own maximum, not the running one"),
    (C.check_key_block_fix, fix_block_max, False, "the factor exp(m - m_block) exceeds 1"),
    (C.check_key_block_fix, fix_exp_ratio, False, "exp overflowed: in float32 exp(s) is inf once s > 88"),
    (C.check_key_block_fix, fix_first_block_reference, False, "a number overflowed float32"),
    (C.check_key_block_fix, fix_first_block_reference, False, "inside every exp, exp(s - m_new) and exp(m - m_new)"),
    # 5.5: the smallest head_dim at which Q @ K^T reaches the balance point
    (C.check_compute_bound_head_dim, head_dim_ok, True, "205.97 FLOP/byte at head_dim 229, 206.78 at 230"),
    (C.check_compute_bound_head_dim, head_dim_brute, True, OK),
    (C.check_compute_bound_head_dim, head_dim_numpy_int, True, OK),
    (C.check_compute_bound_head_dim, stub, None, NA),
    (C.check_compute_bound_head_dim, stub_raises, None, NA),
    *[(C.check_compute_bound_head_dim, fn, False, hint) for fn, hint in HEAD_DIM_MISTAKES.items()],
    (C.check_compute_bound_head_dim, head_dim_zero, False, "if that is at most the balance it never reaches it"),
    (C.check_compute_bound_head_dim, head_dim_numpy_no_guard, False, "for T = 300, bytes_per_element = 2, balance = 153.016 you returned -"),
    (C.check_compute_bound_head_dim, head_dim_no_guard, False, "raised ZeroDivisionError"),
    (C.check_compute_bound_head_dim, head_dim_no_guard, False, "T = 300, bytes_per_element = 2, balance = 150.0"),
    (C.check_compute_bound_head_dim, head_dim_no_guard, False, "there T / bytes_per_element = 150 FLOP/byte is equal to the balance"),
    (C.check_compute_bound_head_dim, head_dim_raises_float32, False, "raised ValueError: only float16 is supported when called with T = 16384, bytes_per_element = 4"),
    (C.check_compute_bound_head_dim, head_dim_unrounded, False, "head_dim is an integer: the smallest one that reaches the balance, so round up (you returned 229.09"),
    (C.check_compute_bound_head_dim, head_dim_np_ceil, False, "right values, but head_dim is a count: return an int"),
    (C.check_compute_bound_head_dim, head_dim_bool, False, "not a comparison's bool"),
    (C.check_compute_bound_head_dim, head_dim_text, False, "not a string"),
    (C.check_compute_bound_head_dim, head_dim_always_none, False, "returned None on every case"),
    (C.check_compute_bound_head_dim, head_dim_plus_one, False, "your head_dim 231 reaches the balance (207.59 FLOP/byte), but it is not the smallest"),
    (C.check_compute_bound_head_dim, head_dim_minus_one, False, "your head_dim 229 gives an intensity of 205.97 FLOP/byte"),
]


def _id(case):
    named = [k for k, v in globals().items() if k.startswith("CATCH_") and v is case[1]]
    return f"{case[0].__name__}-{named[0] if named else getattr(case[1], '__name__', repr(case[1]))}"


@pytest.mark.parametrize("checker, answer, expected, phrase", CASES, ids=[_id(c) for c in CASES])
def test_checker(capsys, checker, answer, expected, phrase):
    result = checker(answer)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert result.passed is expected, out
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


def _notebook_buggy_loop():
    """``time_call_buggy`` as the notebook and its solutions define it (the same source in both)."""
    namespace = {"time": time}
    exec(_notebook_buggy_loop_source(), namespace)
    return namespace["time_call_buggy"]


def _notebook_buggy_loop_source():
    """The source of ``time_call_buggy`` in the notebook, checked equal to the solutions'."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "notebooks"
    sources = []
    for path in (root / "05_attention_on_the_gpu.ipynb", root / "solutions" / "05_attention_on_the_gpu_solutions.ipynb"):
        cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
        cell = next(c for c in cells if "def time_call_buggy" in c)
        start = cell.index("def time_call_buggy")
        sources.append(cell[start:cell.index("\n\n\n", start)])
    assert sources[0] == sources[1]
    return sources[0]


def test_buggy_loop_report_matches_the_notebook_and_a_hand_count():
    """The checker's model of the loop reports what the notebook's loop reports, and that is the
    hand count: clock started at 15 us, kernels end at 54.005 + 0.005 + 10 * 2 ms, over 13 calls."""
    gpu = SimulatedGPU(kernel_s=2e-3, first_s=50e-3, launch_s=5e-6)
    report_ms = 1e3 * _notebook_buggy_loop()(gpu.launch, gpu.synchronize, gpu.clock)
    assert math.isclose(report_ms, (74.010 - 0.015) / 13, rel_tol=1e-12)
    assert math.isclose(nb05._buggy_loop_ms(), report_ms, rel_tol=1e-12)


def test_timing_plan_passes_exactly_the_plans_of_the_two_bounds():
    """On the stated GPU a plan passes iff calls >= 38 (a clean block's fixed 15 µs over c calls of
    20 µs stays within 2 %) and blocks >= ceil(39 / calls) + 2 (one more than a stretch of 40 kernels
    can touch), within 200 timed calls; the hidden GPUs reject none of those plans."""
    gpu = nb05.PLAN_GPU
    assert (gpu["kernel_s"], gpu["launch_s"], gpu["sync_s"], gpu["stretch"], gpu["slow_x"]) == (20e-6, 5e-6, 10e-6, 40, 3.0)
    passing = set()
    for blocks in range(1, 8):
        for calls in range(1, 200 // blocks + 1):
            clean, reports = nb05._plan_reports(blocks, calls, **gpu)
            if max(clean, *(r for _, r in reports)) <= 1.02 * gpu["kernel_s"]:
                passing.add((blocks, calls))
    by_hand = {(n, c) for n in range(1, 8) for c in range(38, 201) if n * c <= 200 and n >= math.ceil(39 / c) + 2}
    assert passing == by_hand and (4, 38) in passing and (3, 39) in passing and (3, 38) not in passing
    fewest = min(b * c for b, c in passing)  # the exercise asks for the fewest timed calls in all
    assert [p for p in passing if p[0] * p[1] == fewest] == [(3, 39)] == [nb05._fewest_plan()]
    for case in nb05._plan_cases()[1:]:  # no harder in either bound
        assert (case["launch_s"] + case["sync_s"]) / case["kernel_s"] <= 0.75 and case["stretch"] <= 40
        for plan in passing:
            clean, reports = nb05._plan_reports(*plan, **case)
            assert max(clean, *(r for _, r in reports)) <= 1.02 * case["kernel_s"], (plan, case)


def test_fastest_block_timer_by_hand():
    """A clean block of c calls spans 5 µs (its first launch) + c x 20 µs + 10 µs (synchronize());
    a stretch over every block leaves no clean one."""
    gpu = nb05.PLAN_GPU
    clean, reports = nb05._plan_reports(4, 38, **gpu)
    assert math.isclose(clean, (38 * 20e-6 + 15e-6) / 38, rel_tol=1e-12)
    assert len(reports) == 4 * 38 + 39 and all(math.isclose(r, clean, rel_tol=1e-12) for _, r in reports)
    _, spoiled = nb05._plan_reports(3, 38, **gpu)
    assert max(r for _, r in spoiled) > 1.02 * gpu["kernel_s"]


def test_shared_gpu_slows_exactly_the_stretch():
    """By hand: kernel 0 takes first_s, kernels 2 and 3 (of 0-4) take 3 x 2 ms, the rest 2 ms."""
    gpu = nb05.SimulatedGPU(2e-3, 50e-3, 5e-6, slow_calls=range(2, 4), slow_x=3.0)
    for _ in range(5):
        gpu.launch()
    gpu.synchronize()
    assert math.isclose(gpu.clock(), 5e-6 + 50e-3 + 2e-3 + 2 * 6e-3 + 2e-3, rel_tol=1e-12)


def test_every_checker_is_covered():
    """Each checker: a correct answer, the stub, and at least three different wrong answers."""
    for name in nb05.__all__:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 3, name


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 7, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0)]
    for name in nb05.__all__:
        for answer in odd:
            result = getattr(ex, name)(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_merged_state_is_attention_over_all_keys():
    """Independent of the checker: merge_ok on a random split equals PyTorch's softmax @ V."""
    gen = torch.Generator().manual_seed(0)
    S = torch.randn(4, 9, generator=gen, dtype=torch.float64) * 3
    V = torch.randn(9, 2, generator=gen, dtype=torch.float64)

    def state(s, v):
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        return m, p.sum(-1, keepdim=True), p @ v

    m, l, acc = merge_ok(*state(S[:, :4], V[:4]), *state(S[:, 4:], V[4:]))
    assert torch.allclose(acc / l, torch.softmax(S, dim=-1) @ V)


def test_merge_nan_hint_names_the_idea_not_the_code(capsys):
    """The nan hint says what to do (a finite reference where the merged maximum is -inf) and
    leaves the code to the learner."""
    ex.check_merge_partials(merge_no_guard)
    out = capsys.readouterr().out
    assert "finite reference for rows whose merged maximum is -inf" in out, out
    assert "torch." not in out and "isfinite" not in out, out


def test_hidden_merge_cases_make_the_mistakes_differ():
    """In the hidden cases the two parts' maxima cross (part 1 larger in some rows, part 2 in
    others), so rescaling one part only cannot pass, and every case has an empty part."""
    cases = nb05._merge_cases()
    st1, st2 = cases[0][0], cases[0][1]
    assert (st1[0] > st2[0]).any() and (st2[0] > st1[0]).any()
    assert all(np.isinf(c[0][0]).any() or np.isinf(c[1][0]).any() for c in cases[1:])


def test_guarded_peak_is_what_the_solutions_explain():
    """The solutions' 4.25 for the guarded chain is what the profiler measures: above it at every
    finite T (the (B, H, T, d) part is d / T of a score matrix), and 4.25 in the limit."""
    r64, r128 = nb05._training_peak_ratio(64, d=16), nb05._training_peak_ratio(128, d=8)
    assert r64 >= PEAK_GUARDED - 1e-9 and r128 >= PEAK_GUARDED - 1e-9
    assert abs(nb05._training_peak_limit() - PEAK_GUARDED) < 0.01


def test_no_guard_chain_peak_is_the_graph_bound():
    """The checker's answer: without nan_to_num the chain's backward formulas (matmul, softmax,
    division) build no T x T temporaries, so the measured limit is the graph's bound, 3, below the
    guarded chain's. Written from scratch here."""
    from shared.benchmark import peak_memory

    ratio = {}
    for T in (128, 256):
        gen = torch.Generator().manual_seed(T)
        Q, K, V = (torch.randn(1, 2, T, 8, generator=gen, requires_grad=True) for _ in range(3))
        out = lambda Q=Q, K=K, V=V: (torch.softmax(Q @ K.mT / math.sqrt(8), -1) @ V).sum().backward()  # noqa: E731
        ratio[T] = peak_memory(out, "cpu") / (2 * T * T * 4)
    limit = 2 * ratio[256] - ratio[128]
    assert abs(limit - PEAK_GRAPH) < 0.01
    assert nb05._training_peak_limit() > limit + 0.5


def test_naive_attention_saves_two_square_tensors():
    """By reading shared.modules: softmax's backward needs its output P and the product with V
    needs the cleaned copy nan_to_num(P): two distinct T x T storages. Counted here by walking
    PyTorch's autograd graph, not with the checker's saved-tensor hooks."""
    from shared.modules import naive_attention

    Q, K, V = (torch.randn(1, 2, 5, 3, requires_grad=True) for _ in range(3))
    out, _ = naive_attention(Q, K, V)
    square, seen, stack = set(), set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for attr in dir(fn):
            if attr.startswith("_saved_"):
                t = getattr(fn, attr)
                if isinstance(t, torch.Tensor) and tuple(t.shape[-2:]) == (5, 5):
                    square.add(t.untyped_storage().data_ptr())
        stack.extend(f for f, _ in fn.next_functions)
    assert len(square) == 2


def test_tiled_attention_memory_grows_with_the_block():
    """Why the smallest block wins: tiled_attention's measured extra memory grows with b."""
    from shared.benchmark import peak_memory
    from shared.flash import tiled_attention

    Q, K, V = (torch.randn(1, 2, 256, 16) for _ in range(3))
    extra = [peak_memory(lambda b=b: tiled_attention(Q, K, V, block_size=b), "cpu") for b in (32, 64, 128)]
    assert extra[0] < extra[1] < extra[2]


def test_the_notebooks_chain_and_tree_run_once_merge_partials_is_right(capsys):
    """Exercise 5.2's cell compares a chain of merges with a tree once the learner's merge passes:
    run that cell's code with a reference merge (CI never reaches it with the stub)."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "05_attention_on_the_gpu.ipynb")
                    .read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in nb["cells"]
                if "if check_merge_partials(merge_partials)" in "".join(c["source"]))
    exec(cell[cell.index("if check_merge_partials"):],
         {"torch": torch, "merge_partials": merge_ok, "check_merge_partials": ex.check_merge_partials})
    out = capsys.readouterr().out
    assert "chain          : acc / l equals softmax(S) @ V within 1e-12: True" in out
    assert "tree, 4 rounds : acc / l equals softmax(S) @ V within 1e-12: True" in out


def test_rows_right_truth_is_found_by_running_the_loop():
    """On every hidden case the loop's right rows (float64, within 1e-12) are exactly the rows whose
    maximum is in the first block, every other row is off by more than 1e-10, and the cases hold
    rows of each kind: maximum in the first block (in some rows of several blocks with every
    first-block score above every later one: a rule asking for that is not the one-block rule),
    in a later one (well above, or only 1e-6 above), tied between them."""
    cases = nb05._rows_cases()
    kinds = set()
    for S, V, b in cases:
        err = (nb05._buggy_key_blocks(S, V, b) - torch.softmax(S, dim=-1) @ V).abs().amax(dim=-1)
        first, later = S[..., :b].amax(-1), (S[..., b:].amax(-1) if b < S.shape[-1] else None)
        assert torch.equal(err < 1e-12, rows_ok(S, b)) and bool(((err < 1e-12) | (err > 1e-10)).all())
        assert np.array_equal(nb05._rows_truth(S, V, b), rows_ok(S, b).numpy())
        if later is not None:
            kinds |= {"first"} if (first > later).any() else set()
            kinds |= {"later"} if (later > first + 0.1).any() else set()
            kinds |= {"a hair later"} if ((later > first) & (later < first + 1e-5)).any() else set()
            kinds |= {"tie"} if (later == first).any() else set()
            kinds |= {"all first above"} if (S[..., :b].amin(-1) > later).any() else set()
    assert kinds == {"first", "later", "a hair later", "tie", "all first above"}
    assert any(b >= S.shape[-1] for S, _, b in cases) and any(S.dim() > 3 for S, _, _ in cases)
    assert any(S.shape[-1] % b for S, _, b in cases if b < S.shape[-1])


def test_rows_right_hints_belong_to_their_rules():
    """Each wrong rule differs from the truth on some hidden case (so its hint cannot fire on a
    right answer), and no two wrong rules agree on every case (each gets its own hint)."""
    cases = nb05._rows_cases()
    rules = [rows_last_block, rows_inverted, rows_always_true, rows_always_false, rows_strict, rows_all_first,
             rows_one_block]
    answers = [[np.asarray(r(S, b)) for S, _, b in cases] for r in rules]
    truth = [rows_ok(S, b).numpy() for S, _, b in cases]
    for a in answers:
        assert any(not np.array_equal(x, t) for x, t in zip(a, truth, strict=True))
    for i in range(len(answers)):
        for j in range(i):
            assert any(not np.array_equal(x, y) for x, y in zip(answers[i], answers[j], strict=True))


def test_key_block_fix_cases_separate_the_bug():
    """The colleague's loop is right on the case where every row's maximum is in the first block
    and wrong (by more than 1e-3) elsewhere; the float32 case has scores of a few hundred, where exp
    without the max overflows."""
    right, wrong = 0, 0
    for Q, K, V, b, what in nb05._fix_cases():
        S = Q.double() @ K.double().mT / math.sqrt(Q.shape[-1])
        err = float((fix_unchanged_bug(Q, K, V, b).double() - torch.softmax(S, -1) @ V.double()).abs().max())
        all_first = bool((S[..., :b].amax(-1) >= S.amax(-1)).all())
        assert (err < 1e-9) if all_first else (err > 1e-3), (what, err)
        right, wrong = right + all_first, wrong + (not all_first and b < K.shape[-2])
        if Q.dtype == torch.float32:
            assert 100 < S.abs().max() < 300 and S.amax() > 88
            assert not torch.isfinite(fix_no_max(Q, K, V, b)).all()
    assert right >= 1 and wrong >= 2
    shapes = [(Q.dim(), Q.shape[-2] != K.shape[-2], K.shape[-1] != V.shape[-1], b) for Q, K, V, b, _ in nb05._fix_cases()]
    assert any(d == 4 for d, *_ in shapes) and any(d == 2 for d, *_ in shapes)
    assert all(tq for _, tq, _, _ in shapes) and any(dv for _, _, dv, _ in shapes) and any(b == 1 for *_, b in shapes)
    assert any(b >= K.shape[-2] for _, K, _, b, _ in nb05._fix_cases())
    assert any(K.shape[-2] % b for _, K, _, b, _ in nb05._fix_cases() if b < K.shape[-2])


def test_recorder_mode_lets_ordinary_ops_through():
    """The checker's TorchFunctionMode changes nothing for ordinary ops (einsum, where, in-place ops
    on the learner's own tensors, .item(), numpy, views) and records the refused calls; a way out of
    PyTorch (here x.numpy()) still runs, and is recorded apart from them."""
    gen = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    plain = fix_einsum_where(Q, K, V, 2)
    with nb05._Recorder() as rec:
        recorded = fix_einsum_where(Q, K, V, 2)
        x = torch.arange(6.0).reshape(2, 3)
        x[0, 1] = 7.0
        x.add_(1).clamp_(max=5)
        assert x.numpy().tolist() == [[1.0, 5.0, 3.0], [4.0, 5.0, 5.0]] and x.sum().item() == 23.0
    assert torch.equal(plain, recorded) and rec.seen == [] and rec.escapes == ["Tensor.numpy()"]
    for fn, name in ((fix_sdpa, "F.scaled_dot_product_attention"), (fix_softmax_method, "a softmax"),
                     (fix_torch_softmax, "a softmax"), (fix_functional_softmax, "a softmax"),
                     (fix_multihead, "nn.MultiheadAttention")):
        with nb05._Recorder() as rec:
            fn(Q, K, V, 2)
        assert name in rec.seen, (fn.__name__, rec.seen)


def test_tile_loop_checkers_run_in_under_a_second(capsys):
    for checker, answer in ((ex.check_rows_right, rows_ok), (ex.check_key_block_fix, fix_ok),
                            (ex.check_key_block_fix, fix_no_max)):
        start = time.perf_counter()
        checker(answer)
        assert time.perf_counter() - start < 1.0
    capsys.readouterr()


@pytest.mark.parametrize("notebook", ["05_attention_on_the_gpu.ipynb", "solutions/05_attention_on_the_gpu_solutions.ipynb"])
def test_notebooks_buggy_loop_is_the_checkers_loop(notebook):
    """The notebook's and the solutions' attention_by_key_blocks (the colleague's loop, verbatim)
    give what the checker's private copy gives, on scores of a hidden case."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "notebooks" / notebook
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    cell = next(c for c in cells if "def attention_by_key_blocks(" in c)
    start = cell.index("def attention_by_key_blocks(")
    end = cell.find("\n\n\n", start)
    namespace = {"math": math, "torch": torch}
    exec(cell[start:end if end > 0 else None], namespace)
    gen = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(2, 9, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    S = Q @ K.mT / 2
    assert torch.equal(namespace["attention_by_key_blocks"](Q, K, V, 4), nb05._buggy_key_blocks(S, V, 4))
    assert not torch.allclose(nb05._buggy_key_blocks(S, V, 4), torch.softmax(S, -1) @ V)  # the bug shows here


CATCH_ALL = [CATCH_OK, CATCH_NUMPY, CATCH_EQUAL_V, CATCH_ONE_BLOCK, CATCH_MAX_FIRST, CATCH_ZERO_FIRST_V,
             CATCH_ZERO_V, CATCH_TINY, CATCH_THREE_Q, CATCH_FOUR_K, CATCH_BOTH_BIG, CATCH_BATCH]


def _notebook_key_block_loop(notebook="05_attention_on_the_gpu.ipynb"):
    """The colleague's attention_by_key_blocks as the notebook shows it to the learner."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "notebooks" / notebook
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    cell = next(c for c in cells if "def attention_by_key_blocks(" in c)
    start = cell.index("def attention_by_key_blocks(")
    end = cell.find("\n\n\n", start)
    namespace = {"math": math, "torch": torch}
    exec(cell[start:end if end > 0 else None], namespace)
    return namespace["attention_by_key_blocks"]


@pytest.mark.parametrize("answer", CATCH_ALL, ids=range(len(CATCH_ALL)))
def test_catching_verdict_matches_the_learners_loop(answer, capsys):
    """Whether the checker says the test catches the bug (passed, or the "now make it the
    smallest" hint) is what running the notebook's own loop on it says: off by more than 1e-3."""
    loop = _notebook_key_block_loop()
    Q, K, V = (torch.as_tensor(x, dtype=torch.float64) for x in answer[:3])
    ref = torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V
    caught = float((loop(Q, K, V, int(answer[3])) - ref).abs().max()) > 1e-3
    result = ex.check_catching_test(answer)
    out = capsys.readouterr().out
    assert caught == (result.passed or "it catches the bug" in out), out


def test_one_key_never_catches_the_bug():
    """T_k = 1 is one block whatever block_size is: the loop equals softmax(S) V on random inputs,
    so two keys is the fewest that can catch the bug (and one query suffices: rows are independent)."""
    gen = torch.Generator().manual_seed(11)
    for _ in range(50):
        d_k, d_v, T_q = (int(x) for x in torch.randint(1, 5, (3,), generator=gen))
        Q = 5 * torch.randn(T_q, d_k, generator=gen, dtype=torch.float64)
        K = 5 * torch.randn(1, d_k, generator=gen, dtype=torch.float64)
        V = 5 * torch.randn(1, d_v, generator=gen, dtype=torch.float64)
        S = Q @ K.mT / math.sqrt(d_k)
        assert torch.allclose(nb05._buggy_key_blocks(S, V, 1), torch.softmax(S, -1) @ V, rtol=0, atol=1e-12)


def test_catching_error_is_the_stale_terms_formula():
    """Two keys, scores 0 and delta, blocks of one: the loop is off by (1 - e^-delta) v_0 / (1 + e^-delta),
    proportional to the first key's value, not to v_0 - v_1 (equal values still catch it)."""
    for delta, v0, v1 in ((2.0, 1.0, 0.0), (2.0, 1.0, 1.0), (0.5, -3.0, 2.0), (3.0, 0.0, 5.0)):
        S, V = _t64([[0.0, delta]]), _t64([[v0], [v1]])
        err = float((nb05._buggy_key_blocks(S, V, 1) - torch.softmax(S, -1) @ V).abs().max())
        assert math.isclose(err, (1 - math.exp(-delta)) * abs(v0) / (1 + math.exp(-delta)), abs_tol=1e-12)


def test_two_ms_hint_names_both_readings_and_the_line_not_the_report(capsys):
    """2 ms is what a correct loop reports and also what the buggy loop reports when the first call
    is no slower than the rest (26 ms over 13 calls): the hint says both, names the line that lets
    the warm-up's work into the timed interval (as the notebook writes it) and gives no number of
    the buggy report (neither the report nor its 74 ms or 13 calls)."""
    first_left_out = nb05._buggy_loop_ms(first_s=2e-3)
    gpu = SimulatedGPU(kernel_s=2e-3, first_s=50e-3, launch_s=5e-6)
    for _ in range(3):  # a correct loop: warm up, synchronize, then read the clock
        gpu.launch()
    gpu.synchronize()
    start = gpu.clock()
    for _ in range(10):
        gpu.launch()
    gpu.synchronize()
    correct = 1e3 * (gpu.clock() - start) / 10
    assert abs(first_left_out - 2.0) < 0.001 and abs(correct - 2.0) < 0.001 and abs(26 / 13 - 2.0) < 1e-12
    report = nb05._buggy_loop_ms()
    for answer in (2, 26 / 13, first_left_out, correct):
        result = ex.check_buggy_timing_prediction(answer)
        out = capsys.readouterr().out
        assert result.passed is False and "what a correct loop would report" in out, out
        assert "the slow 50 ms first call is left out" in out and "`start = clock()` comes before `sync()`" in out
        assert f"{report:.2f}" not in out and f"{report:.1f}" not in out and "74" not in out and "13" not in out
    lines = [line.strip() for line in _notebook_buggy_loop_source().splitlines()]
    at = lines.index("start = clock()")
    assert lines[at + 1] == "sync()" and lines[at - 1].startswith("if i == warmup")


def test_merge_state_hints_name_shape_and_order_not_the_maximum(capsys):
    """Shapes (n,) or (1, n) for m and l, and the right results in the wrong order, are named as
    such, not as a wrong maximum; and an l of shape (n,) really divides acc's columns (n = d_v)."""
    for answer in (merge_flat, merge_row_vector, merge_wrong_order, merge_acc_first, merge_finite_empty_m):
        result = ex.check_merge_partials(answer)
        out = capsys.readouterr().out
        assert result.passed is False and "torch.maximum" not in out and "larger of the two" not in out, out
    acc, l = torch.arange(9.0).reshape(3, 3), _t64([[1.0], [2.0], [4.0]]).float()
    assert not torch.equal(acc / l.squeeze(-1), acc / l)
    assert torch.equal((acc / l)[1], acc[1] / 2)


def test_a_finite_m_for_an_empty_row_loses_a_later_parts_keys():
    """Why a row with no keys must leave with m = -inf: merged again with a part whose maximum lies
    far below 0, a finite m of 0 wins the maximum, that part's factor exp(-800 - 0) underflows to 0
    and its keys vanish (l = 0); with m = -inf the part arrives whole."""
    v = _t64([[2.0, -1.0]])
    part = (_t64([[-800.0]]), _t64([[1.0]]), v)
    no_keys = (_t64([[-math.inf]]), _t64([[0.0]]), torch.zeros(1, 2, dtype=torch.float64))
    m, l, acc = merge_ok(*no_keys, *part)
    assert m.item() == -800.0 and l.item() == 1.0 and torch.equal(acc / l, v)
    m, l, acc = merge_ok(_t64([[0.0]]), *no_keys[1:], *part)
    assert m.item() == 0.0 and l.item() == 0.0 and not acc.any()


def test_training_peak_hints_do_not_bisect(capsys):
    """Whole answers below and above the bound (0, 1, 2, 4, 5) all get one hint, so a wrong count
    does not tell its direction; 7 to 63 get another; none holds a digit or says 'too many' /
    'too few', and the non-whole hint does not give away the guarded chain's bool mask."""
    def hint(answer):
        result = ex.check_training_peak(answer)
        assert result.passed is False
        return capsys.readouterr().out

    near = {hint(x) for x in (0, 1, PEAK_NO_SAVED, PEAK_P_TWICE, 4.0, 5)}
    far_over = {hint(x) for x in (7, 8, 12, 24, 63)}
    assert len(near) == 1 and len(far_over) == 1 and near != far_over
    for out in near | far_over:
        assert not any(c.isdigit() for c in out) and "too many" not in out and "too few" not in out, out
    assert "mask" not in hint(PEAK_GUARDED) and "nan_to_num" not in hint(4.5)


def test_one_block_rule_gets_its_own_hint(capsys):
    """'Right only when one block holds every key' is told that several blocks leave many rows
    right, not the all-first-scores hint; the rule it is given is not the answer."""
    ex.check_rows_right(rows_one_block)
    out = capsys.readouterr().out
    assert "many rows are still right" in out and "other scores" not in out, out
    assert "first block" not in out, out  # the rule (maximum in the first block) is not given away
    several = [(S, b) for S, _, b in nb05._rows_cases() if b < S.shape[-1]]
    assert all(rows_ok(S, b).any() for S, b in several)  # several blocks: some rows right in every case


def test_recorder_counts_the_blocks_maximised_before_the_first_exp():
    """One sweep takes one block's maximum before its first exp (the first block's, even when taken
    twice); two sweeps take every block's, so the checker can tell them apart by the order of calls."""
    Q, K, V, b, _ = nb05._fix_cases()[0]  # 19 keys in blocks of 5: 4 blocks
    for fn, blocks in ((fix_ok, 1), (fix_notebook_loop, 1), (fix_in_place, 1), (fix_einsum_where, 1),
                       (fix_first_block_max_up_front, 1), (fix_topk_one_sweep, 1), (fix_normalise_as_you_go, 1),
                       (fix_two_sweeps, 4), (fix_two_sweeps_torch_max, 4), (fix_two_sweeps_sort, 4),
                       (fix_two_sweeps_topk, 4), (fix_two_sweeps_kthvalue, 4), (fix_two_sweeps_msort, 4),
                       (fix_two_sweeps_cummax, 4)):
        with nb05._Recorder() as rec:
            fn(Q.clone(), K.clone(), V.clone(), b)
        assert rec.exp_seen and len(rec.maxed_before_exp) == blocks, (fn.__name__, rec.maxed_before_exp)


def test_block_max_overflows_in_the_rescaled_sums_not_in_exp():
    """The per-block-maximum answer's inf or nan arises where its hint says: every exp(s - m_block)
    is at most 1, but the sums re-expressed against a lower block maximum grow past float32's range
    (l becomes inf) in a row whose largest score so far stands more than 88 above the block's."""
    Q, K, V, b, what = nb05._fix_cases()[-1]
    assert Q.dtype == torch.float32
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    m = torch.full((*S.shape[:-1], 1), -math.inf)
    l, top = torch.zeros_like(m), torch.full_like(m, -math.inf)
    for k0 in range(0, S.shape[-1], b):
        s = S[..., k0:k0 + b]
        m_blk = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - m_blk)
        assert bool((p <= 1).all())
        l, m, top = torch.exp(m - m_blk) * l + p.sum(-1, keepdim=True), m_blk, torch.maximum(top, m_blk)
    assert bool(torch.isinf(l).any()) and bool(((top - m)[torch.isinf(l)] > 88).all())
    assert not torch.isfinite(fix_block_max(Q, K, V, b)).all() and torch.allclose(
        fix_block_max(*(x.double() for x in (Q, K, V)), b), fix_ok(*(x.double() for x in (Q, K, V)), b))


def test_training_peak_non_whole_answers_share_one_hint(capsys):
    """Every non-whole count (below, near and above the bound, the guarded chain's measured 4.25
    and 4.5 included) gets the same message: count whole score matrices; none gets a hint meant for
    a whole count. Whole counts far above the bound (7, 12) are told to walk the backward steps, and
    only counts that look like they grew with T (bytes, elements) hear that the count does not."""
    outs = set()
    for answer in PEAK_NOT_WHOLE:
        result = ex.check_training_peak(answer)
        outs.add(capsys.readouterr().out)
        assert result.passed is False
    assert len(outs) == 1 and "count whole score matrices" in outs.pop()
    for answer in (7, 12):
        ex.check_training_peak(answer)
        out = capsys.readouterr().out
        assert "does not grow" not in out and "Walk the backward steps" in out, out
    ex.check_training_peak(4096)
    assert "does not grow with T" in capsys.readouterr().out


def test_timing_plan_and_prediction_wording(capsys):
    """5.1: the prediction's success points to what it teaches (no 'fix it': there is no fix
    exercise); only a swapped plan hears about the order; one and two blocks read as words."""
    ex.check_buggy_timing_prediction(74 / 13)
    out = capsys.readouterr().out
    assert "fix it" not in out.lower() and "part (b)" in out, out
    ex.check_timing_plan((10, 20))  # (20, 10) fails too: not a swap
    out = capsys.readouterr().out
    assert "too few calls per block" in out and "order" not in out, out
    ex.check_timing_plan((2, 100))
    out = capsys.readouterr().out
    assert "all 2" not in out and "both of your blocks" in out, out


def test_key_block_fix_success_does_not_claim_the_division_is_deferred(capsys):
    """An accepted fix that keeps its output normalised as it goes hears no 'as here'; and it is
    right: it equals the one that divides by l after the last block."""
    gen = torch.Generator().manual_seed(7)
    Q, K, V = (torch.randn(2, 11, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(fix_normalise_as_you_go(Q, K, V, 3), fix_ok(Q, K, V, 3), atol=1e-12)
    for answer in (fix_ok, fix_normalise_as_you_go):
        assert ex.check_key_block_fix(answer).passed is True
        assert "as here" not in capsys.readouterr().out


def test_rows_rule_that_raises_on_one_block_hears_about_that_case(capsys):
    """A rule built on the later keys' maximum raises when block_size >= T_k (the later slice is
    empty): the hint names that case and asks which rows are right then, without the rule; the
    same rule with that case handled (rows_strict) gets the ties hint instead."""
    with pytest.raises(IndexError):
        rows_later_max(torch.zeros(2, 3, dtype=torch.float64), 5)
    for answer in (rows_later_max_strict, rows_later_max, rows_numpy_later_max):
        ex.check_rows_right(answer)
        out = capsys.readouterr().out
        assert "block_size >= T_k" in out and "Which rows are right then?" in out, out
        assert ">= S.amax" not in out and "first block" not in out, out
    ex.check_rows_right(rows_strict)
    assert "ties count as right" in capsys.readouterr().out


def _exact_head_dim(T, e, balance):
    """By brute force in exact arithmetic: the first d whose 2 T^2 d FLOPs over the bytes of Q, K
    (read) and S (written) reach ``balance``; None when T / e <= balance, since then
    I(d) = (T / e) * 2d / (2d + T) < T / e <= balance for every d."""
    balance = Fraction(balance)
    if Fraction(T, e) <= balance:  # I(d) = (T / e) * 2d / (2d + T) < T / e for every d
        return None
    d = 1
    while Fraction(2 * T * T * d, (2 * T * d + T * T) * e) < balance:
        d += 1
    return d


def test_head_dim_notebook_case_by_flop_and_byte_counts():
    """T = 4096, float16 on an H200 (989 TFLOP/s over 4.8 TB/s, exactly): 229 leaves Q @ K^T below
    the balance, 230 reaches it, counted from FLOPs and bytes; the right answers here agree."""
    T, e, balance = 4096, 2, Fraction(989 * 10**12, 48 * 10**11)
    intensity = {d: Fraction(2 * T * T * d, (T * d * e + T * d * e + T * T * e)) for d in (229, 230, 231)}
    assert intensity[229] < balance <= intensity[230] < intensity[231]
    assert [f"{float(intensity[d]):.2f}" for d in (229, 230, 231)] == ["205.97", "206.78", "207.59"]
    for answer in (head_dim_ok, head_dim_brute, nb05._head_dim):
        assert answer(T, e, H200) == 230


def test_head_dim_hidden_cases_are_well_chosen():
    """The hidden cases: the notebook's first; e in {2, 4}; GPUs A100, H200, T4 and a float32
    balance; several T; the checker's exact reference equals a brute force in exact arithmetic and
    the float closed form and float brute force (so float answers are not judged on rounding);
    every bound is at least 0.05 from a whole number (some below and some above the half, so
    rounding down and to nearest both differ from rounding up) except one exact integer (where `>`
    differs); three cases where no head_dim works, one of them with T / e equal to the balance."""
    cases = nb05._HEAD_DIM_CASES
    assert cases[0] == (4096, 2, H200)
    assert {e for _, e, _ in cases} == {2, 4} and len({T for T, _, _ in cases}) >= 4
    assert {A100, H200, T4} <= {b for _, _, b in cases} and any(b < 10 for _, _, b in cases)
    fractions, exact_bounds, none_cases = [], 0, []
    for T, e, b in cases:
        truth = _exact_head_dim(T, e, b)
        assert nb05._head_dim(T, e, b) == truth == head_dim_ok(T, e, b) == head_dim_brute(T, e, b), (T, e, b)
        if truth is None:
            none_cases.append(Fraction(T) == Fraction(b) * e)
            continue
        x = Fraction(b) * e * T / (2 * (T - Fraction(b) * e))
        frac = x - math.floor(x)
        if frac == 0:
            exact_bounds += 1
            assert Fraction(2 * T * T * x, (2 * T * x + T * T) * e) == Fraction(b)  # I(x) = balance exactly
        else:
            assert Fraction(1, 20) <= frac <= Fraction(19, 20), (T, e, b, float(frac))
            fractions.append(frac)
    assert exact_bounds == 1 and sorted(none_cases) == [False, False, True]
    assert any(f < Fraction(1, 2) for f in fractions) and any(f > Fraction(1, 2) for f in fractions)


def test_head_dim_mistakes_differ_from_the_truth_and_each_other():
    """Each typical mistake gives other answers than the truth on the hidden cases, and mistakes
    with different hints give different answers (so each hint belongs to its mistake)."""
    cases = nb05._HEAD_DIM_CASES
    truth = [_exact_head_dim(*c) for c in cases]
    answers = {fn: [fn(*c) for c in cases] for fn in HEAD_DIM_MISTAKES}
    for fn, got in answers.items():
        assert got != truth, fn.__name__
    fns = list(answers)
    for i, f in enumerate(fns):
        for g in fns[:i]:
            if HEAD_DIM_MISTAKES[f] != HEAD_DIM_MISTAKES[g]:
                assert answers[f] != answers[g], (f.__name__, g.__name__)
    # `>` differs from `>=` only at the exact bound, and there by one
    diff = [(s, t) for s, t in zip(answers[head_dim_strict], truth, strict=True) if s != t]
    assert diff == [(97, 96)]


def test_head_dim_time_out_names_the_case(capsys, monkeypatch):
    """A brute force with no test for 'no head_dim works' never ends where T / e is below the
    balance: the time-out message names that case."""
    from shared.exercises import _core

    def brute_no_guard(T, bytes_per_element, balance):
        d = 1
        while 2 * T * T * d < balance * (2 * T * d + T * T) * bytes_per_element:
            d += 1
        return d

    monkeypatch.setattr(_core, "TIME_LIMIT_S", 0.3)
    result = ex.check_compute_bound_head_dim(brute_no_guard)
    out = capsys.readouterr().out
    assert result.passed is False and "still running" in out, out
    assert "(on T = 300, bytes_per_element = 2, balance = 153.016; there T / bytes_per_element = 150" in out, out
    assert "never reaches the balance" in out, out


def test_head_dim_intensity_grows_towards_T_over_e():
    """I(d) grows with d and stays below T / e (so where T / e <= balance no d reaches it), on
    every hidden case, counted from FLOPs and bytes."""
    for T, e, _ in nb05._HEAD_DIM_CASES:
        values = [Fraction(2 * T * T * d, (2 * T * d + T * T) * e) for d in (1, 2, 64, 128, 10**6, 10**12)]
        assert values == sorted(set(values)) and values[-1] < Fraction(T, e)
        assert values[-1] / Fraction(T, e) > 1 - Fraction(1, 10**6)  # within a millionth of T / e


def fix_logsumexp_first(Q, K, V, block_size):  # the row's log-sum-exp over all keys first: two sweeps
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    lse = torch.logsumexp(S, dim=-1, keepdim=True)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        acc = acc + torch.exp(S[..., k0:k0 + block_size] - lse) @ V[..., k0:k0 + block_size, :]
    return acc


def test_a_log_sum_exp_over_all_keys_first_is_refused(capsys):
    """A log-sum-exp over every key before the loop is a first sweep, like a maximum over all keys:
    right values, refused with the hint that names it."""
    Q, K, V, b, _ = nb05._fix_cases()[0]
    ref = torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V
    assert torch.allclose(fix_logsumexp_first(Q, K, V, b), ref)  # right values
    assert ex.check_key_block_fix(fix_logsumexp_first).passed is False
    assert "the maximum over all 19 keys at once" in capsys.readouterr().out  # logsumexp takes it
