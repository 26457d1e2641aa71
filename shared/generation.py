"""Attention for generation: the KV cache, grouped-query attention, sliding windows (notebook 08).

Shapes follow the course's conventions: queries ``Q`` ``(B, num_heads, T_q, head_dim)``; keys and
values ``K``, ``V`` ``(B, num_kv_heads, T_k, head_dim)`` with ``num_kv_heads`` dividing
``num_heads`` (``num_kv_heads == num_heads``: multi-head attention; ``1``: multi-query; in
between: grouped-query). Masks are boolean, True = may attend.

* ``KVCache``: the keys and values of the tokens seen so far, for one attention layer; optionally
  only the last ``window`` of them (plus the first ``sinks``), with clear errors when a step's
  ``k``/``v`` do not fit the cache;
* ``causal_mask`` / ``window_mask`` / ``positions_mask``: causal and banded masks for
  ``T_q != T_k``, aligned **bottom-right** (the queries are the *last* ``T_q`` positions), unlike
  ``F.scaled_dot_product_attention(is_causal=True)``, which aligns top-left;
* ``repeat_kv`` and ``gqa_attention``: grouped-query attention by repeating each key/value head
  for its group of query heads (what ``F.scaled_dot_product_attention(..., enable_gqa=True)``
  computes);
* ``GroupedQueryAttention``: a causal attention layer with ``num_kv_heads`` key/value heads, an
  optional sliding window, and a cache for decoding; ``from_multi_head`` converts a
  ``shared.modules.MultiHeadAttention`` by mean-pooling its key/value heads;
* ``kv_cache_bytes``: ``2 * num_layers * batch_size * num_kv_heads * T * head_dim`` elements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from shared.modules import MultiHeadAttention, _check_positive_int, _check_x, attention_weights

__all__ = [
    "KVCache",
    "CacheView",
    "causal_mask",
    "window_mask",
    "positions_mask",
    "repeat_kv",
    "gqa_attention",
    "GroupedQueryAttention",
    "kv_cache_bytes",
]


# --------------------------------------------------------------------------------------------
# Masks for T_q != T_k: positions, not indices
# --------------------------------------------------------------------------------------------
def positions_mask(q_pos: torch.Tensor, k_pos: torch.Tensor,
                   window: int | None = None) -> torch.Tensor:
    """Causal (optionally banded) mask from absolute token positions.

    Shapes:
        q_pos ``(T_q,)``, k_pos ``(T_k,)`` integer positions in the sequence.

    Returns:
        ``(T_q, T_k)`` boolean, True = may attend: key ``j`` is visible to query ``i`` when
        ``k_pos[j] <= q_pos[i]`` and, with a ``window`` ``w``, ``q_pos[i] - k_pos[j] < w``
        (each query sees at most ``w`` keys, itself included).
    """
    q_pos, k_pos = torch.as_tensor(q_pos), torch.as_tensor(k_pos)
    for name, p in (("q_pos", q_pos), ("k_pos", k_pos)):
        if p.ndim != 1 or p.is_floating_point() or p.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor of positions; got shape "
                             f"{tuple(p.shape)}, dtype {p.dtype}")
    if window is not None:
        _check_positive_int("window", window)
    distance = q_pos[:, None] - k_pos[None, :]  # (T_q, T_k): how far back key j lies
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    return allowed


def causal_mask(T_q: int, T_k: int | None = None, align: str = "bottom_right") -> torch.Tensor:
    """The causal mask for ``T_q`` queries and ``T_k`` keys (default ``T_k = T_q``).

    ``align="bottom_right"`` (the default, right for a KV cache): the queries are the *last*
    ``T_q`` of the ``T_k`` positions, so query ``i`` sits at position ``T_k - T_q + i`` and sees
    keys ``0 .. T_k - T_q + i``. ``align="top_left"``: query ``i`` sees keys ``0 .. i``, which is
    what ``F.scaled_dot_product_attention(is_causal=True)`` does. The two agree when ``T_q == T_k``.

    Returns:
        ``(T_q, T_k)`` boolean, True = may attend.
    """
    T_q = _check_positive_int("T_q", T_q)
    T_k = T_q if T_k is None else _check_positive_int("T_k", T_k)
    if align == "top_left":
        return torch.ones(T_q, T_k, dtype=torch.bool).tril()
    if align != "bottom_right":
        raise ValueError(f"align must be 'bottom_right' or 'top_left'; got {align!r}")
    if T_q > T_k:
        raise ValueError(f"bottom-right alignment needs T_q <= T_k (the queries are the last T_q "
                         f"of the T_k positions); got T_q = {T_q}, T_k = {T_k}")
    return positions_mask(torch.arange(T_k - T_q, T_k), torch.arange(T_k))


def window_mask(T_q: int, T_k: int | None = None, window: int = 1) -> torch.Tensor:
    """Sliding-window causal mask, aligned bottom-right like ``causal_mask``.

    Query ``i`` (at position ``p = T_k - T_q + i``) sees the ``window`` keys ``p - window + 1 ..
    p``, fewer near the start. ``window >= T_k`` gives the plain causal mask.

    Returns:
        ``(T_q, T_k)`` boolean, True = may attend.
    """
    T_q = _check_positive_int("T_q", T_q)
    T_k = T_q if T_k is None else _check_positive_int("T_k", T_k)
    if T_q > T_k:
        raise ValueError(f"window_mask needs T_q <= T_k; got T_q = {T_q}, T_k = {T_k}")
    return positions_mask(torch.arange(T_k - T_q, T_k), torch.arange(T_k), window=window)


# --------------------------------------------------------------------------------------------
# The KV cache
# --------------------------------------------------------------------------------------------
class CacheView(NamedTuple):
    """What a step attends to: keys ``K`` ``(B, num_kv_heads, T_k, head_dim)``, values ``V``
    ``(B, num_kv_heads, T_k, head_dim_v)`` and their absolute ``positions`` ``(T_k,)``."""

    K: torch.Tensor
    V: torch.Tensor
    positions: torch.Tensor


class KVCache:
    """The keys and values of the tokens seen so far, for one attention layer.

    Shapes: a step's ``k`` is ``(B, num_kv_heads, T_new, head_dim)`` and its ``v``
    ``(B, num_kv_heads, T_new, head_dim_v)``; the cache stores ``K`` and ``V`` with ``T`` in the
    third place. The first ``update`` fixes ``B``, ``num_kv_heads``, the head dimensions, dtype and
    device; a later step that does not match raises a ``ValueError`` saying what differs.

    ``window=None`` keeps every token (the cache grows by ``T_new`` each step). ``window=w`` keeps
    only the last ``w`` tokens, plus the first ``sinks`` tokens of the sequence ("attention
    sinks"), so it never holds more than ``sinks + w`` entries between steps.
    """

    def __init__(self, window: int | None = None, sinks: int = 0):
        if window is not None:
            _check_positive_int("window", window)
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be a non-negative integer; got {sinks!r}")
        if sinks and window is None:
            raise ValueError("sinks only make sense with a window (without one every token is "
                             "kept anyway); got window=None, sinks=" + str(sinks))
        self.window = window
        self.sinks = sinks
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new sequence)."""
        self.K: torch.Tensor | None = None  # (B, num_kv_heads, T, head_dim)
        self.V: torch.Tensor | None = None  # (B, num_kv_heads, T, head_dim_v)
        self.positions = torch.zeros(0, dtype=torch.long)  # (T,) absolute positions
        self.seen = 0  # tokens appended so far (the position of the next one)

    def __len__(self) -> int:
        """The number of tokens held now."""
        return 0 if self.K is None else self.K.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        if self.K is None:
            return 0
        return self.K.nelement() * self.K.element_size() + self.V.nelement() * self.V.element_size()

    def _check_step(self, k, v) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
            if t.ndim != 4:
                raise ValueError(
                    f"{name} must be 4-D (B, num_kv_heads, T_new, head_dim); got shape "
                    f"{tuple(t.shape)} ({t.ndim}-D)"
                    + (": split the heads first, e.g. k.view(B, T, num_kv_heads, head_dim)"
                       ".transpose(1, 2)" if t.ndim == 3 else "")
                )
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must agree in (B, num_kv_heads, T_new); got k "
                             f"{tuple(k.shape)} and v {tuple(v.shape)}")
        if k.dtype != v.dtype:
            raise ValueError(f"k and v must have the same dtype; got {k.dtype} and {v.dtype}")
        if self.K is None:
            return
        for name, new, old in (("k", k, self.K), ("v", v, self.V)):
            labels = ("B", "num_kv_heads", None, "head_dim" if name == "k" else "head_dim_v")
            diffs = [f"{lab} differs ({new.shape[i]} vs {old.shape[i]})"
                     for i, lab in enumerate(labels) if lab and new.shape[i] != old.shape[i]]
            if diffs:
                hint = (" (did you pass all the query heads? the cache holds the key/value heads)"
                        if new.shape[1] != old.shape[1] else "")
                raise ValueError(
                    f"{name} of this step has shape {tuple(new.shape)} but the cache holds "
                    f"{'keys' if name == 'k' else 'values'} of shape (B, num_kv_heads, T, "
                    f"{labels[3]}) = {tuple(old.shape)}: {', '.join(diffs)}{hint}"
                )
        if k.dtype != self.K.dtype or k.device != self.K.device:
            raise ValueError(f"this step's k/v are {k.dtype} on {k.device} but the cache holds "
                             f"{self.K.dtype} on {self.K.device}")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> CacheView:
        """Append this step's ``k`` ``(B, num_kv_heads, T_new, head_dim)`` and ``v``, and return
        the ``CacheView`` this step's queries attend to: the kept tokens followed by the new ones,
        with their positions. With a window, the view holds what the ``T_new`` queries may need
        (the sinks and the last ``window + T_new - 1`` tokens); afterwards the cache keeps only
        the sinks and the last ``window`` tokens."""
        self._check_step(k, v)
        T_new = k.shape[2]
        new_pos = torch.arange(self.seen, self.seen + T_new)
        if self.K is None:
            K, V, pos = k, v, new_pos
        else:
            K = torch.cat([self.K, k], dim=2)  # (B, num_kv_heads, T + T_new, head_dim)
            V = torch.cat([self.V, v], dim=2)
            pos = torch.cat([self.positions, new_pos])
        self.seen += T_new
        view = CacheView(K, V, pos)
        if self.window is not None:
            view = self._keep(K, V, pos, self.window + T_new - 1)
            K, V, pos = self._keep(K, V, pos, self.window)
        self.K, self.V, self.positions = K, V, pos
        return view

    def crop(self, T: int) -> None:
        """Keep only the first ``T`` tokens (forget the rest), e.g. to rewind a decode step."""
        if self.window is not None:
            raise ValueError("crop needs a cache without a window (a windowed cache has already "
                             "forgotten earlier tokens)")
        if isinstance(T, bool) or not isinstance(T, int) or not 0 <= T <= len(self):
            raise ValueError(f"T must be an integer in [0, {len(self)}] (the tokens held); "
                             f"got {T!r}")
        if self.K is not None:
            self.K, self.V = self.K[:, :, :T], self.V[:, :, :T]
            self.positions = self.positions[:T]
        self.seen = T

    def _keep(self, K, V, pos, recent: int) -> CacheView:
        """The sinks (positions < ``sinks``) and the last ``recent`` tokens."""
        keep = (pos < self.sinks) | (pos >= self.seen - recent)
        if bool(keep.all()):
            return CacheView(K, V, pos)
        return CacheView(K[:, :, keep], V[:, :, keep], pos[keep])

    def __repr__(self) -> str:
        shape = None if self.K is None else tuple(self.K.shape)
        return (f"KVCache(window={self.window}, sinks={self.sinks}, tokens held={len(self)}, "
                f"seen={self.seen}, K shape={shape})")


