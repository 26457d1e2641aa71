"""Attention in PyTorch: the functional core and the modules notebooks 02-05 build and import.

Shapes follow the course's conventions: ``(..., T, d)`` tensors, boolean masks with True = may
attend, ``Q = X @ W_q``.

The modules, in the order the notebooks teach them:

* ``SelfAttentionV1``: raw ``nn.Parameter`` matrices ``W_query``, ``W_key``, ``W_value`` of shape
  ``(d_in, d_out)``, so ``Q = x @ W_query`` is the math letter for letter;
* ``SelfAttentionV2``: the same with ``nn.Linear`` layers. ``nn.Linear`` stores its weight as
  ``(d_out, d_in)`` and computes ``x @ weight.T``, so V2's ``W_query.weight.T`` is V1's ``W_query``;
* ``CausalAttention``: batched ``(B, T, d_in)``, a causal mask kept as a buffer, dropout on the
  attention weights;
* ``MultiHeadAttentionWrapper``: a list of ``CausalAttention`` heads, outputs concatenated;
* ``MultiHeadAttention``: one weight matrix per Q/K/V split into heads with ``view``/``transpose``,
  then an output projection ``out_proj``. It can load its weights from, and export them to,
  ``torch.nn.MultiheadAttention``.

Every module's ``forward(..., return_weights=False)`` returns the output, or ``(output, weights)``
when asked, for heatmaps. All of them compute attention with ``naive_attention`` /
``attention_weights`` below, so the softmax and masking logic lives in one place.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "naive_attention",
    "attention_weights",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
]


# --------------------------------------------------------------------------------------------
# The functional core
# --------------------------------------------------------------------------------------------
def _allowed_keys(scores: torch.Tensor, causal: bool, mask: torch.Tensor | None):
    """The boolean ``(..., T_q, T_k)`` may-attend mask for ``scores`` (None: every key)."""
    allowed = mask
    if causal:
        T_q, T_k = scores.shape[-2:]
        tri = torch.ones(T_q, T_k, dtype=torch.bool, device=scores.device).tril()
        allowed = tri if allowed is None else allowed & tri
    return allowed


def attention_weights(Q: torch.Tensor, K: torch.Tensor, causal: bool = False,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(d_k))`` with masked scores set to ``-inf`` before the softmax.

    Shapes:
        Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``; mask boolean, broadcastable to
        ``(..., T_q, T_k)``, True = may attend; ``causal`` aligns top-left like
        ``F.scaled_dot_product_attention(is_causal=True)``.

    Returns:
        weights ``(..., T_q, T_k)``; each row sums to 1, except a query that may attend to
        nothing, whose row is all zeros (not NaN). The guard is row-wise, as in SDPA: only rows
        with no allowed key are zeroed, so a NaN from the inputs stays visible.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k)
    allowed = _allowed_keys(scores, causal, mask)
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.where(allowed.any(dim=-1, keepdim=True), weights, 0.0)  # empty rows: 0, not NaN


def naive_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False,
                    mask: torch.Tensor | None = None):
    """Attention the textbook way, one unfused step at a time, materialising every score.

    The chain notebook 05 measures: ``Q K^T``, the scale, the mask, the softmax, the blunt
    guard ``nan_to_num(0.0)`` (one more pass over the scores; it zeroes empty rows but would also
    hide a NaN from the inputs, see notebook 03), then ``weights @ V``.

    Shapes:
        Q ``(..., T_q, d_k)``, K ``(..., T_k, d_k)``, V ``(..., T_k, d_v)``; mask boolean,
        broadcastable to ``(..., T_q, T_k)``, True = may attend; ``causal`` aligns top-left
        like ``F.scaled_dot_product_attention(is_causal=True)``.

    Returns:
        ``(output, weights)``: ``(..., T_q, d_v)`` and ``(..., T_q, T_k)``. A query that may
        attend to nothing gets zero weights and a zero output.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k)
    allowed = _allowed_keys(scores, causal, mask)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ V, weights


# --------------------------------------------------------------------------------------------
# Input checking: one place, so every module fails the same clear way.
# --------------------------------------------------------------------------------------------
def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return value


def _check_dropout(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1); got {p!r}")
    return float(p)


