"""The checkers of notebook 08: each accepts a reference solution, says "not attempted yet" for the
shipped stub, and rejects typical wrong answers with the hint for that mistake. The reference
solutions here are written independently of the checkers and checked against PyTorch
(``causal_lower_right``), ``shared.generation.KVCache`` and published numbers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from shared import exercises as ex
from shared.exercises import nb08
from shared.generation import KVCache, causal_mask, gqa_attention, kv_cache_bytes, positions_mask
from shared.llama import LlamaStyleAttention
from shared.positional import apply_rope
from tests.checker_helpers import case_id


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


# 8.1 ------------------------------------------------------------------------------------------
def _split(layer, t, heads):
    B, T, _ = t.shape
    return t.view(B, T, heads, layer.head_dim).transpose(1, 2)


def step_ok(layer, x, K_cache, V_cache):
    """Written from the math, with PyTorch's own GQA (enable_gqa=True)."""
    T, T_new = K_cache.shape[2], x.shape[1]
    positions = T + torch.arange(T_new)
    Q = apply_rope(_split(layer, layer.q_proj(x), layer.num_heads), positions, layer.rope_base)
    k = apply_rope(_split(layer, layer.k_proj(x), layer.num_kv_heads), positions, layer.rope_base)
    K_cache = torch.cat([K_cache, k], dim=2)
    V_cache = torch.cat([V_cache, _split(layer, layer.v_proj(x), layer.num_kv_heads)], dim=2)
    context = F.scaled_dot_product_attention(Q, K_cache, V_cache, attn_mask=causal_lower_right(T_new, T + T_new),
                                             enable_gqa=True)
    return layer.o_proj(context.transpose(1, 2).flatten(2)), K_cache, V_cache


def _step(positions="ok", heads="interleave", mask="bottom_right", cache_heads="kv"):
    """The notebook's buggy step with some of its lines changed."""
    def llama_step(layer, x, K_cache, V_cache):
        B, T_new, _ = x.shape
        H, H_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        T = K_cache.shape[2]
        right, zero = T + torch.arange(T_new), torch.arange(T_new)
        q_pos, k_pos = {"ok": (right, right), "zero": (zero, zero), "after": (right + T_new, right + T_new),
                        "q_only": (right, zero), "q_in_pass": (zero, right)}[positions]
        Q = apply_rope(layer.q_proj(x).view(B, T_new, H, d).transpose(1, 2), q_pos, layer.rope_base)
        k = apply_rope(layer.k_proj(x).view(B, T_new, H_kv, d).transpose(1, 2), k_pos, layer.rope_base)
        v = layer.v_proj(x).view(B, T_new, H_kv, d).transpose(1, 2)
        K_cache, V_cache = torch.cat([K_cache, k], dim=2), torch.cat([V_cache, v], dim=2)
        if heads == "interleave":
            K, V = K_cache.repeat_interleave(H // H_kv, dim=1), V_cache.repeat_interleave(H // H_kv, dim=1)
        else:
            K, V = K_cache.repeat(1, H // H_kv, 1, 1), V_cache.repeat(1, H // H_kv, 1, 1)
        if mask == "bottom_right":
            context = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_mask(T_new, K.shape[2]))
        elif mask == "is_causal":
            context = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        elif mask == "is_causal_if_many":
            context = F.scaled_dot_product_attention(Q, K, V, is_causal=T_new > 1)
        else:
            context = F.scaled_dot_product_attention(Q, K, V)
        out = layer.o_proj(context.transpose(1, 2).reshape(B, T_new, H * d))
        return (out, K, V) if cache_heads == "repeated" else (out, K_cache, V_cache)
    return llama_step


step_as_given = _step(positions="q_in_pass", heads="repeat", mask="is_causal_if_many")  # the notebook's buggy_llama_step
step_mask_fixed_only = _step(positions="q_in_pass", heads="repeat")  # fixed the mask, not the rest
step_heads_fixed_only = _step(positions="q_in_pass", mask="is_causal_if_many")  # fixed the heads, not the rest
step_positions_only = _step(positions="q_in_pass")  # fixed the heads and the mask: queries still at i
step_mask_only = _step(mask="is_causal_if_many")  # fixed the positions and the heads
step_zero = _step(positions="zero")  # positions restart at 0 in every pass
step_after = _step(positions="after")
step_q_only = _step(positions="q_only")
step_is_causal = _step(mask="is_causal")
step_no_mask = _step(mask="none")
step_repeated_cache = _step(cache_heads="repeated")


def step_list(*args):  # a list instead of a tuple is fine
    return list(step_ok(*args))


def step_out_only(*args):
    return step_ok(*args)[0]


def llama_attention(layer, x, cache):  # the notebook's cell that uses a KVCache, copied as it is
    B, T_new, _ = x.shape
    positions = torch.arange(cache.seen, cache.seen + T_new)
    Q = apply_rope(_split(layer, layer.q_proj(x), layer.num_heads), positions, layer.rope_base)
    k = apply_rope(_split(layer, layer.k_proj(x), layer.num_kv_heads), positions, layer.rope_base)
    K, V, k_pos = cache.update(k, _split(layer, layer.v_proj(x), layer.num_kv_heads))
    context, _ = gqa_attention(Q, K, V, positions_mask(positions, k_pos))
    return layer.o_proj(context.transpose(1, 2).reshape(B, T_new, -1))


# 8.2 ------------------------------------------------------------------------------------------
LLAMA_3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "intermediate_size": 14336, "vocab_size": 128256}  # Meta-Llama-3-8B's config.json


