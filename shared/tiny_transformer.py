"""A tiny attention-only transformer, a task that makes it learn to look back, and the tools to
look inside it (notebook 06).

**The task.** A sequence starts with ``BOS`` (token 0), then repeats a random segment of
``period`` distinct tokens until the context is full: ``BOS a x k d a x k d a x ...``. The first
occurrence of each token cannot be predicted; every later token can, but only by looking back:
find where the current token occurred before and copy the token that followed it there.

**The model.** Token + learned position embeddings, then ``num_layers`` residual attention layers
(``shared.modules.MultiHeadAttention``, causal), then a linear unembedding to logits. No MLPs and
no LayerNorm: everything it computes, it computes with attention.

**Looking inside.** Two layers can solve the task with an *induction circuit*: a layer-0
*previous-token* head (query ``i`` attends to key ``i - 1``) writes each token's predecessor into
its position, and a layer-1 *induction* head (query ``i`` attends to key ``k`` whose predecessor
``k - 1`` is the current token) copies the token found there. ``previous_token_score`` and
``induction_score`` measure those two patterns from the attention weights; ``ablate_heads`` zeroes
heads to test which ones the model needs.

Shapes follow the course: tokens ``(B, T)`` of integer ids; attention weights ``(B, num_layers,
num_heads, T, T)``, queries down, keys across; boolean masks with True = "this key counts".
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .modules import MultiHeadAttention
from .positional import alibi_bias, apply_rope

__all__ = [
    "BOS",
    "token_labels",
    "repeated_tokens",
    "seen_before",
    "previous_token_mask",
    "induction_mask",
    "attention_score",
    "previous_token_score",
    "induction_score",
    "TinyTransformer",
    "next_token_losses",
    "evaluate",
    "ablate_heads",
    "head_contexts",
    "run_layers",
    "adam_step",
    "train",
    "phase_change_step",
    "steepest_drop_step",
    "best_possible_losses",
    "ov_circuit",
    "copying_score",
    "POSITIONAL",
]

BOS = 0  # the token every sequence starts with
POSITIONAL = ("learned", "rope", "alibi", "none")  # where TinyTransformer puts position
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# --------------------------------------------------------------------------------------------
# Input checking
# --------------------------------------------------------------------------------------------
def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return value


def _check_tokens(name: str, tokens, min_ndim: int = 1) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids; got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long); got dtype "
                        f"{tokens.dtype}")
    if tokens.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s) (..., T); got shape "
                         f"{tuple(tokens.shape)}")
    return tokens


def _check_weights(weights) -> torch.Tensor:
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor; got {type(weights).__name__}")
    if not weights.is_floating_point():
        raise TypeError(f"weights must be a floating-point tensor; got dtype {weights.dtype}")
    if weights.ndim < 2 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (..., T, T) (queries x keys); got shape "
                         f"{tuple(weights.shape)}")
    return weights


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------
def token_labels(tokens, vocab: str = LETTERS) -> list[str]:
    """Labels for plots: ``BOS`` for token 0, then ``vocab[id - 1]`` (letters by default), or the
    id itself beyond the vocabulary. Shapes: tokens ``(T,)`` -> ``T`` strings."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    if ids and isinstance(ids[0], list):
        raise ValueError(f"token_labels takes one sequence (T,); got a batch of {len(ids)}")
    return ["BOS" if t == BOS else vocab[t - 1] if t - 1 < len(vocab) else str(t) for t in ids]


