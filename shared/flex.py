"""The course's attention variants as FlexAttention ``mask_mod`` and ``score_mod`` functions
(notebook 11), and helpers to look at them as dense masks and tile maps.

``torch.nn.attention.flex_attention.flex_attention(Q, K, V, score_mod=..., block_mask=...)``
computes ``softmax(score_mod(Q K^T / sqrt(d_k))) V``, where

* a **mask_mod** ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` may attend
  to key ``kv_idx`` (True = may attend, the course's convention) in batch ``b``, head ``h``; it is
  turned into a ``BlockMask`` with ``create_block_mask`` so that empty tiles are skipped;
* a **score_mod** ``score_mod(score, b, h, q_idx, kv_idx) -> score`` changes one scaled score (a
  bias such as ALiBi, a soft cap); it sees one score at a time, never its row.

FlexAttention calls these functions on index tensors (through ``torch.vmap``), so they must be
written with tensor operations (``&``, ``|``, ``torch.where``), not Python ``and``/``if``.

Mask mods here: ``causal``, ``causal_bottom_right`` (T_q < T_k, as in a KV cache),
``sliding_window``, ``prefix_lm``, ``document`` (packed sequences), ``padding`` (per-batch key
lengths) and ``sinks`` (a window plus the first tokens, StreamingLLM). Score
mods: ``alibi`` (notebook 07's slopes) and ``soft_cap`` (tanh soft-capping, Gemma 2).

Helpers: ``dense_mask`` evaluates a mask_mod on every (query, key) pair by broadcasting (True = may
attend), for checks against the course's own masks and ``F.scaled_dot_product_attention``;
``score_bias`` evaluates a score_mod on a score matrix, one score at a time as FlexAttention does;
``tile_map`` reads a ``BlockMask`` as a ``(q blocks, kv blocks)`` array of ``EMPTY``, ``PARTIAL``
and ``FULL`` tiles, and ``effective_mask`` expands it into the pairs a compiled kernel attends to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shared.positional import alibi_slopes

__all__ = [
    "causal",
    "causal_bottom_right",
    "sliding_window",
    "prefix_lm",
    "document",
    "padding",
    "sinks",
    "alibi",
    "soft_cap",
    "dense_mask",
    "score_bias",
    "effective_mask",
    "tile_map",
    "EMPTY",
    "PARTIAL",
    "FULL",
]

EMPTY, PARTIAL, FULL = 0, 1, 2  # tile_map's codes: skipped, computed with the mask, computed whole


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return value


def _int_vector(name: str, x, meaning: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if x.ndim != 1 or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor ({meaning}); got shape "
                         f"{tuple(x.shape)}, dtype {x.dtype}")
    return x


# --------------------------------------------------------------------------------------------
# mask_mods: (b, h, q_idx, kv_idx) -> True where query q_idx may attend to key kv_idx
# --------------------------------------------------------------------------------------------
def causal(b, h, q_idx, kv_idx):
    """Causal, aligned top-left like ``is_causal=True``: key ``j`` visible to query ``i`` when
    ``j <= i``."""
    return q_idx >= kv_idx


def causal_bottom_right(T_q: int, T_k: int) -> Callable:
    """Causal for ``T_q`` queries that are the *last* ``T_q`` of ``T_k`` positions (a KV cache,
    notebook 08): query ``i`` sits at position ``T_k - T_q + i`` and sees keys up to it."""
    T_q, T_k = _positive_int("T_q", T_q), _positive_int("T_k", T_k)
    if T_q > T_k:
        raise ValueError(f"bottom-right alignment needs T_q <= T_k; got T_q = {T_q}, T_k = {T_k}")
    offset = T_k - T_q

    def causal_bottom_right_mask(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return causal_bottom_right_mask


def sliding_window(window: int) -> Callable:
    """Causal sliding window: query ``i`` sees the ``window`` keys ``i - window + 1 .. i``
    (itself included), like ``shared.generation.window_mask``."""
    window = _positive_int("window", window)

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return sliding_window_mask


def prefix_lm(prefix_len: int) -> Callable:
    """Prefix-LM: the first ``prefix_len`` tokens (the prompt) are visible to every query, in both
    directions; after them, causal."""
    prefix_len = _positive_int("prefix_len", prefix_len)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_len) | (q_idx >= kv_idx)

    return prefix_lm_mask


def document(doc_ids, causal_within: bool = True) -> Callable:
    """Packed sequences: ``doc_ids`` ``(T,)`` gives each token's document; a query sees only keys of
    its own document (and, with ``causal_within``, only earlier ones). The tensor is captured:
    build a new BlockMask whenever it changes."""
    doc_ids = _int_vector("doc_ids", doc_ids, "one document id per token")

    def document_mask(b, h, q_idx, kv_idx):
        same = doc_ids[q_idx] == doc_ids[kv_idx]
        return same & (q_idx >= kv_idx) if causal_within else same

    return document_mask


def padding(lengths) -> Callable:
    """Right padding: ``lengths`` ``(B,)`` real tokens per sequence; keys at positions
    ``>= lengths[b]`` are padding and are never attended to (notebook 09's attention mask)."""
    lengths = _int_vector("lengths", lengths, "real tokens per sequence of the batch")

    def padding_mask(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return padding_mask


def sinks(window: int, num_sinks: int) -> Callable:
    """Causal window plus attention sinks (StreamingLLM, notebook 08): query ``i`` sees the last
    ``window`` keys and the first ``num_sinks`` tokens, what ``KVCache(window, sinks)`` keeps."""
    window = _positive_int("window", window)
    if isinstance(num_sinks, bool) or not isinstance(num_sinks, int) or num_sinks < 0:
        raise ValueError(f"num_sinks must be a non-negative integer; got {num_sinks!r}")

    def sinks_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx < window) | (kv_idx < num_sinks))

    return sinks_mask