def esize(dtype):
    return {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}[dtype]


def roof_parts(config, T, dtype, *, kv_reads=1, mlp=True, kv_flops=False, split_head_dim=False, kv_weights_H=False):
    """(FLOPs of one sequence, bytes of the weights, bytes of one sequence's cache), written from the
    description: every matrix of a layer counted by its shape, the output layer, no embedding table."""
    L, H, D = config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]
    H_kv = config.get("num_key_value_heads", H)
    d = D // H if split_head_dim else config.get("head_dim", D // H)
    kv_heads = H if kv_weights_H else H_kv
    shapes = [(D, H * d), (D, kv_heads * d), (D, kv_heads * d), (H * d, D)]  # q_proj, k_proj, v_proj, o_proj
    if mlp:
        shapes += [(D, config["intermediate_size"])] * 3  # gate, up, down
    weights = L * sum(a * b for a, b in shapes) + config["vocab_size"] * D
    flops = 2 * weights + L * (H_kv if kv_flops else H) * (2 * d * T + 2 * d * T)  # q.k, then weights x V
    return flops, weights * esize(dtype), 2 * L * H_kv * T * d * esize(dtype) * kv_reads


def roof_ok(config, T, batch_size, dtype=torch.bfloat16):
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_repeat(config, T, batch_size, dtype=torch.bfloat16):  # K and V read once per query head
    g = config["num_attention_heads"] // config.get("num_key_value_heads", config["num_attention_heads"])
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype, kv_reads=g)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_no_mlp(config, T, batch_size, dtype=torch.bfloat16):
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype, mlp=False)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_two_bytes(config, T, batch_size, dtype=torch.bfloat16):  # bytes per element hard-coded
    return roof_ok(config, T, batch_size, torch.float16)


def roof_gflop_per_gib(config, T, batch_size, dtype=torch.bfloat16):  # GFLOP over GiB
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype)
    return (batch_size * flops / 1e9) / ((weight_bytes + batch_size * cache_bytes) / 2**30)


def roof_kv_flops(config, T, batch_size, dtype=torch.bfloat16):
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype, kv_flops=True)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_kv_weights_H(config, T, batch_size, dtype=torch.bfloat16):  # k_proj, v_proj sized by H, not H_kv
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype, kv_weights_H=True)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_one_cache(config, T, batch_size, dtype=torch.bfloat16):
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype)
    return batch_size * flops / (weight_bytes + cache_bytes)


def roof_split_head_dim(config, T, batch_size, dtype=torch.bfloat16):
    flops, weight_bytes, cache_bytes = roof_parts(config, T, dtype, split_head_dim=True)
    return batch_size * flops / (weight_bytes + batch_size * cache_bytes)


def roof_key_error(config, T, batch_size, dtype=torch.bfloat16):
    config["num_key_value_heads"]  # noqa: B018 - a config without it raises KeyError
    return roof_ok(config, T, batch_size, dtype)


# 8.3 ------------------------------------------------------------------------------------------
class RingOK:
    """A true ring buffer: sinks + window preallocated slots; token p > sinks goes to slot
    sinks + (p - sinks) % window."""

    def __init__(self, window, sinks):
        self.window, self.sinks, self.seen = window, sinks, 0
        self.K = self.V = None

    def slot(self, p):
        return p if p < self.sinks else self.sinks + (p - self.sinks) % self.window

    def update(self, k, v):
        if self.K is None:
            B, H, _, d = k.shape
            self.K = k.new_zeros(B, H, self.sinks + self.window, d)
            self.V = v.new_zeros(B, H, self.sinks + self.window, d)
        s = self.slot(self.seen)
        self.K[:, :, s], self.V[:, :, s] = k[:, :, 0], v[:, :, 0]
        self.seen += 1
        filled = min(self.seen, self.sinks + self.window)
        return self.K[:, :, :filled], self.V[:, :, :filled]


class RingCat:
    """The same tokens kept by concatenating and slicing: right tokens, but new storage every step."""

    def __init__(self, window, sinks):
        self.window, self.sinks = window, sinks
        self.K = self.V = None

    def update(self, k, v):
        self.K = k if self.K is None else torch.cat([self.K, k], dim=2)
        self.V = v if self.V is None else torch.cat([self.V, v], dim=2)
        if self.K.shape[2] > self.sinks + self.window:
            keep = list(range(self.sinks)) + list(range(self.K.shape[2] - self.window, self.K.shape[2]))
            self.K, self.V = self.K[:, :, keep], self.V[:, :, keep]
        return self.K, self.V


class RingLibrary:
    """Wraps the library's KVCache(window, sinks): right tokens, no preallocated slots."""

    def __init__(self, window, sinks):
        self.cache = KVCache(window=window, sinks=sinks)

    def update(self, k, v):
        K, V, _ = self.cache.update(k, v)
        return K, V


class RingCopies(RingOK):  # preallocated slots, but returns copies of them
    def update(self, k, v):
        K, V = super().update(k, v)
        return K.clone(), V.clone()


class RingNoSinks(RingOK):
    def slot(self, p):
        return p % (self.sinks + self.window)  # the sinks are overwritten like any other slot

    def update(self, k, v):
        K, V = super().update(k, v)
        return K, V


class RingShort(RingOK):  # keeps window - 1 recent tokens
    def __init__(self, window, sinks):
        super().__init__(window - 1 if window > 1 else window, sinks)