def repeated_tokens(batch_size: int, T: int, vocab_size: int, min_period: int,
                    max_period: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Sequences that repeat a random segment: ``BOS`` then ``period`` distinct tokens drawn from
    ``1 .. vocab_size - 1``, repeated until ``T`` tokens are filled.

    Each row draws its own ``period`` uniformly from ``min_period .. max_period`` (default: always
    ``min_period``), so the distance to the previous occurrence varies and counting positions
    alone cannot solve the task. ``T = 2 * period + 1`` gives exactly "first half random, second
    half a copy".

    Returns ``tokens`` ``(batch_size, T)``, dtype ``torch.long``.
    """
    _check_int("batch_size", batch_size)
    _check_int("T", T, 3)
    _check_int("vocab_size", vocab_size, 3)
    _check_int("min_period", min_period, 2)
    max_period = min_period if max_period is None else _check_int("max_period", max_period, 2)
    if max_period < min_period:
        raise ValueError(f"max_period must be >= min_period; got min_period = {min_period}, "
                         f"max_period = {max_period}")
    if max_period > vocab_size - 1:
        raise ValueError(f"a period of {max_period} distinct tokens needs vocab_size >= "
                         f"{max_period + 1} (token 0 is BOS); got vocab_size = {vocab_size}")
    if max_period > T - 2:
        raise ValueError(f"max_period = {max_period} leaves no repeated token in T = {T} "
                         f"positions (BOS + one period); use max_period <= T - 2 = {T - 2}")
    periods = torch.randint(min_period, max_period + 1, (batch_size, 1), generator=generator)
    # a random order of the tokens 1..V-1 per row; its first `period` entries are the segment
    segment = torch.argsort(torch.rand(batch_size, vocab_size - 1, generator=generator), dim=1) + 1
    where = torch.arange(T - 1).unsqueeze(0) % periods  # (B, T - 1): index into the segment
    body = torch.gather(segment, 1, where)
    return torch.cat([torch.full((batch_size, 1), BOS, dtype=torch.long), body], dim=1)


def seen_before(tokens: torch.Tensor) -> torch.Tensor:
    """True where a token already occurred earlier in its sequence.

    Shapes: tokens ``(..., T)`` -> boolean ``(..., T)``. At such a position ``t`` an induction
    circuit can predict ``tokens[t + 1]``.
    """
    tokens = _check_tokens("tokens", tokens)
    T = tokens.shape[-1]
    same = tokens.unsqueeze(-1) == tokens.unsqueeze(-2)  # (..., T, T): [t, s] tokens equal
    earlier = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril(-1)  # s < t
    return (same & earlier).any(dim=-1)


# --------------------------------------------------------------------------------------------
# Head scores: how much attention lands where a pattern says it should
# --------------------------------------------------------------------------------------------
def previous_token_mask(T: int) -> torch.Tensor:
    """Boolean ``(T, T)``: True at ``[i, i - 1]``, the previous token of every query ``i >= 1``."""
    _check_int("T", T)
    i = torch.arange(T)
    return i.unsqueeze(1) - 1 == i.unsqueeze(0)  # [i, j]: j == i - 1


def induction_mask(tokens: torch.Tensor) -> torch.Tensor:
    """Boolean ``(..., T, T)``: ``[i, k]`` is True when key ``k`` follows an earlier occurrence of
    the query's token, i.e. ``1 <= k <= i`` and ``tokens[k - 1] == tokens[i]``.

    Shapes: tokens ``(..., T)`` -> ``(..., T, T)``. An induction head at query ``i`` attends to
    these keys and copies what it finds there: the token that came next last time.
    """
    tokens = _check_tokens("tokens", tokens)
    T = tokens.shape[-1]
    mask = torch.zeros(*tokens.shape, T, dtype=torch.bool, device=tokens.device)
    # [i, k] for k >= 1: compare tokens[i] with tokens[k - 1]
    mask[..., 1:] = tokens.unsqueeze(-1) == tokens[..., :-1].unsqueeze(-2)
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()  # k <= i
    return mask & causal


def attention_score(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean attention on the target keys, over the queries that have at least one target.

    Shapes: weights ``(..., T, T)`` (queries x keys, rows summing to 1); target boolean,
    broadcastable to ``weights``. Returns ``(...)``: 1.0 means every such query puts all its
    weight on its targets, and a head that ignores them scores about (number of targets) /
    (number of keys it can see).
    """
    weights = _check_weights(weights)
    if not isinstance(target, torch.Tensor) or target.dtype != torch.bool:
        raise TypeError("target must be a boolean tensor (True = a key the pattern points at); "
                        f"got {getattr(target, 'dtype', type(target).__name__)}")
    try:
        target = torch.broadcast_to(target, weights.shape)
    except RuntimeError:
        raise ValueError(f"target of shape {tuple(target.shape)} does not broadcast to the "
                         f"weights' shape {tuple(weights.shape)}") from None
    has = target.any(dim=-1)  # (..., T): queries with at least one target
    counts = has.sum(dim=-1)
    if (counts == 0).any():
        raise ValueError("some sequence has no query with a target key (e.g. no repeated token): "
                         "its score is undefined")
    mass = (weights * target).sum(dim=-1)  # (..., T): weight each query puts on its targets
    return (mass * has).sum(dim=-1) / counts


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean attention of query ``i`` on key ``i - 1``, over ``i = 1 .. T - 1`` (the offset
    diagonal). Shapes: weights ``(..., T, T)`` -> ``(...)``, e.g. ``(B, layers, heads)``."""
    weights = _check_weights(weights)
    return attention_score(weights, previous_token_mask(weights.shape[-1]).to(weights.device))


def induction_score(weights: torch.Tensor, tokens: torch.Tensor, *,
                    predicting_only: bool = False) -> torch.Tensor:
    """Mean attention on "the token after an earlier occurrence of the current token", over the
    queries whose token occurred before (see ``induction_mask``).

    With ``predicting_only=True`` the last query is left out: it predicts no token, so next-token
    training never shapes its attention.

    Shapes: weights ``(B, ..., T, T)`` with tokens ``(B, T)``, or weights ``(..., T, T)`` with
    tokens ``(T,)``. Returns ``weights.shape[:-2]``, e.g. ``(B, layers, heads)``.
    """
    weights = _check_weights(weights)
    tokens = _check_tokens("tokens", tokens)
    lead, T = tuple(tokens.shape[:-1]), tokens.shape[-1]
    if T != weights.shape[-1] or tuple(weights.shape[:len(lead)]) != lead:
        raise ValueError(f"tokens {tuple(tokens.shape)} do not match weights "
                         f"{tuple(weights.shape)}: expected tokens (B, T) with weights "
                         "(B, ..., T, T), or tokens (T,)")
    target = induction_mask(tokens)  # (*lead, T, T)
    if predicting_only:
        predicts = torch.arange(T, device=target.device) < T - 1  # (T,): every query but the last
        target = target & predicts.unsqueeze(-1)
    extra = weights.ndim - 2 - len(lead)  # e.g. layers, heads
    target = target.reshape(*lead, *([1] * extra), T, T)
    return attention_score(weights, target)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------
class TinyTransformer(nn.Module):
    """An attention-only transformer: embeddings, ``num_layers`` residual causal multi-head
    attention layers, an unembedding.

    ``x = tok_emb[tokens] + pos_emb[positions]``; for each layer ``x = x + layer(x)``;
    ``logits = unembed(x)``. Each layer is a ``shared.modules.MultiHeadAttention(d_model,
    d_model, context_length, 0.0, num_heads)``, so head ``h`` of a layer owns the features
    ``h*head_dim:(h+1)*head_dim`` of the concatenation that its ``out_proj`` maps back.

    ``positional`` says where position enters (notebook 07): ``"learned"`` (default) adds the
    learned table ``pos_emb`` to the input, which limits ``T`` to ``context_length``;
    ``"rope"`` rotates every head's queries and keys (``shared.positional.apply_rope``,
    half-split, at positions ``0 .. T-1`` divided by ``rope_scale`` with frequencies from
    ``rope_base``: attributes, 1 and 10,000 unless you set them; ``rope_scale > 1`` is position
    interpolation, a larger ``rope_base`` slows every pair but the first); ``"alibi"`` adds
    ``shared.positional.alibi_bias`` to the scores; ``"none"`` uses no position at all (only
    the causal mask). Those three have no position table (``pos_emb`` is None) and accept any
    ``T``.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int = 32,
                 num_heads: int = 2, num_layers: int = 2, positional: str = "learned"):
        super().__init__()
        if positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}; got {positional!r}")
        self.positional = positional
        self.rope_scale = 1.0  # RoPE only: positions are divided by it (position interpolation)
        self.rope_base = 10000.0  # RoPE only: theta_i = rope_base ** (-2i / head_dim)
        self.vocab_size = _check_int("vocab_size", vocab_size, 2)
        self.context_length = _check_int("context_length", context_length)
        self.d_model = _check_int("d_model", d_model)
        self.num_heads = _check_int("num_heads", num_heads)
        self.num_layers = _check_int("num_layers", num_layers)
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model) if positional == "learned" else None
        if positional == "rope" and (d_model // num_heads) % 2:
            raise ValueError(f"RoPE rotates pairs of features: head_dim = d_model // num_heads "
                             f"must be even; got {d_model} // {num_heads}")
        self.layers = nn.ModuleList(
            MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads)
            for _ in range(num_layers)
        )
        self.unembed = nn.Linear(d_model, vocab_size)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def forward(self, tokens: torch.Tensor, return_weights: bool = False):
        """Shapes: tokens ``(B, T)`` integer ids in ``0 .. vocab_size - 1``, ``T <=
        context_length``.

        Returns ``logits`` ``(B, T, vocab_size)`` (position ``t`` predicts token ``t + 1``), or
        ``(logits, weights)`` with weights ``(B, num_layers, num_heads, T, T)``.
        """
        tokens = _check_tokens("tokens", tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be 2-D (B, T); got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if T > self.context_length and self.positional == "learned":
            raise ValueError(f"tokens has T = {T} positions but context_length = "
                             f"{self.context_length}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in 0 .. {self.vocab_size - 1}; got "
                             f"{int(tokens.min())} .. {int(tokens.max())}")
        x = self.tok_emb(tokens)  # (B, T, d_model)
        if self.positional == "learned":
            x = x + self.pos_emb.weight[:T]
        all_weights = []
        for layer in self.layers:
            if self.positional == "learned":
                out, weights = layer(x, return_weights=True)  # (B, T, d), (B, H, T, T)
            else:
                out, weights = self._attend(layer, x)
            x = x + out  # the residual stream
            all_weights.append(weights)
        logits = self.unembed(x)  # (B, T, vocab_size)
        if return_weights:
            return logits, torch.stack(all_weights, dim=1)  # (B, layers, H, T, T)
        return logits


    def _attend(self, layer: MultiHeadAttention, x: torch.Tensor):
        """One attention layer with position inside attention (RoPE, ALiBi or none): the same
        projections as ``layer``'s own forward. Returns ``(out (B, T, d), weights (B, H, T,
        T))``."""
        B, T, _ = x.shape
        H, hd = self.num_heads, self.head_dim
        Q, K, V = (lin(x).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
                   for lin in (layer.W_query, layer.W_key, layer.W_value))
        if self.positional == "rope":
            positions = torch.arange(T)
            Q = apply_rope(Q, positions, base=self.rope_base, scale=self.rope_scale)
            K = apply_rope(K, positions, base=self.rope_base, scale=self.rope_scale)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(hd)  # (B, H, T, T)
        if self.positional == "alibi":
            scores = scores + alibi_bias(H, T, scores.dtype).to(scores.device)  # -inf above
        else:
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = (weights @ V).transpose(1, 2).reshape(B, T, H * hd)
        return layer.out_proj(context), weights


def next_token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (nats) of predicting ``tokens[:, t + 1]`` from position ``t``.

    Shapes: logits ``(B, T, V)``, tokens ``(B, T)`` -> ``(B, T - 1)``.
    """
    tokens = _check_tokens("tokens", tokens, 2)
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not "
                         "match: expected logits (B, T, V) with tokens (B, T)")
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")


@torch.no_grad()
def evaluate(model: TinyTransformer, tokens: torch.Tensor) -> dict:
    """Losses and accuracy on a batch, split by whether the *current* token was seen before.

    Shapes: tokens ``(B, T)``. Returns a dict of floats: ``repeat_loss`` and ``repeat_accuracy``
    (arg-max) over the predictions made at repeated tokens (predictable by looking back),
    ``first_loss`` over the others; plus ``per_position`` ``(T - 1,)``, the mean loss of
    predicting token ``t + 1``, and ``weights`` ``(B, layers, heads, T, T)``.
    """
    was_training = model.training
    model.eval()
    try:
        logits, weights = model(tokens, return_weights=True)
    finally:
        model.train(was_training)
    losses = next_token_losses(logits, tokens)  # (B, T - 1)
    repeat = seen_before(tokens)[:, :-1]  # (B, T - 1): predictions made at a repeated token
    correct = logits[:, :-1].argmax(dim=-1) == tokens[:, 1:]
    return {
        "repeat_loss": losses[repeat].mean().item(),
        "repeat_accuracy": correct[repeat].float().mean().item(),
        "first_loss": losses[~repeat].mean().item(),
        "per_position": losses.mean(dim=0),
        "weights": weights,
    }


def ablate_heads(model: TinyTransformer, heads, mean_over: torch.Tensor | None = None
                 ) -> TinyTransformer:
    """A copy of ``model`` in which the given heads contribute nothing (zero ablation), or, with
    ``mean_over``, only their average output (mean ablation).

    ``heads`` is an iterable of ``(layer, head)`` pairs. Head ``h``'s output enters the residual
    stream only through its slice of the output projection, ``concat[..., h*hd:(h+1)*hd] @
    W_o[h*hd:(h+1)*hd]`` (``hd = head_dim``), so zeroing the columns ``h*hd:(h+1)*hd`` of
    ``out_proj.weight`` (the rows of the math's ``W_o``) removes exactly that head. Its attention
    weights are unchanged; ``out_proj.bias`` is shared by all heads and stays. ``model`` itself is
    not modified.

    Mean ablation: with ``mean_over`` tokens ``(B, T)``, each listed head's context vector
    (its weighted sum of values, ``(head_dim,)``) is averaged over those sequences and positions in
    the *unablated* model, and that average's contribution ``mean @ W_o^(h)`` is added to
    ``out_proj.bias`` before the columns are zeroed: the head then writes the same constant
    vector at every position, the typical output it had on that data, instead of nothing.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer; got {type(model).__name__}")
    pairs = list(heads)
    for pair in pairs:
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            raise TypeError(f"heads must be (layer, head) pairs of integers; got {pair!r}")
        layer, head = pair
        if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
            raise ValueError(f"no head {pair!r}: layers are 0 .. {model.num_layers - 1}, heads "
                             f"0 .. {model.num_heads - 1}")
    hd = model.head_dim
    means = {}
    if mean_over is not None:
        contexts = head_contexts(model, mean_over)
        means = {(l, h): contexts[l][:, h].mean(dim=(0, 1)) for l, h in pairs}  # (hd,) each
    ablated = copy.deepcopy(model)
    with torch.no_grad():
        for layer, head in pairs:
            out_proj = ablated.layers[layer].out_proj
            cols = slice(head * hd, (head + 1) * hd)
            if (layer, head) in means:
                out_proj.bias += out_proj.weight[:, cols] @ means[layer, head]
            out_proj.weight[:, cols] = 0.0
    return ablated


@torch.no_grad()
def head_contexts(model: TinyTransformer, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Every head's output before the output projection (its weighted sum of values), layer by
    layer: a list of ``num_layers`` tensors ``(B, num_heads, T, head_dim)``.

    Shapes: tokens ``(B, T)``. Computed from the weights ``forward`` returns and each layer's
    ``W_value`` applied to that layer's input (the residual stream before it)."""
    tokens = _check_tokens("tokens", tokens, 2)
    was_training = model.training
    model.eval()
    try:
        _, weights = model(tokens, return_weights=True)  # (B, layers, H, T, T)
        B, T = tokens.shape
        H, hd = model.num_heads, model.head_dim
        x = model.tok_emb(tokens)
        if model.positional == "learned":
            x = x + model.pos_emb.weight[:T]
        contexts = []
        for l, layer in enumerate(model.layers):
            V = layer.W_value(x).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
            ctx = weights[:, l] @ V
            contexts.append(ctx)
            x = x + layer.out_proj(ctx.transpose(1, 2).reshape(B, T, H * hd))
    finally:
        model.train(was_training)
    return contexts


_HOOK_POINTS = ("query", "key", "value", "context")


@torch.no_grad()
def run_layers(model: TinyTransformer, tokens: torch.Tensor, patch=None) -> torch.Tensor:
    """The model's forward pass, layer by layer, with a hook to change what flows through it.

    At every layer ``l`` it calls ``patch(l, name, tensor)`` four times: with ``name`` =
    ``"query"``, ``"key"`` and ``"value"`` and the residual stream ``(B, T, d_model)`` that the
    layer's ``W_query``, ``W_key`` or ``W_value`` is about to read, then with ``"context"`` and the
    heads' outputs before the output projection ``(B, num_heads, T, head_dim)``. Return a tensor
    of the same shape to use instead, or None to keep it. Each call gets its own copy, so a patch
    may change it in place, but must then return it.

    Shapes: tokens ``(B, T)`` -> logits ``(B, T, vocab_size)``, equal to ``model(tokens)`` when
    ``patch`` is None or always returns None.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer; got {type(model).__name__}")
    if patch is not None and not callable(patch):
        raise TypeError(f"patch must be a function patch(layer, name, tensor) or None; got "
                        f"{type(patch).__name__}")
    tokens = _check_tokens("tokens", tokens, 2)
    B, T = tokens.shape
    H, hd = model.num_heads, model.head_dim

    def hook(l: int, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if patch is None:
            return tensor
        mine = tensor.clone()
        new = patch(l, name, mine)
        if new is None:
            if not torch.equal(mine, tensor):
                raise ValueError(f"patch changed the {name!r} tensor of layer {l} in place but "
                                 "returned None: return the changed tensor")
            return tensor
        if not isinstance(new, torch.Tensor) or new.shape != tensor.shape:
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(f"patch must return None or a tensor of shape "
                             f"{tuple(tensor.shape)} for {name!r} of layer {l}; got {got}")
        return new.to(tensor.dtype)

    x = model.tok_emb(tokens)  # (B, T, d)
    if model.positional == "learned":
        x = x + model.pos_emb.weight[:T]
    for l, layer in enumerate(model.layers):
        Q, K, V = (lin(hook(l, name, x)).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
                   for name, lin in zip(_HOOK_POINTS, (layer.W_query, layer.W_key, layer.W_value),
                                        strict=False))
        if model.positional == "rope":
            positions = torch.arange(T)
            Q = apply_rope(Q, positions, base=model.rope_base, scale=model.rope_scale)
            K = apply_rope(K, positions, base=model.rope_base, scale=model.rope_scale)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(hd)  # (B, H, T, T)
        if model.positional == "alibi":
            scores = scores + alibi_bias(H, T, scores.dtype).to(scores.device)
        else:
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        context = hook(l, "context", torch.softmax(scores, dim=-1) @ V)  # (B, H, T, hd)
        x = x + layer.out_proj(context.transpose(1, 2).reshape(B, T, H * hd))  # the residual stream
    return model.unembed(x)  # (B, T, vocab_size)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def adam_step(params, state: dict, lr: float, betas: tuple = (0.9, 0.999),
              eps: float = 1e-8) -> None:
    """One Adam update (Kingma & Ba, 2015) of ``params`` in place, from their ``.grad``.

    ``state`` is a dict that carries the step count and each parameter's running averages of the
    gradient (``m``) and of its square (``v``) from one call to the next; pass the same (initially
    empty) dict every time. The arithmetic is that of ``torch.optim.Adam`` with no weight decay;
    it is written out here because the first use of ``torch.optim`` imports PyTorch's compiler
    (TorchDynamo), which takes longer than training the notebook's model.
    """
    beta1, beta2 = betas
    state["step"] = step = state.get("step", 0) + 1
    moments = state.setdefault("moments", {})
    correction1 = 1 - beta1 ** step
    correction2_sqrt = math.sqrt(1 - beta2 ** step)
    for p in params:
        if p.grad is None:
            continue
        m, v = moments.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
        m.lerp_(p.grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
        p.addcdiv_(m, (v.sqrt() / correction2_sqrt).add_(eps), value=-lr / correction1)


def train(model: TinyTransformer, steps: int, *, min_period: int, max_period: int,
          batch_size: int = 64, lr: float = 1e-2, seed: int = 0, seq_len: int | None = None,
          eval_tokens: torch.Tensor | None = None, eval_every: int = 10,
          prev_up_to: int | None = None, predicting_only: bool = False,
          keep_states: bool = False,
          progress: bool = False) -> dict:
    """Train ``model`` in place on ``repeated_tokens`` batches with Adam (``adam_step``) and a
    cosine learning rate decaying from ``lr`` to 0; return the history.

    Every batch is fresh (``batch_size`` sequences of ``seq_len`` tokens, by default
    ``model.context_length``, periods ``min_period .. max_period``), drawn from a generator
    seeded with ``seed``. Seed the model's initialisation yourself (``torch.manual_seed``
    before building it).

    PyTorch runs on one thread inside this function (restored afterwards): for a model this
    small that is as fast as more threads, and the result then does not depend on how many cores
    the machine has (summing in a different order changes the last bits of a float, and those
    differences grow over hundreds of steps).

    Returns a dict: ``loss`` (``steps`` floats, the training loss of every step) and, when
    ``eval_tokens`` ``(B, T)`` is given, every ``eval_every`` steps and after the last one:
    ``eval_step``, ``repeat_loss``, ``first_loss``, ``repeat_accuracy`` (lists of floats),
    ``per_position`` (tensor ``(evals, T - 1)``: the mean loss of predicting token ``t + 1``, as
    ``evaluate`` returns it) and ``previous_token_scores``, ``induction_scores`` (tensors
    ``(evals, layers, heads)``). With ``prev_up_to=n`` the previous-token scores are taken on
    queries ``1 .. n`` only (default: all queries ``1 .. T - 1``); ``predicting_only`` is passed
    to ``induction_score``. Evaluating does not touch the
    training batches' generator. With ``keep_states=True`` the history also holds ``states``: a
    copy of ``model.state_dict()`` at every evaluation (load one into a model of the same shape).
    ``progress=True`` shows a tqdm progress bar (on stderr).
    """
    from tqdm import tqdm  # imported here: only training needs it

    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer; got {type(model).__name__}")
    _check_int("steps", steps)
    _check_int("eval_every", eval_every)
    seq_len = model.context_length if seq_len is None else _check_int("seq_len", seq_len, 3)
    if prev_up_to is not None:
        _check_int("prev_up_to", prev_up_to)
    history: dict = {"loss": [], "eval_step": [], "repeat_loss": [], "first_loss": [],
                     "repeat_accuracy": [], "per_position": [], "previous_token_scores": [],
                     "induction_scores": []}
    if keep_states:
        history["states"] = []

    def record(step: int) -> None:
        metrics = evaluate(model, eval_tokens)
        history["eval_step"].append(step)
        for key in ("repeat_loss", "first_loss", "repeat_accuracy"):
            history[key].append(metrics[key])
        history["per_position"].append(metrics["per_position"])
        w = metrics["weights"]
        if prev_up_to is None:
            prev = previous_token_score(w)
        else:  # key i - 1 for the queries i = 1 .. prev_up_to only
            T_eval = w.shape[-1]
            rows = (torch.arange(T_eval, device=w.device) <= prev_up_to).unsqueeze(1)  # (T, 1)
            prev = attention_score(w, previous_token_mask(T_eval).to(w.device) & rows)
        history["previous_token_scores"].append(prev.mean(dim=0))
        ind = induction_score(w, eval_tokens, predicting_only=predicting_only)
        history["induction_scores"].append(ind.mean(dim=0))
        if keep_states:
            history["states"].append({k: v.detach().clone() for k, v in model.state_dict().items()})

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(seed)
        params = [p for p in model.parameters() if p.requires_grad]
        adam_state: dict = {}
        model.train()
        bar = tqdm(range(steps), desc="training", unit="step", disable=not progress,
                   mininterval=0.5)  # few refreshes: each one is a separate output in a notebook
        for step in bar:
            if eval_tokens is not None and step % eval_every == 0:
                record(step)
                bar.set_postfix(repeat_loss=f"{history['repeat_loss'][-1]:.3f}", refresh=False)
            tokens = repeated_tokens(batch_size, seq_len, model.vocab_size,
                                     min_period, max_period, generator)
            loss = next_token_losses(model(tokens), tokens).mean()
            model.zero_grad(set_to_none=True)
            loss.backward()
            adam_step(params, adam_state, lr * 0.5 * (1.0 + math.cos(math.pi * step / steps)))
            history["loss"].append(loss.item())
        if eval_tokens is not None:
            record(steps)
        bar.close()
    finally:
        torch.set_num_threads(threads)
    for key in ("per_position", "previous_token_scores", "induction_scores"):
        if history[key]:
            history[key] = torch.stack(history[key])
    return history


def phase_change_step(eval_steps, losses) -> int:
    """The first evaluation step at which ``losses`` has fallen at least halfway from its first
    value to its last: where the drop happens. Shapes: two sequences of the same length."""
    eval_steps, losses = list(eval_steps), [float(v) for v in losses]
    if len(eval_steps) != len(losses) or len(losses) < 2:
        raise ValueError(f"need two sequences of the same length >= 2; got {len(eval_steps)} "
                         f"steps and {len(losses)} losses")
    halfway = (losses[0] + losses[-1]) / 2
    return next(s for s, v in zip(eval_steps, losses, strict=True) if v <= halfway)


def steepest_drop_step(eval_steps, losses) -> int:
    """Where ``losses`` falls fastest: the middle of the interval between two consecutive
    evaluations with the largest drop per step. Shapes: two sequences of the same length >= 2,
    ``eval_steps`` increasing. Returns an int (rounded down)."""
    eval_steps, losses = [int(s) for s in eval_steps], [float(v) for v in losses]
    if len(eval_steps) != len(losses) or len(losses) < 2:
        raise ValueError(f"need two sequences of the same length >= 2; got {len(eval_steps)} "
                         f"steps and {len(losses)} losses")
    if any(b <= a for a, b in zip(eval_steps[:-1], eval_steps[1:], strict=True)):
        raise ValueError("eval_steps must be strictly increasing")
    slopes = [(losses[i] - losses[i + 1]) / (eval_steps[i + 1] - eval_steps[i])
              for i in range(len(losses) - 1)]
    i = max(range(len(slopes)), key=slopes.__getitem__)
    return (eval_steps[i] + eval_steps[i + 1]) // 2


def best_possible_losses(tokens: torch.Tensor, vocab_size: int, min_period: int,
                         max_period: int) -> torch.Tensor:
    """The lowest expected cross-entropy any model can reach on these sequences, prediction by
    prediction, if it knows how they were made (``repeated_tokens`` with periods drawn uniformly
    from ``min_period .. max_period``): the loss of the Bayes-optimal predictor.

    After ``n`` tokens (``BOS`` excluded) every period ``p`` that agrees with them is still
    possible, with posterior weight proportional to its likelihood (``p`` distinct tokens drawn
    without replacement). A period ``p <= n`` predicts the token ``p`` back for sure; a longer one
    predicts a token not yet seen, uniformly among the ``vocab_size - 1 - n`` left.

    Shapes: tokens ``(B, T)`` -> ``(B, T - 1)`` (nats), aligned with ``next_token_losses``:
    entry ``t`` is the loss of predicting ``tokens[:, t + 1]``. ``inf`` where the sequence is
    impossible under the assumed periods.
    """
    tokens = _check_tokens("tokens", tokens, 2)
    _check_int("vocab_size", vocab_size, 3)
    _check_int("min_period", min_period, 1)
    _check_int("max_period", max_period, 1)
    if max_period < min_period:
        raise ValueError(f"max_period must be >= min_period; got {min_period}, {max_period}")
    if (tokens[:, 0] != BOS).any():
        raise ValueError("every sequence must start with BOS (token 0)")
    letters = tokens[:, 1:].to(torch.long)  # (B, N): the tokens after BOS
    B, N = letters.shape
    j = torch.arange(N)
    seen = (letters.unsqueeze(-1) == letters.unsqueeze(-2)) & (j.unsqueeze(1) > j.unsqueeze(0))
    new = ~seen.any(dim=-1)  # (B, N): letter j differs from every earlier one
    # log of 1 / (V - 1 - j): the chance of drawing letter j when j letters are already taken
    log_draw = -torch.log(torch.clamp(vocab_size - 1 - j.to(torch.float64), min=1.0))
    log_post, log_pred = [], []
    for p in range(min_period, max_period + 1):
        in_period = j < p
        ok = torch.where(in_period, new, letters == letters.roll(p, dims=1))  # (B, N)
        # prefix of n letters (n = 0 .. N - 1) consistent with p: letters 0 .. n - 1 all ok
        ok_prefix = torch.cat([torch.ones(B, 1, dtype=torch.bool),
                               ok[:, :-1].cumprod(dim=1).bool()], dim=1)  # (B, N)
        log_like = torch.cat([torch.zeros(1, dtype=torch.float64),
                              torch.cumsum(torch.where(in_period, log_draw, 0.0), 0)[:-1]])
        log_post.append(torch.where(ok_prefix, log_like.expand(B, N), -math.inf))
        # the chance p gives the letter that really comes next (letter n)
        log_pred.append(torch.where(ok, torch.where(in_period, log_draw, 0.0), -math.inf))
    log_post = torch.stack(log_post)  # (P, B, N)
    log_post = log_post - torch.logsumexp(log_post, dim=0, keepdim=True)
    return -torch.logsumexp(log_post + torch.stack(log_pred), dim=0)  # (B, N) = (B, T - 1)


def ov_circuit(model: TinyTransformer, layer: int, head: int) -> torch.Tensor:
    """The OV circuit of one head read from token to logit, ``W_E W_V^h W_O^h W_U`` (Elhage et
    al., 2021): row ``a`` is what the head adds to the logits when it attends to a position
    holding token ``a`` (with weight 1, through the token embedding only).

    ``W_E`` is ``tok_emb.weight`` ``(V, d)``, ``W_V^h`` the head's columns of the math's ``W_v``
    ``(d, head_dim)``, ``W_O^h`` its rows of ``W_o`` ``(head_dim, d)``, ``W_U`` the unembedding
    ``(d, V)``. Returns ``(vocab_size, vocab_size)``: source token down, output logit across.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer; got {type(model).__name__}")
    if not (isinstance(layer, int) and isinstance(head, int) and 0 <= layer < model.num_layers
            and 0 <= head < model.num_heads):
        raise ValueError(f"no head ({layer!r}, {head!r}): layers are 0 .. {model.num_layers - 1},"
                         f" heads 0 .. {model.num_heads - 1}")
    hd = model.head_dim
    cols = slice(head * hd, (head + 1) * hd)
    mha = model.layers[layer]
    with torch.no_grad():
        W_V = mha.W_value.weight[cols].T  # (d, hd)
        W_O = mha.out_proj.weight[:, cols].T  # (hd, d)
        return model.tok_emb.weight @ W_V @ W_O @ model.unembed.weight.T  # (V, V)


def copying_score(ov: torch.Tensor) -> float:
    """Elhage et al.'s (2021) copying score of a square circuit matrix: ``Re(sum lambda) /
    sum |lambda|`` over its eigenvalues. 1 when every eigenvalue is positive (the matrix maps
    each token mostly onto itself), -1 when every one is negative. Shapes: ``(n, n)`` -> float."""
    if not isinstance(ov, torch.Tensor) or ov.ndim != 2 or ov.shape[0] != ov.shape[1]:
        raise ValueError(f"ov must be a square (n, n) tensor; got "
                         f"{tuple(getattr(ov, 'shape', ()))}")
    eig = torch.linalg.eigvals(ov.double())
    return float(eig.sum().real / eig.abs().sum())