# --------------------------------------------------------------------------------------------
# score_mods: (score, b, h, q_idx, kv_idx) -> new score (score = q . k / sqrt(d_k))
# --------------------------------------------------------------------------------------------
def alibi(num_heads: int) -> Callable:
    """ALiBi (Press et al., 2022): add ``-m_h * (i - j)`` to the score of query ``i`` and key
    ``j``, with ``shared.positional.alibi_slopes(num_heads)`` (notebook 07). Combine with the
    ``causal`` mask; the heads of ``Q`` must number ``num_heads``."""
    slopes = alibi_slopes(num_heads)  # (num_heads,) float64, cast to the scores' dtype

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score + slopes[h].to(score.dtype) * (kv_idx - q_idx)

    return alibi_score


def soft_cap(cap: float) -> Callable:
    """tanh soft-capping (Gemma 2): ``cap * tanh(score / cap)`` keeps every score in
    ``(-cap, cap)`` and leaves small ones almost unchanged."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"cap must be a positive number; got {cap!r}")
    cap = float(cap)

    def soft_cap_score(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return soft_cap_score


# --------------------------------------------------------------------------------------------
# Looking at them
# --------------------------------------------------------------------------------------------
def _check_fn(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function; got {type(fn).__name__}")


def dense_mask(mask_mod: Callable, T_q: int, T_k: int | None = None, B: int | None = None,
               H: int | None = None) -> torch.Tensor:
    """Evaluate ``mask_mod`` on every (query, key) pair at once by broadcasting index tensors.

    Shapes: returns ``(T_q, T_k)`` boolean (True = may attend), or ``(B, H, T_q, T_k)`` when ``B``
    and ``H`` are given (for masks that depend on the batch or head), ready for
    ``F.scaled_dot_product_attention(attn_mask=...)`` or ``shared.modules.naive_attention``.
    """
    _check_fn("mask_mod", mask_mod)
    T_q = _positive_int("T_q", T_q)
    T_k = T_q if T_k is None else _positive_int("T_k", T_k)
    if (B is None) != (H is None):
        raise ValueError(f"give both B and H, or neither; got B = {B!r}, H = {H!r}")
    if B is None:
        b = h = torch.zeros((), dtype=torch.long)
        q_idx, kv_idx = torch.arange(T_q)[:, None], torch.arange(T_k)[None, :]
        shape = (T_q, T_k)
    else:
        B, H = _positive_int("B", B), _positive_int("H", H)
        b = torch.arange(B)[:, None, None, None]
        h = torch.arange(H)[None, :, None, None]
        q_idx, kv_idx = torch.arange(T_q)[:, None], torch.arange(T_k)[None, :]
        shape = (B, H, T_q, T_k)
    out = torch.as_tensor(mask_mod(b, h, q_idx, kv_idx))
    if out.dtype != torch.bool:
        raise TypeError(f"mask_mod must return booleans (True = may attend); got dtype "
                        f"{out.dtype}")
    return out.expand(shape).clone()


def score_bias(score_mod: Callable, scores: torch.Tensor) -> torch.Tensor:
    """Apply ``score_mod`` to every entry of a score matrix the way FlexAttention calls it: through
    ``torch.vmap``, one score (a 0-d tensor) and its four indices at a time.

    Shapes: ``scores`` ``(B, H, T_q, T_k)`` (already scaled by ``1/sqrt(d_k)``); returns the
    modified scores, same shape, to be softmaxed by the caller.
    """
    _check_fn("score_mod", score_mod)
    if not isinstance(scores, torch.Tensor) or scores.ndim != 4:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a 4-D tensor (B, H, T_q, T_k); got {got}")
    fn = score_mod
    # innermost first: over the keys, then the queries, the heads, the batch
    for dims in ((0, None, None, None, 0), (0, None, None, 0, None), (0, None, 0, None, None),
                 (0, 0, None, None, None)):
        fn = torch.vmap(fn, in_dims=dims)
    B, H, T_q, T_k = scores.shape
    return fn(scores, torch.arange(B), torch.arange(H), torch.arange(T_q), torch.arange(T_k))


def effective_mask(block_mask) -> torch.Tensor:
    """What the compiled kernel actually lets through for batch 0, head 0: every pair of a
    ``FULL`` tile (its mask is never evaluated), the pairs of a ``PARTIAL`` tile that the
    BlockMask's ``mask_mod`` allows *now*, and nothing of an ``EMPTY`` tile. Equals the dense
    mask while the BlockMask is up to date; differs when the data its mask_mod reads has changed
    since ``create_block_mask``.

    Shapes: returns ``(T_q, T_k)`` boolean, True = attended to.
    """
    tiles = tile_map(block_mask)
    T_q, T_k = block_mask.seq_lengths
    bq, bk = block_mask.BLOCK_SIZE
    kind = tiles.repeat_interleave(bq, dim=0).repeat_interleave(bk, dim=1)[:T_q, :T_k]
    return (kind == FULL) | ((kind == PARTIAL) & dense_mask(block_mask.mask_mod, T_q, T_k))


def tile_map(block_mask, b: int = 0, h: int = 0) -> torch.Tensor:
    """The tiles of a ``BlockMask`` for batch ``b``, head ``h``: a ``(q blocks, kv blocks)``
    integer tensor with ``EMPTY`` (0, skipped), ``PARTIAL`` (1, computed and masked inside) and
    ``FULL`` (2, computed without evaluating the mask)."""
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        if not hasattr(block_mask, name):
            raise TypeError(f"block_mask must be a BlockMask from create_block_mask; got "
                            f"{type(block_mask).__name__}")
    bb = min(b, block_mask.kv_num_blocks.shape[0] - 1)  # a mask built with B=None broadcasts
    hh = min(h, block_mask.kv_num_blocks.shape[1] - 1)
    n_q, n_k = block_mask.kv_indices.shape[-2:]
    tiles = torch.full((n_q, n_k), EMPTY, dtype=torch.long)
    kinds = [(block_mask.kv_num_blocks, block_mask.kv_indices, PARTIAL)]
    if block_mask.full_kv_num_blocks is not None:
        kinds.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, FULL))
    for counts, indices, code in kinds:
        for qb in range(n_q):
            n = int(counts[bb, hh, qb])
            tiles[qb, indices[bb, hh, qb, :n].long()] = code
    return tiles