class RingAllSlots(RingOK):  # returns the slots not written yet (zeros) too
    def update(self, k, v):
        super().update(k, v)
        return self.K, self.V


class RingStub:
    def __init__(self, window, sinks):
        self.window, self.sinks, self.seen = window, sinks, 0

    def update(self, k, v):
        # TODO: your code here
        return None


# 8.4 ------------------------------------------------------------------------------------------
def pad_ok(attention_mask, T_new):
    """Written from the definition: count each row's real tokens; a query sees the real keys at or
    before its own column."""
    m = attention_mask.long()
    B, T_k = m.shape
    positions = (m.cumsum(dim=1) - 1)[:, T_k - T_new:]
    cols = torch.arange(T_k - T_new, T_k)
    causal = torch.arange(T_k)[None, :] <= cols[:, None]  # (T_new, T_k), bottom-right
    return positions, (causal[None] & m.bool()[:, None, :])[:, None]


def pad_loops(attention_mask, T_new):
    """The same with plain loops, padding queries given only themselves (no empty rows)."""
    m = attention_mask.tolist()
    B, T_k = len(m), len(m[0])
    positions = torch.zeros(B, T_new, dtype=torch.long)
    allowed = torch.zeros(B, 1, T_new, T_k, dtype=torch.bool)
    for b in range(B):
        for i in range(T_new):
            c = T_k - T_new + i
            positions[b, i] = sum(m[b][:c])
            for j in range(c + 1):
                allowed[b, 0, i, j] = bool(m[b][j]) or (j == c and not m[b][c])
    return positions, allowed


def pad_columns(attention_mask, T_new):
    _, allowed = pad_ok(attention_mask, T_new)
    T_k = attention_mask.shape[1]
    return torch.arange(T_k - T_new, T_k).expand(attention_mask.shape[0], T_new), allowed


def pad_from_one(attention_mask, T_new):
    positions, allowed = pad_ok(attention_mask, T_new)
    return positions + 1, allowed


def pad_restart(attention_mask, T_new):
    _, allowed = pad_ok(attention_mask, T_new)
    return torch.arange(T_new).expand(attention_mask.shape[0], T_new), allowed


def pad_causal_only(attention_mask, T_new):
    positions, _ = pad_ok(attention_mask, T_new)
    return positions, causal_mask(T_new, attention_mask.shape[1]).expand(attention_mask.shape[0], 1, -1, -1)


def pad_is_causal(attention_mask, T_new):
    positions, _ = pad_ok(attention_mask, T_new)
    top_left = causal_mask(T_new, attention_mask.shape[1], align="top_left")
    return positions, top_left[None, None] & attention_mask.bool()[:, None, None, :]


def pad_no_causal(attention_mask, T_new):
    positions, _ = pad_ok(attention_mask, T_new)
    return positions, attention_mask.bool()[:, None, None, :].expand(-1, 1, T_new, -1)


def pad_inverted(attention_mask, T_new):
    positions, _ = pad_ok(attention_mask, T_new)
    T_k = attention_mask.shape[1]
    causal = causal_mask(T_new, T_k)
    return positions, causal[None, None] & ~attention_mask.bool()[:, None, None, :]


def pad_three_dims(attention_mask, T_new):
    positions, allowed = pad_ok(attention_mask, T_new)
    return positions, allowed[:, 0]


def pad_float(attention_mask, T_new):
    positions, allowed = pad_ok(attention_mask, T_new)
    return positions, torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


# 8.1's prediction: derived by hand. Queries rotated at their place in the pass (i) against keys
# at T + i: right in a prefill from an empty cache (T = 0), wrong from the first decode step on,
# whatever H_kv. Tensor.repeat and repeat_interleave differ for 1 < H_kv < H in every pass, and are
# the same list for H_kv = 1. is_causal=T_new > 1 is top-left = bottom-right for a prefill from an
# empty cache (T_q = T_k), and no mask is right for one query, so only a chunk after the prefill
# shows it, whatever H_kv. Third run (H_kv = 2, a prefill of 4, a chunk of 2, a decode step): the
# positions and the mask first go wrong in the chunk, the heads in the prefill. Measured below with
# LlamaStyleAttention.
LINES = ["positions = torch.arange(T_new)  # the new tokens, numbered within this pass",
         "    K = K_cache.repeat(1, H // H_kv, 1, 1)  # one key head per query head",
         "context = F.scaled_dot_product_attention(Q, K, V, is_causal=T_new > 1)"]
PREDICTED = [("decode", "decode", "chunk"), ("prefill", "never", "prefill"), ("never", "never", "chunk")]
RUN_KEYS = ("H_kv=2", "H_kv=1", "chunk")  # the notebook's keys, in the order of the triples
PREDICTED_DICTS = [dict(zip(RUN_KEYS, p, strict=True)) for p in PREDICTED]
Q_LINE = "Q = apply_rope(layer.q_proj(x).view(B, T_new, H, d).transpose(1, 2), positions, layer.rope_base)"
K_LINE = "k = apply_rope(layer.k_proj(x).view(B, T_new, H_kv, d).transpose(1, 2), T + positions,"


