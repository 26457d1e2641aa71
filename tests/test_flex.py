"""shared.flex against the course's own attention from earlier notebooks (shared.attention,
shared.modules, shared.positional, shared.generation, shared.flash), against
F.scaled_dot_product_attention with an explicit mask, and against brute-force loops; FlexAttention
runs eagerly (no compile) on small float64 inputs, so the tolerance is 1e-10."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import (
    AuxRequest,
    create_block_mask,
    create_mask,
    flex_attention,
)

from shared import flex
from shared.attention import scaled_dot_product_attention as numpy_attention
from shared.flash import tiled_attention
from shared.generation import KVCache, causal_mask, gqa_attention, window_mask
from shared.modules import naive_attention
from shared.positional import alibi_bias, alibi_slopes

ATOL = 1e-10  # float64 throughout: agreement to rounding, far below any real difference


@pytest.fixture(autouse=True)
def _no_compile_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def qkv(seed, B=2, H=3, T=12, d=4, T_k=None):
    T_k = T if T_k is None else T_k
    return randn(seed, B, H, T, d), randn(seed + 1, B, H, T_k, d), randn(seed + 2, B, H, T_k, d)


def flex_out(Q, K, V, mask_mod=None, score_mod=None, B=None, H=None, block_size=4, **kw):
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, B, H, Q.shape[-2], K.shape[-2], device="cpu",
                                       BLOCK_SIZE=block_size)
    return flex_attention(Q, K, V, score_mod=score_mod, block_mask=block_mask, **kw)


def brute(T_q, T_k, rule):
    return torch.tensor([[bool(rule(i, j)) for j in range(T_k)] for i in range(T_q)])


# ------------------------------------------------------------------ dense masks by brute force
@pytest.mark.parametrize("name, mod, rule", [
    ("causal", flex.causal, lambda i, j: j <= i),
    ("window 3", flex.sliding_window(3), lambda i, j: i - 3 < j <= i),
    ("prefix 4", flex.prefix_lm(4), lambda i, j: j < 4 or j <= i),
    ("sinks 3+2", flex.sinks(3, 2), lambda i, j: j <= i and (i - j < 3 or j < 2)),
])
def test_dense_mask_by_brute_force_and_torch_create_mask(name, mod, rule):
    T = 11
    ours = flex.dense_mask(mod, T)
    assert torch.equal(ours, brute(T, T, rule)), name
    assert torch.equal(ours, create_mask(mod, None, None, T, T, device="cpu")[0, 0]), name


def test_document_and_padding_masks_by_brute_force():
    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert torch.equal(flex.dense_mask(flex.document(doc), 9),
                       brute(9, 9, lambda i, j: doc[i] == doc[j] and j <= i))
    assert torch.equal(flex.dense_mask(flex.document(doc, causal_within=False), 9),
                       brute(9, 9, lambda i, j: doc[i] == doc[j]))
    lengths = torch.tensor([5, 2, 7])
    got = flex.dense_mask(flex.padding(lengths), 7, B=3, H=2)
    assert got.shape == (3, 2, 7, 7)
    for b in range(3):
        assert torch.equal(got[b, 1], brute(7, 7, lambda i, j, b=b: j < lengths[b]))
    assert torch.equal(got, create_mask(flex.padding(lengths), 3, 2, 7, 7, device="cpu"))


# ------------------------------------------------------------------ against the course's attention
def test_no_mods_equals_sdpa_and_the_numpy_reference():
    Q, K, V = qkv(0)
    out = flex_attention(Q, K, V)
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V), atol=ATOL)
    assert np.allclose(out.numpy(), numpy_attention(Q.numpy(), K.numpy(), V.numpy())[0],
                       atol=ATOL)


def test_causal_equals_naive_numpy_tiled_and_sdpa():
    Q, K, V = qkv(3)
    out = flex_out(Q, K, V, flex.causal)
    assert torch.allclose(out, naive_attention(Q, K, V, causal=True)[0], atol=ATOL)
    assert np.allclose(out.numpy(), numpy_attention(Q.numpy(), K.numpy(), V.numpy(),
                                                    causal=True)[0], atol=ATOL)
    assert torch.allclose(out, tiled_attention(Q, K, V, causal=True, block_size=5), atol=ATOL)
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V, is_causal=True), atol=ATOL)


def test_causal_as_a_score_mod_equals_the_mask_mod():
    Q, K, V = qkv(6)

    def causal_score(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, -float("inf"))

    assert torch.allclose(flex_out(Q, K, V, score_mod=causal_score), flex_out(Q, K, V, flex.causal),
                          atol=ATOL)


@pytest.mark.parametrize("T_q, T_k", [(1, 9), (3, 9), (8, 8)])
def test_bottom_right_causal_equals_generation_causal_mask(T_q, T_k):
    Q, K, V = qkv(9, T=T_q, T_k=T_k)
    out = flex_out(Q, K, V, flex.causal_bottom_right(T_q, T_k))
    ref = naive_attention(Q, K, V, mask=causal_mask(T_q, T_k))[0]
    assert torch.allclose(out, ref, atol=ATOL)
    assert torch.equal(flex.dense_mask(flex.causal_bottom_right(T_q, T_k), T_q, T_k),
                       causal_mask(T_q, T_k))


@pytest.mark.parametrize("w", [1, 3, 5, 20])
def test_sliding_window_equals_generation_window_mask(w):
    Q, K, V = qkv(12, T=13)
    out = flex_out(Q, K, V, flex.sliding_window(w))
    mask = window_mask(13, window=w)
    assert torch.equal(flex.dense_mask(flex.sliding_window(w), 13), mask)
    assert torch.allclose(out, naive_attention(Q, K, V, mask=mask)[0], atol=ATOL)
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), atol=ATOL)
    assert torch.allclose(out, tiled_attention(Q, K, V, mask=mask, block_size=4), atol=ATOL)


def test_sinks_equal_decoding_through_a_windowed_kv_cache():
    T, window, num_sinks = 14, 4, 2
    Q, K, V = qkv(15, B=1, H=2, T=T)
    cache = KVCache(window=window, sinks=num_sinks)
    rows = []
    for p in range(T):  # decode one token at a time, attending to what the cache keeps
        K_c, V_c, _ = cache.update(K[:, :, p:p + 1], V[:, :, p:p + 1])
        rows.append(naive_attention(Q[:, :, p:p + 1], K_c, V_c)[0])
    streamed = torch.cat(rows, dim=2)
    assert torch.allclose(flex_out(Q, K, V, flex.sinks(window, num_sinks)), streamed, atol=ATOL)


def test_prefix_lm_equals_sdpa_with_its_mask_and_sees_the_prompt_both_ways():
    Q, K, V = qkv(18)
    mask = brute(12, 12, lambda i, j: j < 5 or j <= i)
    out = flex_out(Q, K, V, flex.prefix_lm(5))
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), atol=ATOL)
    # query 0 sees the whole prompt, unlike causal attention
    assert not torch.allclose(out[:, :, 0], flex_out(Q, K, V, flex.causal)[:, :, 0], atol=1e-3)


def test_document_mask_equals_each_document_alone():
    lengths = [3, 5, 1, 7]
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    T = int(doc.numel())
    Q, K, V = qkv(21, T=T)
    out = flex_out(Q, K, V, flex.document(doc))
    start = 0
    for n in lengths:  # each document on its own, plain causal attention
        s = slice(start, start + n)
        alone = naive_attention(Q[:, :, s], K[:, :, s], V[:, :, s], causal=True)[0]
        assert torch.allclose(out[:, :, s], alone, atol=ATOL)
        start += n
    mask = flex.dense_mask(flex.document(doc), T)
    assert torch.allclose(out, tiled_attention(Q, K, V, mask=mask, block_size=4), atol=ATOL)


def test_padding_equals_each_sequence_without_its_padding():
    lengths = torch.tensor([6, 3])
    Q, K, V = qkv(24, B=2, T=6)
    out = flex_out(Q, K, V, flex.padding(lengths), B=2, H=3)
    for b, n in enumerate(lengths.tolist()):
        alone = F.scaled_dot_product_attention(Q[b:b + 1], K[b:b + 1, :, :n], V[b:b + 1, :, :n])
        assert torch.allclose(out[b:b + 1], alone, atol=ATOL)


def test_alibi_equals_positional_alibi_bias_through_sdpa_and_by_hand():
    H, T = 4, 10
    Q, K, V = qkv(27, H=H, T=T)
    out = flex_out(Q, K, V, flex.causal, score_mod=flex.alibi(H))
    bias = alibi_bias(H, T, dtype=torch.float64)  # (H, T, T), -inf above the diagonal
    assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=bias), atol=ATOL)
    # by hand, from the slopes: softmax(QK^T/sqrt(d) - m_h (i - j)) over j <= i
    i = torch.arange(T)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    scores = scores - alibi_slopes(H)[:, None, None] * (i[:, None] - i[None, :])
    scores = scores.masked_fill(i[None, :] > i[:, None], -math.inf)
    assert torch.allclose(out, torch.softmax(scores, dim=-1) @ V, atol=ATOL)


def test_soft_cap_by_hand_and_bounded():
    Q, K, V = qkv(30)
    Q = 20 * Q  # large scores, where the cap matters
    out = flex_attention(Q, K, V, score_mod=flex.soft_cap(5.0))
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    ref = torch.softmax(5.0 * torch.tanh(scores / 5.0), dim=-1) @ V
    assert torch.allclose(out, ref, atol=ATOL)
    assert not torch.allclose(out, F.scaled_dot_product_attention(Q, K, V), atol=1e-3)
    capped = flex.score_bias(flex.soft_cap(5.0), scores)
    assert capped.abs().max() <= 5.0 and torch.allclose(capped, 5.0 * torch.tanh(scores / 5.0))


def test_gqa_equals_generation_gqa_attention():
    Q = randn(33, 2, 6, 8, 4)
    K, V = randn(34, 2, 2, 8, 4), randn(35, 2, 2, 8, 4)
    out = flex_out(Q, K, V, flex.causal, enable_gqa=True)
    assert torch.allclose(out, gqa_attention(Q, K, V, causal_mask(8))[0], atol=ATOL)


def test_fully_masked_row_gives_zero_output_like_the_course():
    Q, K, V = qkv(36, T=8)

    def no_first_query(b, h, q_idx, kv_idx):
        return (q_idx > 0) & (q_idx >= kv_idx)

    out, aux = flex_out(Q, K, V, no_first_query, return_aux=AuxRequest(lse=True))
    lse = aux.lse
    mask = flex.dense_mask(no_first_query, 8)
    assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
    assert torch.isneginf(lse[:, :, 0]).all()
    assert torch.allclose(out, naive_attention(Q, K, V, mask=mask)[0], atol=ATOL)


# ------------------------------------------------------------------ tiles
def test_tile_map_of_causal_matches_notebook_05s_rule():
    T, bs = 12, 3
    bm = create_block_mask(flex.causal, None, None, T, T, device="cpu", BLOCK_SIZE=bs)
    tiles = flex.tile_map(bm)
    n = T // bs
    for qb in range(n):
        for kb in range(n):  # 05: skipped if every key follows every query; masked if crossed
            q0, q1, k0, k1 = qb * bs, qb * bs + bs - 1, kb * bs, kb * bs + bs - 1
            expected = flex.EMPTY if k0 > q1 else (flex.PARTIAL if k1 > q0 else flex.FULL)
            assert tiles[qb, kb] == expected


@pytest.mark.parametrize("mod", [flex.sliding_window(5), flex.prefix_lm(6), flex.sinks(5, 3),
                                 flex.document(torch.tensor([0] * 5 + [1] * 9 + [2] * 10))])
def test_tile_map_agrees_with_the_dense_mask(mod):
    T, bs = 24, 4
    tiles = flex.tile_map(create_block_mask(mod, None, None, T, T, device="cpu", BLOCK_SIZE=bs))
    dense = flex.dense_mask(mod, T).reshape(T // bs, bs, T // bs, bs)
    any_, all_ = dense.any(dim=(1, 3)), dense.all(dim=(1, 3))
    expected = torch.where(all_, flex.FULL, torch.where(any_, flex.PARTIAL, flex.EMPTY))
    assert torch.equal(tiles, expected)


def test_effective_mask_is_the_mask_while_fresh_and_shows_a_stale_block_mask():
    doc = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    mod = flex.document(doc)
    bm = create_block_mask(mod, None, None, 12, 12, device="cpu", BLOCK_SIZE=4)
    assert torch.equal(flex.effective_mask(bm), flex.dense_mask(mod, 12))
    doc.copy_(torch.tensor([0] * 6 + [1] * 6))  # new documents, old BlockMask
    stale = flex.effective_mask(bm)
    now = flex.dense_mask(mod, 12)
    assert not torch.equal(stale, now)
    assert not stale[5, :4].any() and now[5, :4].all()  # tile (1, 0) was empty: skipped
    assert torch.equal(stale, now & torch.block_diag(*[torch.ones(4, 4, dtype=torch.bool)] * 3))


def test_score_bias_calls_the_score_mod_one_score_at_a_time():
    scores = randn(40, 2, 3, 4, 5)

    def row_max_normalised(score, b, h, q_idx, kv_idx):  # looks row-wise, is not
        return score / score.abs().max()

    assert torch.equal(flex.score_bias(row_max_normalised, scores), torch.sign(scores))
    heads = flex.score_bias(lambda s, b, h, q, k: s * 0 + h, scores)
    assert torch.equal(heads[1, 2], torch.full((4, 5), 2.0, dtype=torch.float64))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("call, match", [
    (lambda: flex.sliding_window(0), "window must be a positive integer"),
    (lambda: flex.document(torch.tensor([0.0, 1.0])), "doc_ids must be a 1-D integer tensor"),
    (lambda: flex.padding(torch.tensor([[3]])), "lengths must be a 1-D integer tensor"),
    (lambda: flex.soft_cap(-1.0), "cap must be a positive number"),
    (lambda: flex.sinks(4, -1), "num_sinks must be a non-negative integer"),
    (lambda: flex.causal_bottom_right(5, 3), "needs T_q <= T_k"),
    (lambda: flex.dense_mask(flex.causal, 4, B=2), "give both B and H"),
    (lambda: flex.dense_mask(lambda b, h, q, k: (q - k).float(), 3), "must return booleans"),
    (lambda: flex.score_bias(flex.soft_cap(2.0), torch.zeros(3, 3)), r"4-D tensor \(B, H"),
    (lambda: flex.tile_map(torch.ones(2, 2)), "BlockMask from create_block_mask"),
])
def test_clear_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