# --------------------------------------------------------------------------------------------
# Grouped-query attention
# --------------------------------------------------------------------------------------------
def _check_groups(num_heads: int, num_kv_heads: int) -> int:
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads must be a multiple of num_kv_heads (each key/value head serves a group of "
            f"query heads); got num_heads = {num_heads}, num_kv_heads = {num_kv_heads}"
        )
    return num_heads // num_kv_heads


def repeat_kv(K: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat each key/value head for its group of query heads.

    Shapes:
        K ``(..., num_kv_heads, T, head_dim)`` -> ``(..., num_heads, T, head_dim)``: query head
        ``h`` gets key/value head ``h // (num_heads // num_kv_heads)``, so neighbouring query heads
        share (``repeat_interleave``, the grouping ``enable_gqa=True`` uses; not ``repeat``, which
        would cycle ``0, 1, 0, 1, ...``).
    """
    if not isinstance(K, torch.Tensor) or K.ndim < 3:
        raise ValueError(f"K must be a tensor (..., num_kv_heads, T, head_dim); got "
                         f"{tuple(K.shape) if isinstance(K, torch.Tensor) else type(K).__name__}")
    _check_positive_int("num_heads", num_heads)
    groups = _check_groups(num_heads, K.shape[-3])
    return K if groups == 1 else K.repeat_interleave(groups, dim=-3)


def gqa_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                  mask: torch.Tensor | None = None):
    """Attention with fewer key/value heads than query heads.

    Shapes:
        Q ``(B, num_heads, T_q, head_dim)``, K ``(B, num_kv_heads, T_k, head_dim)``,
        V ``(B, num_kv_heads, T_k, head_dim_v)``; mask boolean broadcastable to
        ``(B, num_heads, T_q, T_k)``, True = may attend (build it with ``causal_mask`` /
        ``window_mask`` / ``positions_mask``: bottom-right aligned).

    Returns:
        ``(output, weights)``: ``(B, num_heads, T_q, head_dim_v)`` and
        ``(B, num_heads, T_q, T_k)``. Equals ``F.scaled_dot_product_attention(Q, K, V,
        attn_mask=mask, enable_gqa=True)``.
    """
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be 4-D (B, heads, T, head_dim); got {got}")
    if K.shape[:3] != V.shape[:3]:
        raise ValueError(f"K and V must agree in (B, num_kv_heads, T_k); got K {tuple(K.shape)} "
                         f"and V {tuple(V.shape)}")
    if Q.shape[0] != K.shape[0] or Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q {tuple(Q.shape)} and K {tuple(K.shape)} must agree in B and head_dim")
    num_heads = Q.shape[1]
    K, V = repeat_kv(K, num_heads), repeat_kv(V, num_heads)  # (B, num_heads, T_k, head_dim)
    weights = attention_weights(Q, K, mask=mask)  # (B, num_heads, T_q, T_k)
    return weights @ V, weights


# --------------------------------------------------------------------------------------------
# A causal attention layer with num_kv_heads, an optional window, and a cache
# --------------------------------------------------------------------------------------------
class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``num_heads`` query heads and ``num_kv_heads`` key/value heads.

    ``W_query`` ``(d_in -> d_out)``, ``W_key`` and ``W_value`` ``(d_in -> num_kv_heads *
    head_dim)`` with ``head_dim = d_out // num_heads``, ``out_proj`` ``(d_out -> d_out)``. With
    ``num_kv_heads == num_heads`` it is ``shared.modules.MultiHeadAttention``; ``1`` is multi-query
    attention. ``window=w`` restricts each query to the last ``w`` positions, itself included.

    ``forward(x, cache)`` with a ``KVCache`` (from ``new_cache()``) processes only the new tokens
    ``x`` and attends to everything the cache holds: the prefill passes the prompt, each decode step
    one token. The result equals running the whole sequence without a cache.
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, num_kv_heads: int | None = None,
                 window: int | None = None, qkv_bias: bool = False):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.num_heads = _check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = _check_positive_int("num_kv_heads", num_kv_heads)
        _check_groups(num_heads, num_kv_heads)
        if d_out % num_heads:
            raise ValueError(f"d_out must be divisible by num_heads; got d_out = {d_out}, "
                             f"num_heads = {num_heads}")
        self.window = None if window is None else _check_positive_int("window", window)
        self.head_dim = d_out // num_heads
        kv_dim = num_kv_heads * self.head_dim
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    def new_cache(self) -> KVCache:
        """An empty ``KVCache`` for this layer (keeping the last ``window`` tokens if the layer
        has a window)."""
        return KVCache(window=self.window)

    def _split(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, head_dim)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                return_weights: bool = False):
        """Shapes: x ``(B, T_new, d_in)``: all tokens (no cache) or the new ones (with a cache).

        Returns ``out`` ``(B, T_new, d_out)``, or ``(out, weights)`` with weights
        ``(B, num_heads, T_new, T_k)`` when ``return_weights`` (``T_k``: the keys attended to).
        """
        _check_x("x", x, self.d_in)
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache; got {type(cache).__name__}")
            if cache.window is not None and (self.window is None or cache.window < self.window):
                needs = ("every earlier token" if self.window is None
                         else f"the last {self.window}")
                raise ValueError(f"this cache keeps only the last {cache.window} tokens, but the "
                                 f"layer attends to {needs}: use layer.new_cache()")
        B, T_new, _ = x.shape
        Q = self._split(self.W_query(x), self.num_heads)  # (B, num_heads, T_new, head_dim)
        k = self._split(self.W_key(x), self.num_kv_heads)  # (B, num_kv_heads, T_new, head_dim)
        v = self._split(self.W_value(x), self.num_kv_heads)
        if cache is None:
            K, V, k_pos = k, v, torch.arange(T_new)
            q_pos = k_pos
        else:
            q_pos = torch.arange(cache.seen, cache.seen + T_new)
            K, V, k_pos = cache.update(k, v)
        mask = positions_mask(q_pos, k_pos, self.window).to(x.device)  # (T_new, T_k)
        context, weights = gqa_attention(Q, K, V, mask)  # (B, num_heads, T_new, head_dim)
        context = context.transpose(1, 2).reshape(B, T_new, self.d_out)
        out = self.out_proj(context)
        return (out, weights) if return_weights else out

    @classmethod
    @torch.no_grad()
    def from_multi_head(cls, mha: MultiHeadAttention, num_kv_heads: int,
                        window: int | None = None) -> GroupedQueryAttention:
        """Convert a ``shared.modules.MultiHeadAttention`` (causal) into grouped-query attention:
        the query and output projections are copied; each group of ``num_heads // num_kv_heads``
        neighbouring key (and value) heads is replaced by their mean (Ainslie et al., 2023).
        ``num_kv_heads == mha.num_heads`` reproduces ``mha`` exactly."""
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"expected a shared.modules.MultiHeadAttention; got "
                            f"{type(mha).__name__}")
        if not mha.causal:
            raise ValueError("GroupedQueryAttention is causal; this MultiHeadAttention has "
                             "causal=False")
        qkv_bias = mha.W_query.bias is not None
        gqa = cls(mha.d_in, mha.d_out, mha.num_heads, num_kv_heads, window, qkv_bias)
        gqa.to(device=mha.W_query.weight.device, dtype=mha.W_query.weight.dtype)
        groups = mha.num_heads // num_kv_heads
        gqa.W_query.load_state_dict(mha.W_query.state_dict())
        gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
        for new, old in ((gqa.W_key, mha.W_key), (gqa.W_value, mha.W_value)):
            # nn.Linear weight (d_out, d_in): head h owns rows h*head_dim:(h+1)*head_dim
            W = old.weight.view(num_kv_heads, groups, mha.head_dim, mha.d_in)
            new.weight.copy_(W.mean(dim=1).reshape(-1, mha.d_in))
            if qkv_bias:
                new.bias.copy_(old.bias.view(num_kv_heads, groups, mha.head_dim).mean(dim=1)
                               .reshape(-1))
        return gqa


# --------------------------------------------------------------------------------------------
# How big is the cache?
# --------------------------------------------------------------------------------------------
def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, T: int,
                   batch_size: int = 1, dtype: torch.dtype = torch.float16,
                   window: int | None = None) -> int:
    """Bytes of keys and values cached for ``T`` tokens:
    ``2 * num_layers * batch_size * num_kv_heads * min(T, window) * head_dim * bytes_per_element``
    (2: one key and one value vector per token, head and layer; ``window=None``: every token)."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("T", T), ("batch_size", batch_size)):
        _check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16; got {dtype!r}")
    tokens = T if window is None else min(T, _check_positive_int("window", window))
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * batch_size * num_kv_heads * tokens * head_dim * bytes_per_element