# ---------------------------------------------------------------------------------------------
NA, OK = "not attempted yet", "correct!"
CHECKERS = list(nb08.__all__)
C = ex
CASES = [
    (C.check_llama_step_prediction, (LINES, PREDICTED_DICTS), True, "1 < H_kv < H"),
    (C.check_llama_step_prediction, (LINES, PREDICTED), True, "'chunk': 'prefill'"),  # triples still work
    (C.check_llama_step_prediction, (LINES, [{**PREDICTED_DICTS[0], "chunk": "decode"}, *PREDICTED_DICTS[1:]]), False,
     "first_wrong[0]['chunk'] is off"),
    (C.check_llama_step_prediction, (LINES, [{"H_kv=2": "decode", "H_kv=1": "decode"}, *PREDICTED_DICTS[1:]]), False,
     "must have the keys"),
    (C.check_llama_step_prediction, (LINES, PREDICTED_DICTS[0]), False, "must be a list of 3 dicts"),
    (C.check_llama_step_prediction, (LINES[::-1], PREDICTED[::-1]), True, OK),  # any order
    (C.check_llama_step_prediction, ([Q_LINE, *LINES[1:]], PREDICTED), True, OK),  # the Q line shows the bug too
    (C.check_llama_step_prediction, ([LINES[0], "V = V_cache.repeat(1, H // H_kv, 1, 1)", LINES[2]], PREDICTED), True, OK),
    (C.check_llama_step_prediction, (None, None), None, "find the bugs first"),
    (C.check_llama_step_prediction, ([], PREDICTED), False, "must be a list of lines"),
    (C.check_llama_step_prediction, (LINES[0], PREDICTED), False, "must be a list of lines"),
    (C.check_llama_step_prediction, (LINES[1:], PREDICTED[1:]), False, "the function has more"),
    (C.check_llama_step_prediction, ([LINES[2]], PREDICTED[2:]), False, "this line is a bug, and the function has more"),
    (C.check_llama_step_prediction, ([K_LINE, *LINES[1:]], PREDICTED), False, "bug_lines[0] is not a bug"),
    (C.check_llama_step_prediction, ([*LINES, "return layer.o_proj(...)"], [*PREDICTED, ("never", "never", "never")]), False,
     "bug_lines[3] is not a bug"),
    (C.check_llama_step_prediction, ([LINES[0], "K = K_cache.repeat_interleave(H // H_kv, dim=1)", LINES[2]],
                                     PREDICTED), False, "looks like a fix"),
    (C.check_llama_step_prediction, (["positions = T + torch.arange(T_new)", *LINES[1:]], PREDICTED), False,
     "looks like a fix"),
    (C.check_llama_step_prediction, ([*LINES, "V = V_cache.repeat(1, H // H_kv, 1, 1)"], [*PREDICTED, ("prefill", "never", "prefill")]),
     False, "are one bug"),
    (C.check_llama_step_prediction, ([*LINES, Q_LINE], [*PREDICTED, ("decode", "decode", "chunk")]), False, "are one bug"),
    (C.check_llama_step_prediction, ([LINES[0], 3, LINES[2]], PREDICTED), False, "as a string"),
    (C.check_llama_step_prediction, (LINES, None), None, "every bug found"),
    (C.check_llama_step_prediction, (LINES, PREDICTED[:2]), False, "must be a list of 3 dicts"),
    (C.check_llama_step_prediction, (LINES, [("decode", "decode"), "prefill", ("never", "never")]), False,
     "first_wrong[0] must be a dict"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], PREDICTED[1], ("decode", "never", "chunk")]), False,
     "a step of one query"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], PREDICTED[1], ("prefill", "never", "chunk")]), False, "(T_q = T_k)"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], PREDICTED[1], ("never", "never", "never")]), False,
     "a chunk of 2 after it (T_q < T_k)"),
    (C.check_llama_step_prediction, (LINES, [("decode", "decode", "decode"), *PREDICTED[1:]]), False,
     "first_wrong[0]['chunk'] is off"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], ("prefill", "never", "never"), PREDICTED[2]]), False,
     "section 4's diagram"),
    (C.check_llama_step_prediction, (LINES, [("chunk", "decode", "chunk"), *PREDICTED[1:]]), False,
     "this run has no chunk"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], ("decode", "never", "prefill"), PREDICTED[2]]), False,
     "section 4's diagram"),
    (C.check_llama_step_prediction, (LINES, [PREDICTED[0], ("prefill", "prefill", "prefill"), PREDICTED[2]]), False, "only one"),
    (C.check_llama_step_prediction, (LINES, [("prefill", "prefill", "chunk"), *PREDICTED[1:]]), False,
     "the distance between the positions"),
    (C.check_llama_step_prediction, (LINES, [("never", "decode", "chunk"), *PREDICTED[1:]]), False,
     "first_wrong[0]['H_kv=2'] is off"),
    (C.check_llama_step_prediction, (LINES, [("decode", "first", "chunk"), *PREDICTED[1:]]), False, "got 'first'"),
    (C.check_llama_step_fix, (step_ok,), True, "3 decode steps equal the layer"),
    (C.check_llama_step_fix, (step_list,), True, OK),
    (C.check_llama_step_fix, (stub,), None, NA),
    (C.check_llama_step_fix, (stub_raises,), None, NA),
    (C.check_llama_step_fix, (step_as_given,), False, "which key/value head each query head reads"),
    (C.check_llama_step_fix, (step_mask_fixed_only,), False, "which key/value head each query head reads"),
    (C.check_llama_step_fix, (step_heads_fixed_only,), False, "what distance do their rotations encode"),
    (C.check_llama_step_fix, (step_positions_only,), False, "a single decode step too, whatever the heads"),
    (C.check_llama_step_fix, (step_mask_only,), False, "wrong in a pass of several tokens"),
    (C.check_llama_step_fix, (step_zero,), False, "tokens already in the cache"),
    (C.check_llama_step_fix, (step_after,), False, "cached BEFORE this pass"),
    (C.check_llama_step_fix, (step_q_only,), False, "at what position is each new key rotated"),
    (C.check_llama_step_fix, (step_is_causal,), False, "aligned top-left"),
    (C.check_llama_step_fix, (step_no_mask,), False, "see the pass's later tokens"),
    (C.check_llama_step_fix, (step_repeated_cache,), False, "cache the 2 key/value heads"),
    (C.check_llama_step_fix, (step_out_only,), False, "return three things"),
    (C.check_llama_step_fix, (llama_attention,), False, "llama_attention raised TypeError"),
    (C.check_ceiling_prediction, (32, 8), True, "4 x 7.2 = 28.8 would miss"),
    (C.check_ceiling_prediction, (30.5, 8.3), True, "wider MLP"),
    (C.check_ceiling_prediction, (None, None), None, "are still None"),
    (C.check_ceiling_prediction, (32, None), None, "ceiling_repeat_kv is still None"),
    (C.check_ceiling_prediction, (28.8, 8), False, "scaled Llama-2-7B's 7.2 by 4"),
    (C.check_ceiling_prediction, (28.8, 8), False, "ceiling_repeat_kv is right"),
    (C.check_ceiling_prediction, (32, 7.2), False, "the MLP and the vocabulary differ"),
    (C.check_ceiling_prediction, (32, 7.2), False, "ceiling_read_once is right"),
    (C.check_ceiling_prediction, (8.0, 32), False, "swapped"),
    (C.check_ceiling_prediction, (8.0, 8.0), False, "g = 4 times"),
    (C.check_ceiling_prediction, (32, 32), False, "writes g = 4 copies"),
    (C.check_ceiling_prediction, (7.2, 8), False, "Llama-2-7B's ceiling"),
    (C.check_ceiling_prediction, (11, 8), False, "leave out the MLP"),
    (C.check_ceiling_prediction, (32, 2.74), False, "leave out the MLP"),
    (C.check_ceiling_prediction, (16, 8), False, "2 bytes, not 4"),
    (C.check_ceiling_prediction, (32, 4), False, "2 bytes, not 4"),
    (C.check_ceiling_prediction, (64, 8), False, "2 bytes, not 1"),
    (C.check_ceiling_prediction, (1.1, 8), False, "that is batch 1"),
    (C.check_ceiling_prediction, (295, 8), False, "too high"),
    (C.check_ceiling_prediction, (20, 8), False, "too low"),
    (C.check_ceiling_prediction, (32, 2.0), False, "too low"),
    # repeat_kv's own traffic counted too, by hand 32 / (2g + 1) and 32 / (g + 1): it reads the cache
    # once and writes g = 4 copies, then attention reads the copies (without the write: g + 1)
    (C.check_ceiling_prediction, (32, 32 / 9), False, "you counted 9 times the cache's bytes"),
    (C.check_ceiling_prediction, (32, 32 / 5), False, "not repeat_kv's own read of the cache"),
    (C.check_ceiling_prediction, ("32", 8), False, "should be a number"),
    (C.check_decode_flop_per_byte, (roof_ok,), True, "ceiling 32.0"),
    (C.check_decode_flop_per_byte, (stub,), None, NA),
    (C.check_decode_flop_per_byte, (roof_repeat,), False, "once for its whole group"),
    (C.check_decode_flop_per_byte, (roof_no_mlp,), False, "MLP's three matrices"),
    (C.check_decode_flop_per_byte, (roof_two_bytes,), False, "do not assume 2"),
    (C.check_decode_flop_per_byte, (roof_gflop_per_gib,), False, "a GiB is 2**30 bytes"),
    (C.check_decode_flop_per_byte, (roof_kv_flops,), False, "H query heads, not H_kv"),
    (C.check_decode_flop_per_byte, (roof_one_cache,), False, "its own cache"),
    (C.check_decode_flop_per_byte, (roof_kv_weights_H,), False, "project to the H_kv key/value heads"),
    (C.check_decode_flop_per_byte, (roof_split_head_dim,), False, "when a config gives head_dim"),
    (C.check_decode_flop_per_byte, (roof_key_error,), False, "use config.get"),
    (C.check_sink_ring_cache, (RingOK,), True, "sink + band mask"),
    (C.check_sink_ring_cache, (RingCat,), False, "allocates new storage at step 1"),
    (C.check_sink_ring_cache, (RingLibrary,), False, "allocates new storage at step 1"),
    (C.check_sink_ring_cache, (RingCopies,), False, "allocates new storage at step 1"),
    (C.check_sink_ring_cache, (RingStub,), None, NA),
    (C.check_sink_ring_cache, (RingNoSinks,), False, "which of the others holds the oldest"),
    (C.check_sink_ring_cache, (RingShort,), False, "one recent token too few"),
    (C.check_sink_ring_cache, (RingAllSlots,), False, "slots not written yet"),
    (C.check_padding_prediction, ("mask", "both"), True, "cancels in every score"),
    (C.check_padding_prediction, (None, "both"), None, NA),
    (C.check_padding_prediction, ("mask", None), None, NA),
    (C.check_padding_prediction, ("both", "both"), False, "with RoPE: its scores depend on the difference"),
    (C.check_padding_prediction, ("positions", "both"), False, "the mask, with RoPE: what"),
    (C.check_padding_prediction, ("neither", "both"), False, "padding key it may see"),
    (C.check_padding_prediction, ("mask", "mask"), False, "embedding of its own position"),  # learned = RoPE
    (C.check_padding_prediction, ("mask", "positions"), False, "the mask, with learned absolute positions: what"),
    (C.check_padding_prediction, ("Mask", "both"), False, "got 'Mask'"),
    (C.check_padding_prediction, ("mask", "all"), False, "in padding_prediction_learned; got 'all'"),
    (C.check_left_padding, (pad_ok,), True, "it would have alone"),
    (C.check_left_padding, (pad_loops,), True, OK),
    (C.check_left_padding, (stub,), None, NA),
    (C.check_left_padding, (pad_columns,), False, "count their padding"),
    (C.check_left_padding, (pad_from_one,), False, "one too large"),
    (C.check_left_padding, (pad_restart,), False, "numbered from 0 in every pass"),
    (C.check_left_padding, (pad_causal_only,), False, "attend to the padding tokens"),
    (C.check_left_padding, (pad_is_causal,), False, "aligned top-left"),
    (C.check_left_padding, (pad_no_causal,), False, "keep the causal part"),
    (C.check_left_padding, (pad_inverted,), False, "keeps the padding and masks the text"),
    (C.check_left_padding, (pad_three_dims,), False, "no head dimension"),
    (C.check_left_padding, (pad_float,), False, "boolean mask"),
]


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[case_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result = checker(*answers)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, f"expected exactly one line, got: {out!r}"
    assert result.passed is expected, out
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


def test_every_checker_is_covered_three_ways():
    """Each checker: a correct answer, the stub, and at least two different wrong answers."""
    for name in CHECKERS:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results, name
        assert results.count(False) >= 2, name


def test_checkers_are_exported():
    for name in CHECKERS:
        assert getattr(ex, name) is getattr(nb08, name)
        assert name in ex.__all__


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: (1, 2, 3), lambda *a, **k: np.zeros(0),
           lambda *a, **k: torch.zeros(2, 2)]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_roofline_mistakes_are_told_apart_on_the_hidden_cases():
    """No two hinted mistakes (nor a mistake and the right answer) agree on every hidden case, and
    the checker's formula for each equals the independent version above where there is one."""
    vectors = {m: tuple(nb08._roofline(nb08._roof_numbers(*case), m) for case in nb08._ROOF_CASES)
               for m in [None, *nb08._ROOF_HINTS]}
    for (a, va), (b, vb) in itertools.combinations(vectors.items(), 2):
        assert not np.allclose(va, vb, rtol=1e-6, atol=0), (a, b)
    for mistake, fn in ((None, roof_ok), ("repeat", roof_repeat), ("no_mlp", roof_no_mlp), ("e2", roof_two_bytes),
                        ("units", roof_gflop_per_gib), ("kv_flops", roof_kv_flops),
                        ("cache_once", roof_one_cache), ("head_dim", roof_split_head_dim),
                        ("kv_weights", roof_kv_weights_H)):
        assert np.allclose(vectors[mistake], [fn(*case) for case in nb08._ROOF_CASES], rtol=1e-12, atol=0), mistake


