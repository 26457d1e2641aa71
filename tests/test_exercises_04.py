"""The checkers of notebook 04 (shared.exercises.nb04): each accepts a correct answer, says "not
attempted yet" for the shipped stub, and rejects typical wrong answers with the hint that names the
mistake. The answers here are written independently of the checkers (PyTorch's SDPA and
nn.MultiheadAttention, and hand-derived counts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared import exercises as ex
from shared.exercises import nb04
from shared.heads import merge_heads, split_heads
from tests.checker_helpers import case_id

NA, OK = "not attempted yet", "correct!"


def stub(*args, **kwargs):
    # TODO: your code here
    return None


# 4.1 ------------------------------------------------------------------------------------------
def mh(X, W_q, W_k, W_v, W_o, num_heads, *, v_view=False, div=None, mask="causal", dim=-1,
       merge="transpose", v_split_noncontig=False):
    """Causal multi-head attention, written the notebook's way, with switches for the mistakes."""
    B, T, _ = X.shape
    Q, K = split_heads(X @ W_q, num_heads), split_heads(X @ W_k, num_heads)
    V = (X @ W_v).view(B, num_heads, T, -1) if v_view else split_heads(X @ W_v, num_heads)
    d_k = Q.shape[-1]
    scores = Q @ K.transpose(-2, -1) / (math.sqrt(d_k) if div is None else div(X, W_q, W_v, num_heads))
    may_attend = torch.ones(T, T, dtype=torch.bool).tril()
    if mask == "causal":
        scores = scores.masked_fill(~may_attend, float("-inf"))
    elif mask == "inverted":
        scores = scores.masked_fill(may_attend, float("-inf"))
    context = torch.softmax(scores, dim=dim) @ V  # (B, H, T, d_v)
    if merge == "mean":  # each head through its own rows of W_o, then averaged over heads
        return torch.stack([context[:, h] @ W_o[h * V.shape[-1]:(h + 1) * V.shape[-1]]
                            for h in range(num_heads)]).mean(dim=0)
    return (context.reshape(B, T, -1) if merge == "reshape" else merge_heads(context)) @ W_o


def mh_ok(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads)


def mh_sdpa_float32(X, W_q, W_k, W_v, W_o, num_heads):
    X, W_q, W_k, W_v, W_o = (t.float() for t in (X, W_q, W_k, W_v, W_o))
    q, k, v = (split_heads(X @ W, num_heads) for W in (W_q, W_k, W_v))
    return merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)) @ W_o


def mh_buggy(X, W_q, W_k, W_v, W_o, num_heads):  # the code as shipped in the notebook
    return mh(X, W_q, W_k, W_v, W_o, num_heads, v_view=True, merge="mean",
              div=lambda X, W_q, W_v, H: math.sqrt(W_q.shape[1]))


def mh_only_v_fixed(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, merge="mean",
              div=lambda X, W_q, W_v, H: math.sqrt(W_q.shape[1]))


def mh_merge_left(X, W_q, W_k, W_v, W_o, num_heads):  # the planted mean over heads kept
    return mh(X, W_q, W_k, W_v, W_o, num_heads, merge="mean")


def mh_merge_reshape(X, W_q, W_k, W_v, W_o, num_heads):  # a new mistake: merge without transpose
    return mh(X, W_q, W_k, W_v, W_o, num_heads, merge="reshape")


def mh_concat_then_mean(X, W_q, W_k, W_v, W_o, num_heads):  # "fixed" the mean by concat @ W_o / H
    return mh(X, W_q, W_k, W_v, W_o, num_heads) / num_heads


def mh_scale_d_in(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, div=lambda X, W_q, W_v, H: math.sqrt(X.shape[-1]))