def _check_x(name: str, x, d_in: int, context_length: int | None = None,
             batched: bool = True) -> None:
    """Raise a clear TypeError/ValueError unless ``x`` is a float tensor ``(B, T, d_in)``
    (``batched``) or ``(..., T, d_in)`` with ``T <= context_length``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (e.g. torch.float32); got dtype {x.dtype}"
        )
    shape = tuple(x.shape)
    if batched and x.ndim != 3:
        hint = " (add a batch dimension with x.unsqueeze(0))" if x.ndim == 2 else ""
        raise ValueError(
            f"{name} must be 3-D (B, T, d_in) with d_in = {d_in}; got shape {shape} "
            f"({x.ndim}-D){hint}"
        )
    if x.ndim < 2:
        raise ValueError(
            f"{name} must be (T, d_in) or (B, T, d_in) with d_in = {d_in}; got shape {shape}"
        )
    if x.shape[-1] != d_in:
        raise ValueError(
            f"{name}'s last dimension must be d_in = {d_in}; got shape {shape} "
            f"(last dimension {x.shape[-1]})"
        )
    if context_length is not None and x.shape[-2] > context_length:
        raise ValueError(
            f"{name} has T = {x.shape[-2]} tokens (shape {shape}) but context_length = "
            f"{context_length}: the causal mask buffer only covers {context_length} positions"
        )


def _check_mask(mask, shape: tuple, device: torch.device) -> None:
    """Raise a clear TypeError/ValueError unless ``mask`` is a boolean tensor on ``device``,
    either 4-D broadcastable to ``shape`` = ``(B, num_heads, T_q, T_k)`` or 2-D ``(T_q, T_k)``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor (True = may attend); got "
                        f"{type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend); got dtype {mask.dtype} "
                        "(convert a 0/1 mask with mask.bool())")
    ok = mask.ndim in (2, 4) and all(
        m in (1, n) for m, n in zip(mask.shape[::-1], shape[::-1], strict=False))
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, num_heads, T_q, T_k) = "
            f"{shape}; it must be 4-D (or 2-D (T_q, T_k)): a key-padding mask (B, T_k) goes in "
            "as mask[:, None, None, :]")
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but x is on {device}; move it with "
                         ".to(x.device)")


def _causal_buffer(context_length: int) -> torch.Tensor:
    """``(context_length, context_length)`` boolean lower triangle: True = may attend."""
    return torch.ones(context_length, context_length, dtype=torch.bool).tril()


def _drop_saved_causal_mask(module: nn.Module, state_dict: dict, prefix: str,
                            error_msgs: list) -> None:
    """Before ``load_state_dict``: remove a ``mask`` entry (the causal mask is derived state,
    rebuilt in ``__init__``, not saved) if it is a causal mask in either convention: the course's
    (bool lower triangle, True = may attend) or the textbook's (Raschka ch. 3: ``torch.triu(ones,
    diagonal=1)``, 1 = blocked). Anything else is reported as a load error, never loaded."""
    key = prefix + "mask"
    if key not in state_dict:
        return
    saved = state_dict.pop(key)
    n = saved.shape[-1] if saved.ndim == 2 and saved.shape[0] == saved.shape[1] else None
    if n is not None:
        tri = torch.ones(n, n, dtype=torch.bool, device=saved.device).tril()
        if saved.dtype == torch.bool and torch.equal(saved, tri):
            return  # the course's own convention
        if torch.equal(saved.to(torch.float64), (~tri).to(torch.float64)):
            return  # the textbook's convention: 1 = blocked above the diagonal
    error_msgs.append(
        f"{type(module).__name__} builds its own causal mask and does not load one; the "
        f"state_dict entry {key!r} (shape {tuple(saved.shape)}, dtype {saved.dtype}) is not a "
        "causal mask in either convention (True = may attend on and below the diagonal, or "
        "1 = blocked above it as in torch.triu(ones, diagonal=1)), so loading it would change "
        "what the module attends to: drop it from the state_dict or fix it")