def test_ceiling_prediction_hides_the_answer_when_wrong(capsys):
    """A wrong prediction is told a direction or a named mistake, never the value; 8.1's wrong guesses
    name only the wrong entries, never the measurement."""
    for once, repeat in ((8.0, 8.0), (28.8, 7.2), (11, 2.74), (16, 4), (1.1, 1.1), (20, 2.0), (295, 30),
                         (8.0, 32), (32, 7.2), (28.8, 8)):
        ex.check_ceiling_prediction(once, repeat)
        out = capsys.readouterr().out
        # the right values (31.96 and 7.99) never appear, except as the learner's own guess echoed back
        echoed = {f"{v:{fmt}}" for v in (once, repeat) for fmt in (".3g", ".1f")}
        banned = {"32.0", "31.9", "7.99", "8.0"} - echoed
        assert not any(v in out for v in banned), out
    ex.check_llama_step_prediction(LINES, [PREDICTED_DICTS[0], {**PREDICTED_DICTS[1], "H_kv=2": "decode"}, PREDICTED_DICTS[2]])
    out = capsys.readouterr().out
    assert "first_wrong[1]['H_kv=2']" in out and "first_wrong[2]" not in out and "measured" not in out, out
    # before every line is found, nothing names a bug or says how many there are
    for lines in (None, LINES[1:], [LINES[0]], [*LINES[:2], "x = 1"], [K_LINE]):
        ex.check_llama_step_prediction(lines, PREDICTED)
        out = capsys.readouterr().out
        assert not any(word in out for word in ("repeat", "mask", "is_causal", "rotat", "measured", "two", "three",
                                                "2 bugs", "3 bugs", "one more")), out
    # 8.4: a wrong guess gets the reasoning, never the measurement
    for guess in (("positions", "both"), ("both", "both"), ("neither", "both"), ("mask", "mask"),
                  ("mask", "neither"), ("both", "mask")):
        ex.check_padding_prediction(*guess)
        out = capsys.readouterr().out
        assert "measured" not in out and "leave" not in out and "changes" not in out, out