def mh_scale_d_v(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads,
              div=lambda X, W_q, W_v, H: math.sqrt(W_v.shape[1] // H))


def mh_scale_no_root(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, div=lambda X, W_q, W_v, H: W_q.shape[1] // H)


def mh_unscaled(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, div=lambda *a: 1.0)


def mh_inverted_mask(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, mask="inverted")


def mh_no_mask(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, mask="none")


def mh_softmax_dim(X, W_q, W_k, W_v, W_o, num_heads):
    return mh(X, W_q, W_k, W_v, W_o, num_heads, dim=-2)


def mh_merge_view_error(X, W_q, W_k, W_v, W_o, num_heads):  # .view after transpose raises
    B, T, _ = X.shape
    q, k, v = (split_heads(X @ W, num_heads) for W in (W_q, W_k, W_v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).view(B, T, -1) @ W_o


def mh_in_place(X, W_q, W_k, W_v, W_o, num_heads):
    W_q /= math.sqrt(W_q.shape[1] // num_heads)  # scales the caller's matrix
    return mh(X, W_q, W_k, W_v, W_o, num_heads, div=lambda *a: 1.0)


def mh_with_weights(X, W_q, W_k, W_v, W_o, num_heads):
    return mh_ok(X, W_q, W_k, W_v, W_o, num_heads), None


def mh_other(X, W_q, W_k, W_v, W_o, num_heads):
    return mh_ok(X, W_q, W_k, W_v, W_o, num_heads) * 1.1


# 4.2 ------------------------------------------------------------------------------------------
def dup_weights(V, T, *, same=None, step=None, bos=None, self_penalty=None, scale=1.0):
    """W_q, W_k with the four score terms of the duplicate-token head (None = a sensible value).

    Features of a query/key: V for "same token", 1 for position/BOS terms, T for "itself"."""
    d_k = V + 1 + T
    u = math.sqrt(d_k)
    step = 5 * u if step is None else step
    bos = step * T + 5 * u if bos is None else bos
    same = bos + 5 * u if same is None else same
    self_penalty = 2 * (same + bos + step * T) if self_penalty is None else self_penalty
    W_q, W_k = np.zeros((V + T, d_k)), np.zeros((V + T, d_k))
    W_q[:V, :V] = same * np.eye(V)  # query: its token, scaled
    W_k[:V, :V] = np.eye(V)  # key: its token
    W_q[V:, V] = 1.0  # the position one-hots sum to 1: a constant feature for every query
    positions = np.arange(T)
    W_k[V:, V] = step * positions  # later keys score higher
    W_k[0, V] += bos  # BOS's key: a bonus
    W_q[V:, V + 1:] = -self_penalty * np.eye(T)  # query i: -penalty on key i ...
    W_k[V:, V + 1:] = np.eye(T)  # ... which carries its one-hot position
    return W_q * scale, W_k


def dup_ok(vocab_size, T):
    return dup_weights(vocab_size, T)


def dup_torch(vocab_size, T):
    return tuple(torch.tensor(w, dtype=torch.float32) for w in dup_weights(vocab_size, T))


def dup_weak(vocab_size, T):
    return dup_weights(vocab_size, T, scale=0.05)


def dup_no_self_penalty(vocab_size, T):
    return dup_weights(vocab_size, T, self_penalty=0.0)


def dup_no_recency(vocab_size, T):
    return dup_weights(vocab_size, T, step=0.0, bos=50.0)


def dup_oldest_first(vocab_size, T):  # position score falls with the key's position
    u = math.sqrt(vocab_size + 1 + T)
    return dup_weights(vocab_size, T, step=-5 * u, bos=5 * u, same=5 * u * T + 10 * u,
                       self_penalty=1e4)


def dup_bos_too_big(vocab_size, T):
    W_q, W_k = dup_weights(vocab_size, T)
    W_k[0, vocab_size] *= 10
    return W_q, W_k


def dup_no_bos(vocab_size, T):
    return dup_weights(vocab_size, T, bos=0.0)


def dup_no_bos_no_step(vocab_size, T):  # unmatched queries tie BOS with every other key
    return dup_weights(vocab_size, T, bos=0.0, step=0.0)


def dup_same_too_small(vocab_size, T):  # the token match does not beat BOS
    return dup_weights(vocab_size, T, same=1.0)


def dup_transposed(vocab_size, T):
    W_q, W_k = dup_weights(vocab_size, T)
    return W_q.T, W_k.T


def dup_inf(vocab_size, T):
    W_q, W_k = dup_weights(vocab_size, T)
    W_q[0, 0] = np.inf
    return W_q, W_k


def dup_overflow(vocab_size, T):
    W_q, W_k = dup_weights(vocab_size, T)
    return W_q * 1e200, W_k * 1e200  # finite, but the scores overflow


def dup_one_matrix(vocab_size, T):
    return dup_weights(vocab_size, T)[0]


# 4.3 ------------------------------------------------------------------------------------------
def params_ok(config):
    d, H = config["hidden_size"], config["num_attention_heads"]
    H_kv, bias = config["num_key_value_heads"], config["attention_bias"]
    hd = config["head_dim"] or d // H
    q_proj = torch.nn.Linear(d, H * hd, bias=bias)  # counted by PyTorch itself
    kv_proj = torch.nn.Linear(d, H_kv * hd, bias=bias)
    o_proj = torch.nn.Linear(H * hd, d, bias=bias)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return n(q_proj) + 2 * n(kv_proj) + n(o_proj)


def params_float(config):
    return float(params_ok(config))


def params_text(config):
    return str(params_ok(config))


def params_fixed(config):
    return 2_362_368


def params_no_gqa(config):
    return params_ok({**config, "num_key_value_heads": config["num_attention_heads"]})


def params_kv_width(config):  # hidden_size // num_key_value_heads as the width of W_k, W_v
    d, H, H_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd = config["head_dim"] or d // H
    b = config["attention_bias"]
    kv = d // H_kv
    return d * H * hd + 2 * d * kv + H * hd * d + (H * hd + 2 * kv + d if b else 0)


def params_ignores_head_dim(config):
    return params_ok({**config, "head_dim": None})


def params_no_out_proj(config):
    d, H, H_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd = config["head_dim"] or d // H
    b = config["attention_bias"]
    return d * H * hd + 2 * d * H_kv * hd + (H * hd + 2 * H_kv * hd if b else 0)


def params_no_bias(config):
    return params_ok({**config, "attention_bias": False})


def params_always_bias(config):
    return params_ok({**config, "attention_bias": True})


def params_o_bias_wrong(config):
    d, H = config["hidden_size"], config["num_attention_heads"]
    hd = config["head_dim"] or d // H
    return params_ok(config) + ((H * hd - d) if config["attention_bias"] else 0)


def params_square_o(config):  # W_o taken as hidden_size x hidden_size
    d, H = config["hidden_size"], config["num_attention_heads"]
    hd = config["head_dim"] or d // H
    return params_ok(config) - H * hd * d + d * d


def params_gpt2_formula(config):  # 4 d^2 + 4 d: right for GPT-2 only
    d = config["hidden_size"]
    return 4 * d * d + (4 * d if config["attention_bias"] else 0)


def params_other(config):  # no named mistake: W_o counted twice
    d, H = config["hidden_size"], config["num_attention_heads"]
    return params_ok(config) + H * (config["head_dim"] or d // H) * d


def params_raises(config):
    return config["num_kv_heads"]  # a key the config does not have


# 4.3's prediction by hand, each over 4 d^2. Llama 3 8B: W_q, W_o 4096 x 4096 each; W_k, W_v
# 4096 x (8 * 128). Gemma 7B: W_q, W_k, W_v 3072 x (16 * 256) each, W_o (16 * 256) x 3072.
LLAMA_GQA = 2 * 4096 * 4096 + 2 * 4096 * 8 * 128
LLAMA_MHA = 4 * 4096 * 4096
RATIO = LLAMA_GQA / LLAMA_MHA  # 5/8
GEMMA = 4 * 3072 * 4096
GEMMA_RATIO = GEMMA / (4 * 3072**2)  # 4/3


def ratios(llama=RATIO, gemma=GEMMA_RATIO):
    return {"Llama 3 8B": llama, "Gemma 7B": gemma}


# 4.4 ------------------------------------------------------------------------------------------
def pad_positions(lengths, T, padding_side):
    return torch.stack([torch.arange(T) >= n if padding_side == "right" else torch.arange(T) < T - n
                        for n in lengths])


def pad_ok(lengths, T, causal, padding_side):  # loops, written apart from the checker's reference
    pad = pad_positions(lengths, T, padding_side)
    return [[any(pad[b, j] for j in range(T) if not causal or j <= i) for i in range(T)]
            for b in range(len(lengths))]


def pad_ints(lengths, T, causal, padding_side):
    return np.array(pad_ok(lengths, T, causal, padding_side), dtype=int)


def pad_nan_unchanged(lengths, T, causal, padding_side):  # a query seeing only padding: "unchanged"
    pad = pad_positions(lengths, T, padding_side)
    seen = [[[j for j in range(T) if not causal or j <= i] for i in range(T)] for b in range(len(lengths))]
    return [[any(pad[b, j] for j in seen[b][i]) and not all(pad[b, j] for j in seen[b][i]) for i in range(T)]
            for b in range(len(lengths))]


def pad_only(lengths, T, causal, padding_side):
    return pad_positions(lengths, T, padding_side)


def pad_real_only(lengths, T, causal, padding_side):
    pad = pad_positions(lengths, T, padding_side)
    return ~pad & pad.any(-1, keepdim=True)


def pad_ignores_causal(lengths, T, causal, padding_side):
    return pad_ok(lengths, T, False, padding_side)


def pad_strict(lengths, T, causal, padding_side):
    pad = pad_positions(lengths, T, padding_side)
    return [[any(pad[b, j] for j in range(T) if not causal or j < i) for i in range(T)]
            for b in range(len(lengths))]


def pad_swapped(lengths, T, causal, padding_side):
    return pad_ok(lengths, T, causal, {"left": "right", "right": "left"}[padding_side])


def pad_all(lengths, T, causal, padding_side):
    return torch.ones(len(lengths), T, dtype=torch.bool)


def pad_none(lengths, T, causal, padding_side):
    return torch.zeros(len(lengths), T, dtype=torch.bool)


def pad_other(lengths, T, causal, padding_side):
    out = torch.tensor(pad_ok(lengths, T, causal, padding_side))
    out[0, 0] = ~out[0, 0]
    return out


def pad_wrong_shape(lengths, T, causal, padding_side):
    return torch.tensor(pad_ok(lengths, T, causal, padding_side)).T


def pad_counts(lengths, T, causal, padding_side):
    return np.array(pad_ok(lengths, T, causal, padding_side), dtype=int) * 2


def buggy_as_in_the_notebook(X, W_q, W_k, W_v, W_o, num_heads):
    """Exercise 4.1's buggy function, copied from the notebook."""
    B, T, _ = X.shape
    Q = (X @ W_q).view(B, T, num_heads, -1).transpose(1, 2)
    K = (X @ W_k).view(B, T, num_heads, -1).transpose(1, 2)
    V = (X @ W_v).view(B, num_heads, T, -1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(W_q.shape[1])
    may_attend = torch.ones(T, T, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~may_attend, float("-inf")), dim=-1)
    context = weights @ V
    return (context @ W_o.view(num_heads, context.shape[-1], -1)).mean(dim=1)


def _buggy_agrees_with_sdpa(num_heads):
    """Measured with PyTorch's SDPA, independently of the checker: float64, 3 random cases."""
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        X = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
        W_q, W_k = (torch.randn(7, 4 * num_heads, generator=g, dtype=torch.float64) for _ in range(2))
        W_v = torch.randn(7, 3 * num_heads, generator=g, dtype=torch.float64)
        W_o = torch.randn(3 * num_heads, 6, generator=g, dtype=torch.float64)
        q, k, v = (split_heads(X @ W, num_heads) for W in (W_q, W_k, W_v))
        ref = merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)) @ W_o
        if (buggy_as_in_the_notebook(X, W_q, W_k, W_v, W_o, num_heads) - ref).abs().max() > 1e-6:
            return False
    return True


MEASURED = {h: _buggy_agrees_with_sdpa(h) for h in (1, 3)}
FLIPPED_1 = {1: not MEASURED[1], 3: MEASURED[3]}
FLIPPED_3 = {1: MEASURED[1], 3: not MEASURED[3]}
FLIPPED_BOTH = {1: not MEASURED[1], 3: not MEASURED[3]}

CASES = [
    (ex.check_bug_prediction, (MEASURED,), True, "measured: num_heads = 1 agrees, num_heads = 3 differs"),
    (ex.check_bug_prediction, ({1: np.bool_(MEASURED[1]), 3: np.bool_(MEASURED[3])},), True, OK),
    (ex.check_bug_prediction, ({1: None, 3: None},), None, NA),
    (ex.check_bug_prediction, ({1: True, 3: None},), None, "both are filled in"),
    (ex.check_bug_prediction, (FLIPPED_1,), False, "your guess for num_heads = 1 was off: with one head"),
    (ex.check_bug_prediction, (FLIPPED_3,), False, "your guess for num_heads = 3 was off: with three heads"),
    (ex.check_bug_prediction, (FLIPPED_BOTH,), False, "num_heads = 1 and 3 were off"),
    (ex.check_bug_prediction, ({1: "yes", 3: False},), False, "write True or False for num_heads = 1"),
    (ex.check_bug_prediction, ({2: True, 4: False},), False, "the keys 1 and 3"),
    (ex.check_fixed_multi_head, (mh_ok,), True, OK),
    (ex.check_fixed_multi_head, (mh_sdpa_float32,), True, OK),
    (ex.check_fixed_multi_head, (stub,), None, NA),
    (ex.check_fixed_multi_head, (mh_buggy,), False, "3 of the 3 planted bugs are still there"),
    (ex.check_fixed_multi_head, (mh_only_v_fixed,), False, "2 of the 3 planted bugs are still there; look again at the scaling of the scores and at how the heads are joined again"),
    (ex.check_fixed_multi_head, (mh_merge_left,), False, "1 of the 3 planted bugs is still there; look again at how the heads are joined again"),
    (ex.check_fixed_multi_head, (mh_merge_reshape,), False, "look again at how the heads are joined again"),
    (ex.check_fixed_multi_head, (mh_concat_then_mean,), False, "1 of the 3 planted bugs is still there; look again at how the heads are joined again"),
    (ex.check_fixed_multi_head, (mh_scale_d_in,), False, "look again at the scaling of the scores"),
    (ex.check_fixed_multi_head, (mh_scale_d_v,), False, "look again at the scaling of the scores"),
    (ex.check_fixed_multi_head, (mh_scale_no_root,), False, "look again at the scaling of the scores"),
    (ex.check_fixed_multi_head, (mh_unscaled,), False, "look again at the scaling of the scores"),
    (ex.check_fixed_multi_head, (mh_inverted_mask,), False, "(~may_attend)"),
    (ex.check_fixed_multi_head, (mh_no_mask,), False, "look again at the mask"),
    (ex.check_fixed_multi_head, (mh_softmax_dim,), False, "look again at the softmax"),
    (ex.check_fixed_multi_head, (mh_merge_view_error,), False, "on X (2, 5, 7), num_heads = 3"),
    (ex.check_fixed_multi_head, (mh_in_place,), False, "changed W_q in place"),
    (ex.check_fixed_multi_head, (mh_other,), False, "not in a way the checker recognises"),
    (ex.check_fixed_multi_head, (mh_with_weights,), False, "not a tuple"),
    (ex.check_duplicate_token_head, (dup_ok,), True, OK),
    (ex.check_duplicate_token_head, (dup_torch,), True, OK),
    (ex.check_duplicate_token_head, (stub,), None, NA),
    (ex.check_duplicate_token_head, (dup_weak,), False, "the right key, but not 0.9"),
    (ex.check_duplicate_token_head, (dup_no_self_penalty,), False, "on itself"),
    (ex.check_duplicate_token_head, (dup_no_recency,), False, "the most recent must win"),
    (ex.check_duplicate_token_head, (dup_oldest_first,), False, "the most recent must win"),
    (ex.check_duplicate_token_head, (dup_bos_too_big,), False, "must score higher than BOS"),
    (ex.check_duplicate_token_head, (dup_no_bos,), False, "should rest on BOS"),
    (ex.check_duplicate_token_head, (dup_no_bos_no_step,), False, "nothing in your scores sets BOS apart"),
    (ex.check_duplicate_token_head, (dup_same_too_small,), False, "must score higher than BOS"),
    (ex.check_duplicate_token_head, (dup_transposed,), False, "looks transposed"),
    (ex.check_duplicate_token_head, (dup_inf,), False, "not inf"),
    (ex.check_duplicate_token_head, (dup_one_matrix,), False, "return the pair (W_q, W_k)"),
    (ex.check_duplicate_token_head, (dup_overflow,), False, "overflow to inf"),
    (ex.check_gqa_prediction, (ratios(),), True, f"Llama 3 8B {LLAMA_GQA:,} against 4 d^2 = {LLAMA_MHA:,}; Gemma 7B {GEMMA:,}"),
    (ex.check_gqa_prediction, (ratios(5 / 8 + 0.004, 1.335),), True, OK),
    (ex.check_gqa_prediction, (ratios(torch.tensor(0.625), 4 / 3),), True, OK),
    (ex.check_gqa_prediction, (None,), None, NA),
    (ex.check_gqa_prediction, (ratios(..., ...),), None, NA),
    (ex.check_gqa_prediction, (ratios(0.625, None),), None, "'Gemma 7B' in my_ratio too"),
    (ex.check_gqa_prediction, (ratios(llama=1),), False, "Llama 3 8B: grouped-query attention has fewer"),
    (ex.check_gqa_prediction, (ratios(llama=8 / 32),), False, "you shrank all four matrices"),
    (ex.check_gqa_prediction, (ratios(llama=(1 + 1 + 1 + 0.25) / 4),), False, "you shrank one of W_k and W_v"),
    (ex.check_gqa_prediction, (ratios(llama=(1 + 3 * 0.25) / 4),), False, "you shrank W_q or W_o as well"),
    (ex.check_gqa_prediction, (ratios(llama=1 / RATIO),), False, "Llama 3 8B: your ratio is upside down"),
    (ex.check_gqa_prediction, (ratios(gemma=1),), False, "Gemma 7B: the config gives head_dim"),
    (ex.check_gqa_prediction, (ratios(gemma=(4096 / 3072) ** 2),), False, "keeps hidden_size on one side"),
    (ex.check_gqa_prediction, (ratios(gemma=(3 * 4 / 3 + 1) / 4),), False, "W_o widens too"),
    (ex.check_gqa_prediction, (ratios(gemma=(4 / 3 + 3) / 4),), False, "only W_q is wider in your count"),
    (ex.check_gqa_prediction, (ratios(gemma=(3 * 4 / 3 + 16 / 9) / 4),), False, "not square in the heads' width"),
    (ex.check_gqa_prediction, (ratios(gemma=0.75),), False, "Gemma 7B: your ratio is upside down"),
    (ex.check_gqa_prediction, (ratios(1, 1),), False, "Llama 3 8B: grouped-query attention has fewer key/value heads: something in the layer shrinks; Gemma 7B: the config"),
    (ex.check_gqa_prediction, (ratios(gemma=1.2),), False, "Gemma 7B: write the size of each of W_q"),
    (ex.check_gqa_prediction, (0.625,), False, "my_ratio must be a dict with the keys"),
    (ex.check_gqa_prediction, (ratios(gemma="1.33"),), False, "must be a positive number"),
    (ex.check_gqa_prediction, (ratios(llama=True),), False, "must be a positive number"),
    (ex.check_padding_changes, (pad_ok,), True, "only the padding rows change"),
    (ex.check_padding_changes, (pad_ints,), True, OK),
    (ex.check_padding_changes, (stub,), None, NA),
    (ex.check_padding_changes, (pad_only,), False, "you marked the padding positions"),
    (ex.check_padding_changes, (pad_real_only,), False, "the padding positions are queries too"),
    (ex.check_padding_changes, (pad_ignores_causal,), False, "can a real token see padding that comes after"),
    (ex.check_padding_changes, (pad_strict,), False, "keeps the diagonal"),
    (ex.check_padding_changes, (pad_swapped,), False, "'left' before them"),
    (ex.check_padding_changes, (pad_nan_unchanged,), False, "gets nan from nn.MultiheadAttention"),
    (ex.check_padding_changes, (pad_all,), False, "a sequence of full length has no padding"),
    (ex.check_padding_changes, (pad_none,), False, "their outputs change"),
    (ex.check_padding_changes, (pad_other,), False, "sequence 0 (length 6) is wrong"),
    (ex.check_padding_changes, (pad_wrong_shape,), False, "expected (B, T) = (3, 6)"),
    (ex.check_padding_changes, (pad_counts,), False, "return True/False"),
    (ex.check_attention_parameters, (params_ok,), True, "2,362,368"),
    # the second count comes with its config, which the learner never saw: 512^2 + 2 * 512 * 128 + 512^2
    (ex.check_attention_parameters, (params_ok,), True, "d = 512, H = 8, H_kv = 2, head_dim = 64 and no biases: 655,360"),
    (ex.check_attention_parameters, (params_float,), True, OK),
    (ex.check_attention_parameters, (stub,), None, NA),
    (ex.check_attention_parameters, (params_text,), False, "not a string"),
    (ex.check_attention_parameters, (params_fixed,), False, "for every config"),
    (ex.check_attention_parameters, (params_no_gqa,), False, "not num_attention_heads"),
    (ex.check_attention_parameters, (params_kv_width,), False, "not hidden_size // num_key_value_heads"),
    (ex.check_attention_parameters, (params_ignores_head_dim,), False, "when the config gives head_dim"),
    (ex.check_attention_parameters, (params_no_out_proj,), False, "forgot the output projection"),
    (ex.check_attention_parameters, (params_no_bias,), False, "forgot the biases"),
    (ex.check_attention_parameters, (params_always_bias,), False, "no bias vectors at all"),
    (ex.check_attention_parameters, (params_o_bias_wrong,), False, "one entry per OUTPUT feature"),
    (ex.check_attention_parameters, (params_square_o,), False, "not hidden_size (they differ"),
    (ex.check_attention_parameters, (params_gpt2_formula,), False, "which ignores num_key_value_heads"),
    (ex.check_attention_parameters, (params_other,), False, "which is not the count"),
    (ex.check_attention_parameters, (params_raises,), False, "on the config {'hidden_size': 768"),
]


@pytest.fixture(autouse=True)
def fresh_hints():
    """4.2's hints are graded (a repeated mistake gets a more specific one): start each test fresh."""
    nb04._HINTS_GIVEN.clear()
    yield
    nb04._HINTS_GIVEN.clear()


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[case_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result = checker(*answers)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert result.passed is expected, out
    assert phrase in out, out
    assert out.startswith({True: OK, False: "not quite:", None: NA}[expected]), out


def test_every_checker_is_covered():
    for name in nb04.__all__:
        results = [c[2] for c in CASES if c[0].__name__ == name]
        assert True in results and None in results and results.count(False) >= 4, name


def test_odd_answers_never_crash(capsys):
    for name in nb04.__all__:
        for answer in (None, 3, "text", lambda *a: "text", lambda *a: (1, 2), lambda *a: np.zeros(0)):
            result = getattr(ex, name)(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False) and out.count("\n") == 1, (name, out)


def test_multi_head_variants_are_all_different_on_every_hidden_case():
    """No two mistakes 4.1 can name give the same output on a hidden case (else a hint could lie)."""
    rng = nb04._rng(401)
    for case in nb04._MH_CASES:
        args = nb04._multi_head_case(rng, case)
        outs = [nb04._multi_head_variant(*args, case[3], *v) for v in nb04._VARIANTS]
        for i in range(len(outs)):
            for j in range(i + 1, len(outs)):
                assert not nb04._close(outs[i], outs[j]), (case, nb04._VARIANTS[i], nb04._VARIANTS[j])


def test_multi_head_reference_is_pytorchs():
    """The checker's reference (float64 NumPy) equals SDPA on the split heads."""
    rng = nb04._rng(0)
    for case in nb04._MH_CASES:
        args = nb04._multi_head_case(rng, case)
        ref = nb04._multi_head_variant(*args, case[3], *nb04._RIGHT)
        ours = mh_sdpa_float32(*(torch.from_numpy(a).double() for a in args), case[3])
        assert np.allclose(ref, ours.numpy(), atol=1e-5)


def test_config_mistakes_are_distinguishable():
    """Each named mistake gives its own vector of counts over the hidden configs, never the right
    one, and the hand-derived counts hold: GPT-2 small 4 d^2 + 4 d, the GQA config by hand."""
    refs = [nb04.attention_parameter_count(c) for c in nb04._CONFIG_CASES]
    assert refs == [params_ok(c) for c in nb04._CONFIG_CASES]
    assert refs[0] == 4 * 768 ** 2 + 4 * 768 == 2_362_368
    assert refs[1] == 512 * 512 + 2 * 512 * 2 * 64 + 512 * 512  # W_q, W_k and W_v (2 heads), W_o
    table = [nb04._config_mistakes(c) for c in nb04._CONFIG_CASES]
    vectors = [tuple(t[k][1] if t[k][1] is not None else r for t, r in zip(table, refs, strict=True))
               for k in range(len(table[0]))]
    assert len(set(vectors)) == len(vectors)
    assert tuple(refs) not in vectors


def test_duplicate_token_target_by_hand():
    assert nb04.duplicate_token_target([0, 1, 2, 1, 3, 1, 2]).tolist() == [0, 0, 0, 1, 0, 3, 2]
    X = nb04.duplicate_token_inputs([0, 2, 1], 3)
    assert X.tolist() == [[1, 0, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0], [0, 1, 0, 0, 0, 1]]


@pytest.mark.parametrize("answer, first, more", [
    (dup_no_self_penalty, "on itself", "the one-hot positions can name it, in columns"),
    (dup_no_recency, "the most recent must win", "grows with it, in columns of W_q and W_k of their own"),
    (dup_weak, "too close together", "scale W_q or W_k up"),
    (dup_no_bos, "should rest on BOS", "BOS's key must outscore every other key"),
    (dup_no_bos_no_step, "sets BOS apart", "a sum of terms, each built from its own columns"),
    (dup_same_too_small, "must score higher than BOS", "the match must be the larger"),
])
def test_duplicate_token_hints_are_graded(capsys, answer, first, more):
    """The first hint names the kind of mistake; the same mistake again adds a specific pointer."""
    ex.check_duplicate_token_head(answer)
    once = capsys.readouterr().out
    ex.check_duplicate_token_head(answer)
    twice = capsys.readouterr().out
    assert first in once and more not in once and "more specific hint" in once, once
    assert first in twice and more in twice, twice


def test_padding_reference_is_measured_with_nn_multihead_attention():
    """On every hidden batch, nn.MultiheadAttention with random weights, run without and with
    key_padding_mask, changes exactly the outputs the checker's reference names (a query whose
    keys are all padding gives nan: changed too)."""
    torch.manual_seed(0)
    for lengths, T, causal, side in nb04._PAD_CASES:
        layer = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
        x = torch.randn(len(lengths), T, 8)
        blocked = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = blocked
        pad = pad_positions(lengths, T, side)
        with torch.no_grad():
            before = layer(x, x, x, attn_mask=blocked, need_weights=False)[0]
            after = layer(x, x, x, attn_mask=blocked, key_padding_mask=pad, need_weights=False)[0]
        diff = (after - before).abs().amax(-1)
        changed = diff.isnan() | (diff > 1e-4)
        assert ((diff < 1e-6) | changed).all()  # every output either kept or clearly moved
        assert changed.tolist() == nb04._changed_variant(lengths, T, causal, side).tolist()
        assert changed.tolist() == pad_ok(lengths, T, causal, side)


def test_padding_mistakes_are_distinguishable():
    """Each named way of reasoning gives its own answers on the hidden batches, never the right ones."""
    def answers(how):
        return tuple(nb04._changed_variant(*case, how=how).tobytes() for case in nb04._PAD_CASES)

    table = [answers(how) for how in nb04._PAD_MISTAKES]
    assert len(set(table)) == len(table) and answers("right") not in table


def test_gqa_mistake_ratios_are_distinct():
    for cfg, right in ((nb04.LLAMA3_8B, RATIO), (nb04.GEMMA_7B, GEMMA_RATIO)):
        values = [v for _, v in nb04._ratio_mistakes(cfg)] + [right]
        assert min(abs(a - b) for i, a in enumerate(values) for b in values[i + 1:]) > 0.05
    assert nb04.attention_parameter_count(nb04.LLAMA3_8B) == LLAMA_GQA
    assert nb04.attention_parameter_count(nb04.GEMMA_7B) == GEMMA


def test_gqa_hints_never_give_the_ratio(capsys):
    """A wrong prediction gets a hint and no counts: the right ratio and the counts stay hidden."""
    for cfg in (nb04.LLAMA3_8B, nb04.GEMMA_7B):
        for _, value in nb04._ratio_mistakes(cfg):
            wrong = ratios(llama=value) if cfg is nb04.LLAMA3_8B else ratios(gemma=value)
            assert nb04.check_gqa_prediction(wrong).passed is False
            out = capsys.readouterr().out
            for secret in ("0.625", "5/8", "1.333", "4/3", f"{LLAMA_GQA:,}", f"{GEMMA:,}", "counted"):
                assert secret not in out, out


GRADED_4_1 = [
    (mh_merge_left, "1 of the 3 planted bugs is still there; look again at how the heads are joined again", "num_heads times too small"),
    (mh_merge_reshape, "look again at how the heads are joined again", "interleaves tokens and heads"),
    (mh_scale_d_in, "look again at the scaling of the scores", "divided by sqrt(d_in)"),
    (mh_scale_d_v, "look again at the scaling of the scores", "divided by sqrt(d_v)"),
    (mh_scale_no_root, "look again at the scaling of the scores", "by d_k without the square root"),
    (mh_unscaled, "look again at the scaling of the scores", "not scaled at all"),
    (mh_no_mask, "look again at the mask", "causal mask is gone"),
    (mh_softmax_dim, "look again at the softmax", "softmax over the wrong dim"),
]


@pytest.mark.parametrize("answer, first, second", GRADED_4_1, ids=lambda x: getattr(x, "__name__", None))
def test_4_1_hints_name_the_step_first_and_the_fix_on_a_repeat(capsys, answer, first, second):
    """Exercise 4.1 is finding the bugs: the first run only points at the wrong steps."""
    ex.check_fixed_multi_head(answer)
    out = capsys.readouterr().out
    assert first in out and second not in out, out
    ex.check_fixed_multi_head(answer)
    out = capsys.readouterr().out
    assert second in out, out


def test_4_1_one_head_prediction_hint_names_no_mechanism(capsys):
    ex.check_bug_prediction(FLIPPED_1)
    out = capsys.readouterr().out
    assert "view" not in out and "reshape" not in out and "H * d_k" not in out, out


# Predictions inside sections 2 and 6 ----------------------------------------------------------
# The true counts, derived by hand: per head 3 projections + QK^T + weights @ V = 5 products, so the
# wrapper runs 5 * 12 = 60; MultiHeadAttention runs the same 5 once, plus out_proj: 6. From 1 head to
# 48 at the same d, QK^T and weights @ V cost 2 T^2 d_head each per head, 4 T^2 (H d_head) = 4 T^2 d
# either way (x1), while the
# weights tensor holds H T^2 numbers (x48).
# by hand: per head the wrapper runs 3 projections + 2 attention products (5H); MultiHeadAttention
# runs those 5 once plus out_proj (6); at d = 768, T = 1024, B = 1: projections 8Td^2, QK^T and
# weights @ V 4T^2 d whatever H; the weights hold H T^2 numbers
CALLS = {1: {"wrapper": {"mm": 3, "addmm": 0, "bmm": 2}, "MultiHeadAttention": {"mm": 3, "addmm": 1, "bmm": 2}},
         2: {"wrapper": 10, "MultiHeadAttention": 6}, 12: {"wrapper": 60, "MultiHeadAttention": 6}}
FLOPS = {n: {"projections": 8 * 1024 * 768**2, "matmul FLOPs": 4 * 1024**2 * 768, "weights": n * 1024**2}
         for n in (1, 12, 48)}


@pytest.mark.parametrize("checker, args, unanswered", [
    (nb04.grade_matmul_prediction, (CALLS,), ...),
    (nb04.grade_matmul_prediction, (CALLS,), {"wrapper": ..., "MultiHeadAttention": ...}),
    (nb04.grade_flop_prediction, (FLOPS,), {"matmul FLOPs": ..., "weights": ...}),
    (nb04.grade_flop_prediction, (FLOPS,), None),
])
def test_section_predictions_say_not_attempted_until_typed(capsys, checker, args, unanswered):
    result = checker(unanswered, *args)
    out = capsys.readouterr().out
    assert result.passed is None and out.startswith("not attempted yet") and "to have them graded" in out, out
    assert "counted" not in out and "H = " not in out and "60" not in out and "48" not in out, out  # nothing shown


@pytest.mark.parametrize("prediction, passed, phrase", [
    ({"wrapper": 60, "MultiHeadAttention": 6}, True, "wrapper 60, MultiHeadAttention 6: both right"),
    ({"wrapper": 60.0, "MultiHeadAttention": np.int64(6)}, True, "both right"),
    ({"wrapper": 60, "MultiHeadAttention": ...}, None, "'MultiHeadAttention' in pred_calls too"),
    ({"wrapper": 5, "MultiHeadAttention": 6}, False, "your count is one head's"),
    ({"wrapper": 36, "MultiHeadAttention": 6}, False, "5 per head, 3 projections + 2 attention products"),
    ({"wrapper": 72, "MultiHeadAttention": 6}, False, "5 per head, 3 projections + 2 attention products"),
    ({"wrapper": 50, "MultiHeadAttention": 6}, False, "a multiple of the number of heads"),
    ({"wrapper": 60, "MultiHeadAttention": 60}, False, "does not grow with the heads"),
    ({"wrapper": 60, "MultiHeadAttention": 5}, False, "out_proj, which the wrapper lacks"),
    ({"wrapper": 60, "MultiHeadAttention": 3}, False, "three projections, QK^T, weights @ V and out_proj"),
    ({"wrapper": "60", "MultiHeadAttention": 6}, False, "not a string"),
    ({"wrapper": 60}, False, "must be a dict with the keys"),
])
def test_matmul_prediction(capsys, prediction, passed, phrase):
    result = nb04.grade_matmul_prediction(prediction, CALLS)
    out = capsys.readouterr().out
    assert result.passed is passed and phrase in out, out
    assert "counted" not in out and "H = " not in out, out  # the counts are the notebook's next cell
    if passed is False and isinstance(prediction.get("wrapper"), int) and prediction["wrapper"] % 12 == 0:
        assert "multiple of the number of heads" not in out, out  # 36 is one: that hint would misfire


@pytest.mark.parametrize("prediction, passed, phrase", [
    ({"matmul FLOPs": 1, "weights": 48}, True, "matmul FLOPs x1, weights x48: both right"),
    ({"matmul FLOPs": 1.05, "weights": torch.tensor(46.0)}, True, "both right"),
    ({"matmul FLOPs": 48, "weights": 48}, False, "H d_head = d whatever H"),
    ({"matmul FLOPs": 1 / 48, "weights": 48}, False, "H d_head = d whatever H"),
    ({"matmul FLOPs": 1, "weights": 1}, False, "every head has its own (T, T) weights"),
    ({"matmul FLOPs": 48, "weights": 1}, False, "whatever H; every head has its own"),
    ({"matmul FLOPs": 1.3, "weights": 48}, False, "H d_head = d whatever H"),
    ({"matmul FLOPs": 1, "weights": ...}, None, "'weights' in pred_factor too"),
    ({"matmul FLOPs": 0, "weights": 48}, False, "must be a positive number"),
    ({"matmul FLOPs": True, "weights": 48}, False, "must be a positive number"),
])
def test_flop_prediction(capsys, prediction, passed, phrase):
    result = nb04.grade_flop_prediction(prediction, FLOPS)
    out = capsys.readouterr().out
    assert result.passed is passed and phrase in out, out
    assert "counted" not in out and "MB" not in out, out  # the counts are the notebook's next cell
    if passed is False and "positive" not in out:
        assert ("H d_head = d" in out) is ("matmul FLOPs" not in prediction or
                                           abs(math.log(prediction["matmul FLOPs"])) > math.log(1.1)), out
        assert ("own (T, T) weights" in out) is (abs(math.log(float(prediction["weights"]) / 48)) > math.log(1.1)), out


def test_flop_hint_counts_both_attention_products(capsys):
    # the typical wrong answer "FLOPs grow with H" gets the per-head count: by hand, QK^T is
    # (T x d_head) @ (d_head x T), 2 T^2 d_head FLOPs, and weights @ V is (T x T) @ (T x d_head),
    # another 2 T^2 d_head: 4 T^2 d_head per head, 4 T^2 d over all heads (FLOPS above)
    assert FLOPS[48]["matmul FLOPs"] == 48 * 4 * 1024**2 * (768 // 48)
    nb04.grade_flop_prediction({"matmul FLOPs": 48, "weights": 48}, FLOPS)
    out = capsys.readouterr().out
    assert "4 T^2 d_head in all" in out, out
    assert "QK^T costs 2 T^2 d_head and weights @ V another 2 T^2 d_head" in out, out
    assert "per head 2 T^2 d_head," not in out, out  # the old, wrong count


def test_section_predictions_are_not_exercise_checkers():
    assert not any(name.startswith("grade_") for name in nb04.__all__)