class _CausalMaskModule(nn.Module):
    """A module with a causal ``mask`` buffer. The mask is derived state: rebuilt in ``__init__``
    and kept out of the state_dict (``persistent=False``, as GPT-2's implementations do); a
    checkpoint that carries one (the textbook's, 1 = blocked) is checked and dropped on load."""

    def _register_causal_mask(self, context_length: int) -> None:
        self.register_buffer("mask", _causal_buffer(context_length), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        _drop_saved_causal_mask(self, state_dict, prefix, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


# --------------------------------------------------------------------------------------------
# Single-head self-attention: v1 (raw parameters) and v2 (nn.Linear)
# --------------------------------------------------------------------------------------------
class SelfAttentionV1(nn.Module):
    """Self-attention with raw ``(d_in, d_out)`` matrices ``W_query``, ``W_key``, ``W_value``.

    Initialised uniformly in [0, 1) (``torch.rand``) like the textbook version; seed with
    ``torch.manual_seed`` for reproducible weights.
    """

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """Shapes: x ``(T, d_in)`` or ``(B, T, d_in)``.

        Returns ``context`` ``(..., T, d_out)``, or ``(context, weights)`` with weights
        ``(..., T, T)`` when ``return_weights``.
        """
        _check_x("x", x, self.d_in, batched=False)
        Q = x @ self.W_query  # (..., T, d_out)
        K = x @ self.W_key  # (..., T, d_out)
        V = x @ self.W_value  # (..., T, d_out)
        context, weights = naive_attention(Q, K, V)  # (..., T, d_out), (..., T, T)
        return (context, weights) if return_weights else context


class SelfAttentionV2(nn.Module):
    """Self-attention with ``nn.Linear`` projections (better initialisation, optional bias).

    ``W_query.weight`` has shape ``(d_out, d_in)``: the math's ``W_q`` is ``W_query.weight.T``.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """Shapes: x ``(T, d_in)`` or ``(B, T, d_in)``.

        Returns ``context`` ``(..., T, d_out)``, or ``(context, weights)`` with weights
        ``(..., T, T)`` when ``return_weights``.
        """
        _check_x("x", x, self.d_in, batched=False)
        Q = self.W_query(x)  # (..., T, d_out) = x @ W_query.weight.T (+ bias)
        K = self.W_key(x)
        V = self.W_value(x)
        context, weights = naive_attention(Q, K, V)
        return (context, weights) if return_weights else context


# --------------------------------------------------------------------------------------------
# Causal attention: batched, mask as a buffer, dropout on the weights
# --------------------------------------------------------------------------------------------
class CausalAttention(_CausalMaskModule):
    """Batched causal self-attention, one head.

    The mask ``(context_length, context_length)`` (True = may attend) is a registered buffer:
    it moves with ``.to(device)`` and is not trained. It is derived state, so it stays out of
    the ``state_dict`` (``persistent=False``); loading a ``state_dict`` that carries a causal
    ``mask`` (this course's or the textbook's 1 = blocked) drops it, any other ``mask`` fails. A
    forward pass on ``T <= context_length`` tokens uses its top-left ``(T, T)`` corner.
    Dropout is applied to the attention weights (only in ``train()`` mode).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float = 0.0,
                 qkv_bias: bool = False):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.context_length = _check_positive_int("context_length", context_length)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(_check_dropout(dropout))
        self._register_causal_mask(context_length)

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """Shapes: x ``(B, T, d_in)`` with ``T <= context_length``.

        Returns ``context`` ``(B, T, d_out)``, or ``(context, weights)`` with weights
        ``(B, T, T)`` (after dropout: the weights that multiplied V) when ``return_weights``.
        """
        _check_x("x", x, self.d_in, self.context_length)
        T = x.shape[1]
        Q = self.W_query(x)  # (B, T, d_out)
        K = self.W_key(x)
        V = self.W_value(x)
        weights = attention_weights(Q, K, mask=self.mask[:T, :T])  # (B, T, T)
        weights = self.dropout(weights)
        context = weights @ V  # (B, T, d_out)
        return (context, weights) if return_weights else context


# --------------------------------------------------------------------------------------------
# Multi-head attention: a wrapper of heads, then one split weight matrix
# --------------------------------------------------------------------------------------------
class MultiHeadAttentionWrapper(nn.Module):
    """``num_heads`` independent ``CausalAttention`` heads, run one after the other and
    concatenated: the output has ``num_heads * d_out`` features (``d_out`` is per head).
    There is no output projection (``MultiHeadAttention`` adds one)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 num_heads: int, qkv_bias: bool = False):
        super().__init__()
        self.num_heads = _check_positive_int("num_heads", num_heads)
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
            for _ in range(num_heads)
        )

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """Shapes: x ``(B, T, d_in)``.

        Returns ``context`` ``(B, T, num_heads * d_out)`` (head h in columns
        ``h*d_out:(h+1)*d_out``), or ``(context, weights)`` with weights
        ``(B, num_heads, T, T)`` when ``return_weights``.
        """
        outputs = [head(x, return_weights=True) for head in self.heads]
        context = torch.cat([c for c, _ in outputs], dim=-1)  # (B, T, H * d_out)
        weights = torch.stack([w for _, w in outputs], dim=1)  # (B, H, T, T)
        return (context, weights) if return_weights else context


class MultiHeadAttention(_CausalMaskModule):
    """Multi-head attention with one ``(d_in -> d_out)`` projection per Q/K/V, split into
    ``num_heads`` heads of ``head_dim = d_out // num_heads`` features, and an output projection
    ``out_proj`` ``(d_out -> d_out)``.

    Head ``h`` owns the output features ``h*head_dim:(h+1)*head_dim`` of each projection, i.e.
    rows of ``W_query.weight`` (columns of the math's ``W_q = W_query.weight.T``).

    ``causal=True`` (default, GPT-style) masks the future with a buffer of size
    ``context_length``; ``causal=False`` lets every query see every key (encoder-style).
    ``forward(x, x_kv)`` does cross-attention: queries from ``x``, keys and values from ``x_kv``.
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 num_heads: int, qkv_bias: bool = False, causal: bool = True):
        super().__init__()
        self.d_in = _check_positive_int("d_in", d_in)
        self.d_out = _check_positive_int("d_out", d_out)
        self.context_length = _check_positive_int("context_length", context_length)
        self.num_heads = _check_positive_int("num_heads", num_heads)
        if d_out % num_heads:
            raise ValueError(
                f"d_out must be divisible by num_heads; got d_out = {d_out}, num_heads = "
                f"{num_heads} (d_out % num_heads = {d_out % num_heads})"
            )
        self.head_dim = d_out // num_heads
        self.causal = bool(causal)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # combines the heads
        self.dropout = nn.Dropout(_check_dropout(dropout))
        self._register_causal_mask(context_length)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_out)`` -> ``(B, num_heads, T, head_dim)``."""
        B, T, _ = t.shape
        return t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, x_kv: torch.Tensor | None = None,
                return_weights: bool = False, mask: torch.Tensor | None = None):
        """Shapes: x ``(B, T_q, d_in)``; x_kv ``(B, T_k, d_in)`` (default: ``x``, self-attention).

        ``mask`` (optional): boolean, True = may attend, either 4-D broadcastable to
        ``(B, num_heads, T_q, T_k)`` or 2-D ``(T_q, T_k)``. A key-padding mask ``(B, T_k)``
        (True = a real token) goes in as ``mask[:, None, None, :]``. With ``causal=True`` a key
        must be allowed by both masks; a query allowed no key gets zero weights and output
        ``out_proj.bias``.

        Returns ``out`` ``(B, T_q, d_out)``, or ``(out, weights)`` with weights
        ``(B, num_heads, T_q, T_k)`` (after dropout) when ``return_weights``.
        """
        _check_x("x", x, self.d_in, self.context_length)
        if x_kv is None:
            x_kv = x
        else:
            _check_x("x_kv", x_kv, self.d_in, self.context_length)
            if x_kv.shape[0] != x.shape[0]:
                raise ValueError(
                    f"x and x_kv must have the same batch size B; got x {tuple(x.shape)} and "
                    f"x_kv {tuple(x_kv.shape)}"
                )
        B, T_q, _ = x.shape
        T_k = x_kv.shape[1]
        Q = self._split_heads(self.W_query(x))  # (B, T_q, d_out) -> (B, H, T_q, head_dim)
        K = self._split_heads(self.W_key(x_kv))  # (B, H, T_k, head_dim)
        V = self._split_heads(self.W_value(x_kv))  # (B, H, T_k, head_dim)
        allowed = self.mask[:T_q, :T_k] if self.causal else None
        if mask is not None:
            _check_mask(mask, (B, self.num_heads, T_q, T_k), x.device)
            allowed = mask if allowed is None else allowed & mask
        weights = attention_weights(Q, K, mask=allowed)  # (B, H, T_q, T_k)
        weights = self.dropout(weights)
        context = weights @ V  # (B, H, T_q, head_dim)
        # (B, H, T_q, head_dim) -> (B, T_q, H, head_dim) -> (B, T_q, d_out): heads side by side
        context = context.transpose(1, 2).contiguous().view(B, T_q, self.d_out)
        out = self.out_proj(context)  # (B, T_q, d_out)
        return (out, weights) if return_weights else out

    # ---- interoperability with torch.nn.MultiheadAttention ---------------------------------
    # nn.MultiheadAttention(embed_dim, num_heads) keeps the three input projections stacked in
    # one ``in_proj_weight`` of shape (3 * embed_dim, embed_dim) = [W_query.weight;
    # W_key.weight; W_value.weight], each block in nn.Linear's (out, in) layout, i.e. the
    # transpose of the math's (d_in, d_out) W_q. ``in_proj_bias`` (3 * embed_dim,) stacks the
    # biases the same way; ``out_proj`` is an nn.Linear(embed_dim, embed_dim) like ours. Its
    # heads split the features the same way (head h owns h*head_dim:(h+1)*head_dim).

    def _check_torch_compatible(self, mha: nn.MultiheadAttention) -> None:
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected a torch.nn.MultiheadAttention; got {type(mha).__name__}")
        if self.d_in != self.d_out:
            raise ValueError(
                "nn.MultiheadAttention needs d_in == d_out (its embed_dim); this module has "
                f"d_in = {self.d_in}, d_out = {self.d_out}"
            )
        if (mha.embed_dim, mha.num_heads) != (self.d_out, self.num_heads):
            raise ValueError(
                f"shape mismatch: nn.MultiheadAttention has embed_dim = {mha.embed_dim}, "
                f"num_heads = {mha.num_heads}; this module has d_out = {self.d_out}, "
                f"num_heads = {self.num_heads}"
            )
        if not mha._qkv_same_embed_dim or mha.bias_k is not None:
            raise ValueError(
                "only nn.MultiheadAttention without kdim/vdim/add_bias_kv is supported"
            )

    @torch.no_grad()
    def load_from_torch(self, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of ``mha`` (a ``torch.nn.MultiheadAttention`` with ``embed_dim ==
        d_in == d_out`` and the same ``num_heads``) into this module; return ``self``.

        ``in_proj_weight`` ``(3d, d)`` is cut into three ``(d, d)`` blocks that become
        ``W_query.weight``, ``W_key.weight``, ``W_value.weight`` (same ``(out, in)`` layout).
        """
        self._check_torch_compatible(mha)
        W_q, W_k, W_v = mha.in_proj_weight.chunk(3, dim=0)  # each (d_out, d_in)
        has_bias = mha.in_proj_bias is not None
        if has_bias and self.W_query.bias is None and mha.in_proj_bias.abs().max() > 0:
            raise ValueError(
                "nn.MultiheadAttention has non-zero in_proj_bias but this module was built with "
                "qkv_bias=False; rebuild it with qkv_bias=True"
            )
        for lin, W, b in zip(
            (self.W_query, self.W_key, self.W_value),
            (W_q, W_k, W_v),
            mha.in_proj_bias.chunk(3) if has_bias else (None,) * 3,
            strict=True,
        ):
            lin.weight.copy_(W)
            if lin.bias is not None:
                lin.bias.copy_(b if b is not None else torch.zeros_like(lin.bias))
        self.out_proj.weight.copy_(mha.out_proj.weight)
        if mha.out_proj.bias is not None:
            self.out_proj.bias.copy_(mha.out_proj.bias)
        else:
            self.out_proj.bias.zero_()
        return self

    @torch.no_grad()
    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(d_out, num_heads, batch_first=True)`` with this
        module's weights and dropout (``W_query/W_key/W_value.weight`` stacked into
        ``in_proj_weight``; zero ``in_proj_bias`` when ``qkv_bias=False``). Pass it
        ``attn_mask=...`` and ``is_causal=True`` for the causal version: its boolean masks mean
        True = *may not* attend, the opposite of the course's convention."""
        if self.d_in != self.d_out:
            raise ValueError(
                "nn.MultiheadAttention needs d_in == d_out (its embed_dim); this module has "
                f"d_in = {self.d_in}, d_out = {self.d_out}"
            )
        ref = self.W_query.weight
        mha = nn.MultiheadAttention(
            self.d_out, self.num_heads, dropout=self.dropout.p, bias=True, batch_first=True,
            device=ref.device, dtype=ref.dtype,
        )
        lins = (self.W_query, self.W_key, self.W_value)
        mha.in_proj_weight.copy_(torch.cat([lin.weight for lin in lins], dim=0))  # (3d, d)
        mha.in_proj_bias.copy_(torch.cat([
            lin.bias if lin.bias is not None else torch.zeros(self.d_out, device=ref.device,
                                                                dtype=ref.dtype)
            for lin in lins
        ]))
        mha.out_proj.weight.copy_(self.out_proj.weight)
        mha.out_proj.bias.copy_(self.out_proj.bias)
        mha.train(self.training)
        return mha