def test_llama_step_mistakes_are_told_apart_on_the_hidden_cases():
    """Every combination of the hinted mistakes (positions x heads x mask) gives outputs that
    differ from the right ones and from every other combination on the hidden cases, so a hint
    never names a mistake the answer does not make; the checker's own reference equals
    LlamaStyleAttention on the whole sequence."""
    combos = list(itertools.product(*nb08._STEP_OPTIONS.values()))
    assert len(combos) == 40
    outputs = {c: [] for c in combos}
    for W, x, passes, H, H_kv, base in nb08._step_cases():
        for c in combos:
            out, K, _ = nb08._llama_passes(W, x, passes, H, H_kv, base,
                                           **dict(zip(nb08._STEP_OPTIONS, c, strict=True)))
            outputs[c] += [out, K]  # the checker compares the outputs and the cached keys
        layer = LlamaStyleAttention(x.shape[2], H, H_kv, rope_base=base).double().eval()
        with torch.no_grad():
            for name in "qkvo":
                getattr(layer, f"{name}_proj").weight.copy_(torch.from_numpy(W[name]))
            assert np.allclose(outputs[("ok", "ok", "ok")][-2], layer(torch.from_numpy(x)).numpy())
    for a, b in itertools.combinations(combos, 2):
        assert not all(np.allclose(u, v, atol=1e-6, rtol=1e-5)
                       for u, v in zip(outputs[a], outputs[b], strict=True)), (a, b)


def test_reference_solutions_agree_with_independent_facts():
    # the fixed step, pass by pass (prefill 4, chunk 2, 3 steps), = LlamaStyleAttention on all
    # tokens at once (itself checked against transformers' LlamaAttention in test_llama.py)
    torch.manual_seed(0)
    layer = LlamaStyleAttention(24, num_heads=6, num_kv_heads=2).double().eval()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    Kc = Vc = torch.zeros(2, 2, 0, 4, dtype=torch.float64)
    outs = []
    with torch.no_grad():
        for a, b in ((0, 4), (4, 6), (6, 7), (7, 8), (8, 9)):
            out, Kc, Vc = step_ok(layer, x[:, a:b], Kc, Vc)
            outs.append(out)
        assert torch.allclose(torch.cat(outs, dim=1), layer(x))
        # and the buggy step passes the test its author ran: one pass from an empty cache with
        # as many key/value heads as query heads
        mha = LlamaStyleAttention(24, num_heads=6).double().eval()
        empty = torch.zeros(2, 6, 0, 4, dtype=torch.float64)
        assert torch.allclose(step_as_given(mha, x, empty, empty)[0], mha(x))
    # Llama-2-7B (vocabulary 32000, MLP width 11008, no GQA), 4096 tokens, 16-bit: the notebook's ceiling 7.2;
    # its cache is 2 GiB (kv_cache_bytes); Llama-3-8B's is a quarter of that per token, its ceiling about 32
    llama2 = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "intermediate_size": 11008,
              "vocab_size": 32000}
    assert roof_parts(llama2, 4096, torch.float16)[2] == 2 * 2**30 == kv_cache_bytes(32, 32, 128, T=4096)
    assert round(roof_ok(llama2, 4096, 10**9), 1) == 7.2
    assert roof_parts(LLAMA_3_8B, 4096, torch.bfloat16)[2] * 4 == kv_cache_bytes(32, 32, 128, T=4096)
    assert 31.9 < roof_ok(LLAMA_3_8B, 4096, 10**9) < 32.0
    assert 7.98 < roof_repeat(LLAMA_3_8B, 4096, 10**9) < 8.0


def test_ceiling_prediction_grades_each_number_within_five_percent():
    """The two ceilings, computed from the description (roof_ok, roof_repeat at a batch of 10**9):
    guesses 4% off pass, 6% off fail, for each number alone; the naive 4 x 7.2 = 28.8 and Llama-2-7B's
    7.2 lie outside the bands."""
    once, repeat = roof_ok(LLAMA_3_8B, 4096, 10**9), roof_repeat(LLAMA_3_8B, 4096, 10**9)
    assert abs(4 * 7.2 - once) > 0.05 * once and abs(7.2 - repeat) > 0.05 * repeat
    for f in (0.96, 1.04):
        assert ex.check_ceiling_prediction(f * once, repeat).passed
        assert ex.check_ceiling_prediction(once, f * repeat).passed
    for f in (0.94, 1.06):
        assert ex.check_ceiling_prediction(f * once, repeat).passed is False
        assert ex.check_ceiling_prediction(once, f * repeat).passed is False
    # the ring buffer keeps the tokens shared.generation.KVCache(window, sinks) keeps
    ring, cache = RingOK(window=3, sinks=2), KVCache(window=3, sinks=2)
    for p in range(9):
        k = torch.full((1, 1, 1, 1), float(p))
        K_ring, _ = ring.update(k, k)
        cache.update(k, k)
        assert sorted(K_ring.flatten().tolist()) == cache.K.flatten().tolist()