# --------------------------------------------------------------------------------------------
# One fused Q/K/V projection and PyTorch's SDPA: the GPT-2 / nanoGPT form (notebook 04)
# --------------------------------------------------------------------------------------------
class FusedQKVAttention(nn.Module):
    """Multi-head self-attention as GPT-2 and nanoGPT write it: one projection ``c_attn``
    ``(d_in -> 3 * d_out)`` makes Q, K and V side by side, ``F.scaled_dot_product_attention`` runs
    every head at once, and ``c_proj`` ``(d_out -> d_out)`` mixes the heads.

    ``c_attn.weight`` ``(3 * d_out, d_in)`` stacks ``MultiHeadAttention``'s ``W_query.weight``,
    ``W_key.weight`` and ``W_value.weight`` (rows ``0:d_out``, ``d_out:2 d_out``,
    ``2 d_out:3 d_out``), the layout of ``nn.MultiheadAttention.in_proj_weight``; head ``h`` owns
    features ``h*head_dim:(h+1)*head_dim`` of each third. GPT-2's checkpoints (Hugging Face's
    ``GPT2Attention``, keys ``h.{layer}.attn.*``) keep both layers as ``Conv1D``, whose weight is
    stored ``(in, out)``, the transpose of ``nn.Linear``'s:

    ==================  ===========  ========================
    GPT-2 key           shape        here
    ==================  ===========  ========================
    ``c_attn.weight``   (d, 3d)      ``c_attn.weight.T``
    ``c_attn.bias``     (3d,)        ``c_attn.bias``
    ``c_proj.weight``   (d, d)       ``c_proj.weight.T``
    ``c_proj.bias``     (d,)         ``c_proj.bias``
    ==================  ===========  ========================

    ``causal=True`` (GPT-style) lets query ``i`` see keys ``j <= i``; ``forward(x, mask=...)``
    adds a boolean mask, True = may attend (SDPA's convention and the course's). Dropout acts on
    the attention weights in ``train()`` mode, as SDPA's ``dropout_p``. SDPA does not return the
    weights: use ``MultiHeadAttention`` to look at them.
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, dropout: float = 0.0,
                 qkv_bias: bool = True, causal: bool = True):
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
        self.causal = bool(causal)
        self.dropout = _check_dropout(dropout)
        self.c_attn = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)  # [W_q; W_k; W_v] in one
        self.c_proj = nn.Linear(d_out, d_out)  # the output projection W_o

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: x ``(B, T, d_in)``; mask boolean, broadcastable to ``(B, num_heads, T, T)``,
        True = may attend (combined with the causal mask by AND).

        Returns ``(B, T, d_out)``. A query that may attend to nothing gets a zero context vector
        (so its output is ``c_proj``'s bias)."""
        _check_x("x", x, self.d_in)
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.d_out, dim=-1)  # 3 x (B, T, d_out)
        q, k, v = (t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))  # (B, H, T, head_dim)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                got = f"dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else \
                    type(mask).__name__
                raise TypeError(f"mask must be a boolean tensor (True = may attend); got {got}")
            if self.causal:
                mask = mask & _causal_buffer(T).to(mask.device)
        context = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal and mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )  # (B, H, T, head_dim)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # heads side by side
        return self.c_proj(context)

    @torch.no_grad()
    def load_from(self, other: nn.Module) -> FusedQKVAttention:
        """Copy the weights of a ``MultiHeadAttention`` (``W_query``, ``W_key``, ``W_value``
        stacked into ``c_attn``, ``out_proj`` into ``c_proj``) or of a
        ``torch.nn.MultiheadAttention`` (``in_proj_*`` is ``c_attn``'s layout already) with the
        same sizes and heads; return ``self``."""
        if isinstance(other, MultiHeadAttention):
            sizes = (other.d_in, other.d_out, other.num_heads)
            lins = (other.W_query, other.W_key, other.W_value)
            weight = torch.cat([lin.weight for lin in lins], dim=0)  # (3 d_out, d_in)
            bias = None if other.W_query.bias is None else \
                torch.cat([lin.bias for lin in lins])
            out = other.out_proj
        elif isinstance(other, nn.MultiheadAttention):
            if not other._qkv_same_embed_dim or other.bias_k is not None:
                raise ValueError("only nn.MultiheadAttention without kdim/vdim/add_bias_kv is "
                                 "supported")
            sizes = (other.embed_dim, other.embed_dim, other.num_heads)
            weight, bias, out = other.in_proj_weight, other.in_proj_bias, other.out_proj
        else:
            raise TypeError("expected a MultiHeadAttention or a torch.nn.MultiheadAttention; got "
                            f"{type(other).__name__}")
        if sizes != (self.d_in, self.d_out, self.num_heads):
            raise ValueError(
                f"shape mismatch: the source has (d_in, d_out, num_heads) = {sizes}; this module "
                f"has {(self.d_in, self.d_out, self.num_heads)}"
            )
        self.c_attn.weight.copy_(weight)
        if self.c_attn.bias is not None:
            self.c_attn.bias.copy_(bias if bias is not None else torch.zeros_like(self.c_attn.bias))
        elif bias is not None and bias.abs().max() > 0:
            raise ValueError("the source has non-zero Q/K/V biases but this module was built with "
                             "qkv_bias=False; rebuild it with qkv_bias=True")
        self.c_proj.weight.copy_(out.weight)
        if out.bias is not None:
            self.c_proj.bias.copy_(out.bias)
        else:
            self.c_proj.bias.zero_()
        return self

    @torch.no_grad()
    def gpt2_state_dict(self) -> dict[str, torch.Tensor]:
        """This module's weights under GPT-2's names and ``Conv1D`` layout (``(in, out)``
        weights): ``c_attn.weight`` ``(d_in, 3 d_out)``, ``c_attn.bias``, ``c_proj.weight``
        ``(d_out, d_out)``, ``c_proj.bias``. Needs ``qkv_bias=True``, as GPT-2 has."""
        if self.c_attn.bias is None:
            raise ValueError("GPT-2's c_attn has a bias; build this module with qkv_bias=True")
        return {
            "c_attn.weight": self.c_attn.weight.T.clone(),
            "c_attn.bias": self.c_attn.bias.clone(),
            "c_proj.weight": self.c_proj.weight.T.clone(),
            "c_proj.bias": self.c_proj.bias.clone(),
        }

    @torch.no_grad()
    def load_gpt2_state_dict(self, state: dict[str, torch.Tensor]) -> FusedQKVAttention:
        """Load GPT-2-named ``Conv1D`` weights (see :meth:`gpt2_state_dict`; e.g. the entries of
        a GPT-2 checkpoint under ``h.{layer}.attn.``), transposing them; return ``self``."""
        expected = {"c_attn.weight": (self.d_in, 3 * self.d_out), "c_attn.bias": (3 * self.d_out,),
                    "c_proj.weight": (self.d_out, self.d_out), "c_proj.bias": (self.d_out,)}
        for key, shape in expected.items():
            if key not in state:
                raise KeyError(f"missing {key!r}; expected the keys {sorted(expected)}")
            if tuple(state[key].shape) != shape:
                raise ValueError(f"{key} must have shape {shape} (GPT-2's Conv1D layout, "
                                 f"(in, out)); got {tuple(state[key].shape)}")
        if self.c_attn.bias is None:
            raise ValueError("GPT-2's c_attn has a bias; build this module with qkv_bias=True")
        self.c_attn.weight.copy_(state["c_attn.weight"].T)
        self.c_attn.bias.copy_(state["c_attn.bias"])
        self.c_proj.weight.copy_(state["c_proj.weight"].T)
        self.c_proj.bias.copy_(state["c_proj.bias"])
        return self


__all__ += ["FusedQKVAttention"]  # appended with the class, at the end of the file