def test_left_padding_solution_equals_each_sequence_alone():
    """A padded batch, prefill + a chunk + decode steps through plain-tensor caches with pad_ok's
    positions and mask, gives each real token the output LlamaStyleAttention gives its sequence
    alone; with plain column positions and no padding mask it does not."""
    torch.manual_seed(0)
    layer = LlamaStyleAttention(24, num_heads=6, num_kv_heads=2).double().eval()
    lengths, extra = (5, 2, 4), 4  # prompt lengths; then a chunk of 2 and 2 decode steps
    width = max(lengths)
    xs = [torch.randn(1, n + extra, 24, dtype=torch.float64) for n in lengths]
    x = torch.zeros(3, width + extra, 24, dtype=torch.float64)
    mask = torch.zeros(3, width + extra, dtype=torch.long)
    for b, n in enumerate(lengths):
        x[b, width - n:] = xs[b][0]
        mask[b, width - n:] = 1

    def run(step):
        H, H_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        K = V = torch.zeros(3, H_kv, 0, d, dtype=torch.float64)
        outs = []
        for a, b in ((0, width), (width, width + 2), (width + 2, width + 3), (width + 3, width + 4)):
            positions, allowed = step(mask[:, :b], b - a)
            xb = x[:, a:b]
            Q = _split(layer, layer.q_proj(xb), H)
            k = _split(layer, layer.k_proj(xb), H_kv)
            Q = torch.stack([apply_rope(Q[i], positions[i], layer.rope_base) for i in range(3)])
            k = torch.stack([apply_rope(k[i], positions[i], layer.rope_base) for i in range(3)])
            K, V = torch.cat([K, k], dim=2), torch.cat([V, _split(layer, layer.v_proj(xb), H_kv)], dim=2)
            ctx = F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed, enable_gqa=True)
            outs.append(layer.o_proj(ctx.transpose(1, 2).reshape(3, b - a, H * d)))
        return torch.cat(outs, dim=1)

    with torch.no_grad():
        alone = [layer(xs[b])[0] for b in range(3)]
        right, wrong = run(pad_loops), run(lambda m, T_new: (pad_columns(m, T_new)[0],
                                                             pad_causal_only(m, T_new)[1]))
    for b, n in enumerate(lengths):
        assert torch.allclose(right[b, width - n:], alone[b])
        if n < width:
            assert not torch.allclose(wrong[b, width - n:], alone[b])


def test_left_padding_mistakes_are_told_apart_on_the_hidden_cases():
    """The hinted position mistakes differ from each other and from the right positions on the
    real tokens of the hidden cases; so do the hinted mask mistakes."""
    runs = [(m[:, :b], b - a) for m, passes, _ in nb08._pad_cases() for a, b in passes]

    def real_rows(index, **flags):
        return [nb08._pad_reference(m, T, **flags)[index][m[:, -T:] == 1].tolist() for m, T in runs]

    positions = [real_rows(0, positions=k) for k in ("ok", "cols", "one", "zero")]
    combos = [c for c in itertools.product(*nb08._PAD_OPTIONS.values()) if c != ("inverted", "none")]
    masks = [real_rows(1, **dict(zip(nb08._PAD_OPTIONS, c, strict=True))) for c in combos]
    for group in (positions, masks):
        for u, v in itertools.combinations(group, 2):
            assert u != v


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_llama_step_fix(step_ok)
    ex.check_sink_ring_cache(RingOK)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002


def test_predictions_hold_for_the_torch_layer():
    """8.1: each planted bug alone, on LlamaStyleAttention (H = 8), prefill 4 then 3 decode steps
    (H_kv = 2, 1) or prefill 4, a chunk of 2, a decode step (H_kv = 2), first differs where
    PREDICTED says. 8.4: with RoPE, positions that count the padding leave
    the real tokens' scores as they are (a shared shift), a mask that shows the padding does not."""
    torch.manual_seed(1)
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    decode_only, with_chunk = ((0, 4), (4, 5), (5, 6), (6, 7)), ((0, 4), (4, 6), (6, 7))
    bugs = (_step(positions="q_in_pass"), _step(heads="repeat"), _step(mask="is_causal_if_many"))  # LINES' order
    runs = ((2, decode_only), (1, decode_only), (2, with_chunk))
    for (i, step), (j, (H_kv, passes)) in itertools.product(enumerate(bugs), enumerate(runs)):
        layer = LlamaStyleAttention(32, num_heads=8, num_kv_heads=H_kv).double().eval()
        Kc = Vc = torch.zeros(1, H_kv, 0, 4, dtype=torch.float64)
        outs = []
        with torch.no_grad():
            for a, b in passes:
                out, Kc, Vc = step(layer, x[:, a:b], Kc, Vc)
                outs.append(out)
            diff = (torch.cat(outs, dim=1) - layer(x)).abs().amax(dim=(0, 2))
        first = ("prefill" if diff[:4].max() > 1e-6 else "chunk" if passes is with_chunk and diff[4:6].max() > 1e-6
                 else "decode" if diff.max() > 1e-6 else "never")
        assert first == PREDICTED[i][j], (i, H_kv, diff)
    q, k = torch.randn(2, 5, 8, dtype=torch.float64).unbind(0)
    pos = torch.arange(5)
    assert torch.allclose(apply_rope(q, pos) @ apply_rope(k, pos).T, apply_rope(q, pos + 3) @ apply_rope(k, pos + 3).T)
    # learned absolute positions: adding the embeddings of shifted positions changes the scores
    P = torch.randn(8, 8, dtype=torch.float64)
    assert not torch.allclose((q + P[pos]) @ (k + P[pos]).T, (q + P[pos + 3]) @ (k + P[pos + 3]).T)


def test_llama_step_prediction_prints_a_shared_hint_once(capsys):
    """Both guesses for the mask bug wrong share one reasoning hint: it is printed once, not twice."""
    C.check_llama_step_prediction(LINES, [*PREDICTED[:2], ("decode", "decode", "chunk")])
    out = capsys.readouterr().out
    shared_hint = nb08._MASK_HINT
    assert out.count(shared_hint) == 1, out
