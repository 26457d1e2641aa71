"""Every checker in shared.exercises: accepts a reference solution, says "not attempted yet" for the
shipped stub, and rejects typical wrong answers with the right hint (checked on the printed line and
on the return value). The reference solutions here are written independently of the checkers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shared import exercises as ex


def run(capsys, checker, *answer):
    result = checker(*answer)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, f"expected exactly one line, got: {out!r}"
    return result, out


# ---------------------------------------------------------------------------------------------
# Stubs, exactly as shipped in the course notebooks (they must not raise)
# ---------------------------------------------------------------------------------------------
def stub1(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


def transfer_stub(sa_v1, sa_v2):
    # TODO: copy sa_v2's weights into sa_v1
    pass


def patterns_stub(T):
    return {"uniform": None, "peaked": None, "local": None}


# ---------------------------------------------------------------------------------------------
# Reference solutions and typical wrong answers
# ---------------------------------------------------------------------------------------------
def np_softmax(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


# 01 ------------------------------------------------------------------------------------------
# Exercise 1.1: query c = (1, 1) among a = (1, 0), b = (0, 2): scores 1, 2, 2.
E = math.e
PRED_W = [1 / (1 + 2 * E), E / (1 + 2 * E), E / (1 + 2 * E)]
PRED_Z = [PRED_W[0] + PRED_W[2], 2 * PRED_W[1] + PRED_W[2]]
PRED_W4 = [0.1554, 0.4223, 0.4223]  # what a learner types: 4 decimals
PRED_Z4 = [0.5777, 1.2670]


def log_softmax_torch(x):  # PyTorch's own, an independent reference
    return torch.log_softmax(torch.from_numpy(x), dim=-1)


def log_softmax_float32(x):
    return torch.log_softmax(torch.from_numpy(x).float(), dim=-1)


def log_softmax_ok(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def log_of_softmax(x):
    return np.log(np_softmax(x))


def log_softmax_naive(x):
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def log_softmax_min_shift(x):
    z = x - x.min(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def log_softmax_mean_shift(x):
    z = x - x.mean(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def log_softmax_global_max(x):
    z = x - x.max()
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def log_softmax_returns_weights(x):
    return np_softmax(x)


def log_softmax_no_logsumexp(x):
    return x - x.max(axis=-1, keepdims=True)


def log_softmax_in_place(x):
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def log_softmax_log2(x):
    return log_softmax_ok(x) / np.log(2)


def log_softmax_clipped(x):  # hides the underflow, but log(1e-300) is not -1000
    return np.log(np.clip(np_softmax(x), 1e-300, None))


def log_softmax_no_keepdims(x):
    z = x - x.max(axis=-1)
    return z - np.log(np.exp(z).sum(axis=-1))


def log_softmax_no_keepdims_if_square(x):  # reaches the square case, where shapes still work
    if x.ndim != 2 or x.shape[0] != x.shape[1]:
        return log_softmax_ok(x)
    return log_softmax_no_keepdims(x)


def log_softmax_as_text(x):
    return str(log_softmax_ok(x).tolist())


def cosine_ok(X):
    U = torch.nn.functional.normalize(torch.from_numpy(X), dim=-1)
    return torch.softmax(U @ U.T, dim=-1)


def cosine_loop(X):
    T = X.shape[0]
    cos = np.array([[X[i] @ X[j] / (np.linalg.norm(X[i]) * np.linalg.norm(X[j])) for j in range(T)]
                    for i in range(T)])
    return np_softmax(cos)


def cosine_dot_product(X):
    return np_softmax(X @ X.T)


def cosine_query_norm_only(X):
    return np_softmax(X @ X.T / np.linalg.norm(X, axis=1, keepdims=True))


def cosine_no_softmax(X):
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return (X @ X.T) / (n * n.T)


def cosine_squared(X):
    n2 = (X * X).sum(axis=1, keepdims=True)
    return np_softmax((X @ X.T) / (n2 * n2.T))


def cosine_returns_tuple(X):
    A = cosine_loop(X)
    return A @ X, A


DESIGN_OK = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
DESIGN_OK_NONZERO = [[1.0, 0.0], [2.0, 1.0], [0.5, -0.5]]  # x2 orthogonal-ish, equal scores
DESIGN_SELF = [[1.0, 0.0], [0.5, 0.0], [0.0, 0.0]]
DESIGN_NOT_UNIFORM = [[1.0, 0.0], [2.0, 0.0], [1.0, 1.0]]
DESIGN_QUERY1 = [[1.0, 0.0], [2.0, 1.0], [0.0, 5.0]]


def fixed_loop(X):
    context = np.zeros_like(X)
    for i in range(X.shape[0]):
        scores = X @ X[i]
        weights = np_softmax(scores)
        context[i] = weights @ X
    return context


def context_torch_float32(X):
    Xt = torch.from_numpy(X).float()
    return torch.softmax(Xt @ Xt.T, dim=-1) @ Xt


def buggy_loop(X):
    context = np.zeros_like(X)
    for i in range(X.shape[0]):
        scores = X @ X[i]
        weights = np_softmax(scores)  # noqa: F841 - the bug: computed, then not used
        context[i] = scores @ X
    return context


def context_axis0(X):
    return np_softmax(X @ X.T, axis=0) @ X


def context_weights_only(X):
    return np_softmax(X @ X.T)


def context_reversed_rows(X):
    return fixed_loop(X)[::-1]


def context_in_place(X):
    X[:] = np_softmax(X @ X.T) @ X
    return X


# 02 ------------------------------------------------------------------------------------------
# Keys measure "dimension 0 minus dimension 1" (largest for "one"), every query asks for it.
ONE_W_Q, ONE_W_K = 20.0 * np.ones((3, 1)), np.array([[1.0], [-1.0], [0.0]])


def scale_ok(d_k, sigma_q, sigma_k):
    return math.sqrt(d_k) * sigma_q * sigma_k


def scale_tensor(d_k, sigma_q, sigma_k):
    return torch.tensor(d_k, dtype=torch.float32).sqrt() * sigma_q * sigma_k


def scale_sqrt_dk(d_k, sigma_q, sigma_k):
    return math.sqrt(d_k)


def scale_variances(d_k, sigma_q, sigma_k):
    return math.sqrt(d_k) * sigma_q ** 2 * sigma_k ** 2


def scale_reciprocal(d_k, sigma_q, sigma_k):
    return 1 / (math.sqrt(d_k) * sigma_q * sigma_k)


def scale_as_text(d_k, sigma_q, sigma_k):
    return f"{math.sqrt(d_k) * sigma_q * sigma_k}"


def shift_lstsq(k, d_model, base=10000.0):
    """Independent of any formula for M_k: solve PE[p] @ M = PE[p + k] over many positions."""
    from shared.positional import sinusoidal_positional_encoding

    pe = sinusoidal_positional_encoding(400, d_model, base=base)
    lo, hi = max(0, -k), 400 - max(0, k)
    return np.linalg.lstsq(pe[lo:hi], pe[lo + k:hi + k], rcond=None)[0]


def _shift(k, d_model, base, omega_of, transpose=False):
    M = np.zeros((d_model, d_model))
    for i in range(d_model // 2):
        a = k * omega_of(i)
        block = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = block.T if transpose else block
    return M


def shift_ok(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-2 * i / d_model))


def shift_backwards(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-2 * i / d_model), transpose=True)


def shift_same_angle(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: 1.0)


def shift_exponent_i(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-i / d_model))


def shift_fixed_base(k, d_model, base=10000.0):
    return _shift(k, d_model, 10000.0, lambda i: 10000.0 ** (-2 * i / d_model))


def perm_ok(Z, Z_shuffled):
    dist = ((Z_shuffled[:, None, :] - Z[None, :, :]) ** 2).sum(axis=-1)  # (T, T)
    return dist.argmin(axis=1)


def perm_inverse(Z, Z_shuffled):
    dist = ((Z_shuffled[:, None, :] - Z[None, :, :]) ** 2).sum(axis=-1)
    return dist.argmin(axis=0)


def perm_exact(Z, Z_shuffled):  # == on floats: no row matches exactly
    return np.array([int(np.nonzero((Z == row).all(axis=1))[0][0]) for row in Z_shuffled])


def perm_as_floats(Z, Z_shuffled):
    return perm_ok(Z, Z_shuffled).astype(float).tolist()


def perm_first_column_only(Z, Z_shuffled):  # rounding decides ties of a single coordinate
    return np.array([int(np.argmin(np.abs(Z[:, 0] - row[0]))) for row in Z_shuffled][:1] * len(Z))


# 03 ------------------------------------------------------------------------------------------
class WindowOK(torch.nn.Module):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=False)
        ones = torch.ones(context_length, context_length, dtype=torch.bool)
        self.register_buffer("mask", ones.tril() & ~ones.tril(-window))

    def forward(self, x):
        T = x.shape[1]
        Q, K, V = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = Q @ K.transpose(1, 2) / K.shape[-1] ** 0.5
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        return torch.softmax(scores, dim=-1) @ V


class WindowSDPA(WindowOK):  # PyTorch's own attention with the boolean mask
    def forward(self, x):
        T = x.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            self.W_query(x), self.W_key(x), self.W_value(x), attn_mask=self.mask[:T, :T])


class WindowStub(torch.nn.Module):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=False)
        # TODO: register the mask buffer

    def forward(self, x):
        # TODO: your code here
        return None


class WindowPlainAttribute(WindowOK):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__(d_in, d_out, context_length, window)
        mask = self.mask
        del self._buffers["mask"]
        self.mask = mask


class WindowParameter(WindowOK):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__(d_in, d_out, context_length, window)
        mask = self.mask
        del self._buffers["mask"]
        self.mask = torch.nn.Parameter(mask.float(), requires_grad=False)


class WindowNoSlice(WindowOK):
    def forward(self, x):
        Q, K, V = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = Q @ K.transpose(1, 2) / K.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(~self.mask, float("-inf")), dim=-1) @ V


class WindowCausalBuffer(WindowOK):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__(d_in, d_out, context_length, window)
        self.mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()


class WindowOffByOne(WindowOK):
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__(d_in, d_out, context_length, window)
        ones = torch.ones(context_length, context_length, dtype=torch.bool)
        self.mask = ones.tril() & ~ones.tril(-window - 1)


class WindowForwardIgnoresBuffer(WindowOK):
    def forward(self, x):
        T = x.shape[1]
        Q, K, V = self.W_query(x), self.W_key(x), self.W_value(x)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = (Q @ K.transpose(1, 2) / K.shape[-1] ** 0.5).masked_fill(~causal, float("-inf"))
        return torch.softmax(scores, dim=-1) @ V


class WindowReturnsTuple(WindowOK):
    def forward(self, x):
        return super().forward(x), None


def dropout_ok(weights, p, rng):
    keep = rng.random(weights.shape) >= p
    return np.where(keep, weights / (1 - p), 0.0)


def dropout_binomial_float32(weights, p, rng):
    keep = rng.binomial(1, 1 - p, size=weights.shape).astype(np.float32)
    return (weights.astype(np.float32) * keep / np.float32(1 - p))


def dropout_no_rescale(weights, p, rng):
    keep = rng.random(weights.shape) >= p
    return np.where(keep, weights, 0.0)


def dropout_inverted(weights, p, rng):
    keep = rng.random(weights.shape) < p
    return np.where(keep, weights / (1 - p), 0.0)


def dropout_divide_p(weights, p, rng):
    keep = rng.random(weights.shape) >= p
    return np.where(keep, weights / p, 0.0) if p > 0 else weights.copy()


def dropout_renormalised(weights, p, rng):
    keep = rng.random(weights.shape) >= p
    w = np.where(keep, weights, 0.0)
    return w / w.sum(axis=-1, keepdims=True)


def dropout_global_rng(weights, p, rng):
    keep = np.random.random(weights.shape) >= p  # noqa: NPY002 - the mistake under test
    return np.where(keep, weights / (1 - p), 0.0)


def dropout_drops_nothing(weights, p, rng):
    return weights.copy()


def dropout_only_rescales(weights, p, rng):
    return weights / (1 - p)


def dropout_whole_rows(weights, p, rng):
    keep = rng.random(weights.shape[:-1] + (1,)) >= p
    return np.where(keep, weights / (1 - p), 0.0)


def dropout_whole_columns(weights, p, rng):
    keep = rng.random((1, weights.shape[-1])) >= p
    return np.where(keep, weights / (1 - p), 0.0)


def dropout_same_for_batch(weights, p, rng):
    keep = rng.random(weights.shape[-2:]) >= p
    return np.where(keep, weights / (1 - p), 0.0)


def causal_ok(Q, K, V):
    T, d_k = Q.shape
    scores = Q @ K.T / np.sqrt(d_k)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    return np_softmax(np.where(future, -np.inf, scores)) @ V


def causal_sdpa_float32(Q, K, V):
    Qt, Kt, Vt = (torch.from_numpy(a).float() for a in (Q, K, V))
    return torch.nn.functional.scaled_dot_product_attention(Qt, Kt, Vt, is_causal=True)


def causal_leaky(Q, K, V):  # the buggy code shipped in notebook 03
    T, d_k = Q.shape
    scores = Q @ K.T / np.sqrt(d_k)
    future = np.tril(np.ones((T, T), dtype=bool), k=-1)
    return np_softmax(np.where(future, -np.inf, scores)) @ V


def causal_after_softmax(Q, K, V):
    T, d_k = Q.shape
    w = np_softmax(Q @ K.T / np.sqrt(d_k)) * np.tril(np.ones((T, T)))
    return w @ V


def causal_no_mask(Q, K, V):
    return np_softmax(Q @ K.T / np.sqrt(Q.shape[1])) @ V


def causal_unscaled(Q, K, V):
    T = Q.shape[0]
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), Q @ K.T, -np.inf)
    return np_softmax(scores) @ V


def causal_rows_reversed(Q, K, V):
    return causal_ok(Q, K, V)[::-1]


def causal_in_place(Q, K, V):
    Q /= np.sqrt(Q.shape[1])
    T = Q.shape[0]
    return np_softmax(np.where(np.tril(np.ones((T, T), dtype=bool)), Q @ K.T, -np.inf)) @ V


# 04 ------------------------------------------------------------------------------------------
def cross_ok(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1) @ V


def cross_float32(X_q, X_kv, W_q, W_k, W_v):  # right, computed in float32
    return cross_ok(*(t.float() for t in (X_q, X_kv, W_q, W_k, W_v)))


def cross_mutates_after(X_q, X_kv, W_q, W_k, W_v):  # right answer, then scribbles on its inputs
    out = cross_ok(X_q, X_kv, W_q, W_k, W_v)
    for t in (X_q, X_kv, W_q, W_k, W_v):
        t.mul_(2.0)
    return out


def cross_unscaled(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    return torch.softmax(Q @ K.T, dim=-1) @ V


def cross_scaled_by_d_v(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    return torch.softmax(Q @ K.T / math.sqrt(V.shape[-1]), dim=-1) @ V


def cross_axis0(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=0) @ V


def cross_naive_softmax(X_q, X_kv, W_q, W_k, W_v):  # exp without subtracting the row maximum
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    e = torch.exp(Q @ K.T / math.sqrt(K.shape[-1]))
    return e / e.sum(dim=-1, keepdim=True) @ V


def cross_queries_from_kv(X_q, X_kv, W_q, W_k, W_v):
    return cross_ok(X_kv, X_kv, W_q, W_k, W_v)


def cross_values_from_q(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_q @ W_v
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[-1]), dim=-1) @ V


def cross_causal(X_q, X_kv, W_q, W_k, W_v):
    Q, K, V = X_q @ W_q, X_kv @ W_k, X_kv @ W_v
    s = Q @ K.T / math.sqrt(K.shape[-1])
    s = s.masked_fill(~torch.ones_like(s, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ V


def split_ok(x, num_heads):
    B, T, d = x.shape
    return x.view(B, T, num_heads, d // num_heads).transpose(1, 2)


def merge_ok(y):
    B, H, T, hd = y.shape
    return y.transpose(1, 2).reshape(B, T, H * hd)


def split_direct(x, num_heads):
    B, T, d = x.shape
    return x.reshape(B, num_heads, T, d // num_heads)


def split_no_transpose(x, num_heads):
    B, T, d = x.shape
    return x.view(B, T, num_heads, d // num_heads)


def merge_no_transpose(y):
    B, H, T, hd = y.shape
    return y.reshape(B, T, H * hd)


def merge_view(y):
    B, H, T, hd = y.shape
    return y.transpose(1, 2).view(B, T, H * hd)


def count_ok(d_model, num_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def count_float(d_model, num_heads, bias=True):  # a whole float is a number too
    return float(count_ok(d_model, num_heads, bias))


def count_text(d_model, num_heads, bias=True):
    return str(count_ok(d_model, num_heads, bias))


def count_hard_coded(d_model, num_heads, bias=True):
    return 2_362_368


def count_no_bias(d_model, num_heads, bias=True):
    return 4 * d_model * d_model


def count_no_out_proj(d_model, num_heads, bias=True):
    return 3 * d_model * d_model + (3 * d_model if bias else 0)


def count_times_heads(d_model, num_heads, bias=True):
    return num_heads * count_ok(d_model, num_heads, bias)


def fused_ok(x, c_attn, c_proj, num_heads):
    B, T, d = x.shape
    q, k, v = c_attn(x).split(d, dim=-1)
    q, k, v = (t.view(B, T, num_heads, d // num_heads).transpose(1, 2) for t in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return c_proj(y.transpose(1, 2).reshape(B, T, d))


def fused_by_hand(x, c_attn, c_proj, num_heads):  # no SDPA, float32, chunk: still right
    x, c_attn, c_proj = x.float(), c_attn.float(), c_proj.float()
    B, T, d = x.shape
    q, k, v = (split_ok(t, num_heads) for t in c_attn(x).chunk(3, dim=-1))
    s = q @ k.transpose(-2, -1) / math.sqrt(d // num_heads)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return c_proj(merge_ok(torch.softmax(s, dim=-1) @ v))


def fused_not_causal(x, c_attn, c_proj, num_heads):
    B, T, d = x.shape
    q, k, v = (split_ok(t, num_heads) for t in c_attn(x).split(d, dim=-1))
    return c_proj(merge_ok(torch.nn.functional.scaled_dot_product_attention(q, k, v)))


def fused_k_first(x, c_attn, c_proj, num_heads):
    B, T, d = x.shape
    k, q, v = (split_ok(t, num_heads) for t in c_attn(x).split(d, dim=-1))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return c_proj(merge_ok(y))


def fused_interleaved(x, c_attn, c_proj, num_heads):  # [q_h k_h v_h] per head: not GPT-2's layout
    B, T, d = x.shape
    qkv = c_attn(x).view(B, T, num_heads, 3 * (d // num_heads)).transpose(1, 2)
    q, k, v = qkv.chunk(3, dim=-1)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return c_proj(merge_ok(y))


def fused_no_proj(x, c_attn, c_proj, num_heads):
    B, T, d = x.shape
    q, k, v = (split_ok(t, num_heads) for t in c_attn(x).split(d, dim=-1))
    return merge_ok(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def fused_direct_reshape(x, c_attn, c_proj, num_heads):
    B, T, d = x.shape
    q, k, v = (split_direct(t, num_heads) for t in c_attn(x).split(d, dim=-1))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return c_proj(merge_ok(y))


def gqa_ok(Q, K, V):
    g = Q.shape[1] // K.shape[1]
    K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def gqa_sdpa(Q, K, V):  # PyTorch's own grouped-query path
    return torch.nn.functional.scaled_dot_product_attention(Q, K, V, enable_gqa=True)


def gqa_expand_float32(Q, K, V):  # expand + reshape instead of repeat_interleave, in float32
    Q, K, V = Q.float(), K.float(), V.float()
    B, H_kv, T_k, _ = K.shape
    g = Q.shape[1] // H_kv
    K = K[:, :, None].expand(B, H_kv, g, T_k, K.shape[-1]).reshape(B, H_kv * g, T_k, -1)
    V = V[:, :, None].expand(B, H_kv, g, T_k, V.shape[-1]).reshape(B, H_kv * g, T_k, -1)
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def gqa_repeat(Q, K, V):  # cycles the kv heads: query head h gets kv head h % H_kv
    g = Q.shape[1] // K.shape[1]
    K, V = K.repeat(1, g, 1, 1), V.repeat(1, g, 1, 1)
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def gqa_group_of_two(Q, K, V):  # hard-coded group size
    K, V = K.repeat_interleave(2, dim=1), V.repeat_interleave(2, dim=1)
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def gqa_unscaled(Q, K, V):
    g = Q.shape[1] // K.shape[1]
    K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)
    return torch.softmax(Q @ K.transpose(-2, -1), dim=-1) @ V


def gqa_one_output_per_kv_head(Q, K, V):  # averages the query heads of a group
    B, H, T_q, d = Q.shape
    Q = Q.view(B, K.shape[1], H // K.shape[1], T_q, d).mean(dim=2)
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d), dim=-1) @ V


# ---------------------------------------------------------------------------------------------
# The table: checker, answer(s), expected return, a phrase the printed line must contain
# ---------------------------------------------------------------------------------------------
NA, OK = "not attempted yet", "correct!"
# This file covers the checkers of notebooks 01-04; later notebooks have tests/test_exercises_NN.py.
CHECKERS = [*ex.nb01.__all__, *ex.nb02.__all__, *ex.nb03.__all__, *ex.nb04.__all__]
ALL_CHECKERS = [name for name in ex.__all__ if name.startswith("check_")]
C = ex
CASES = [
    # 01
    (C.check_predicted_row, (PRED_W, PRED_Z), True, OK),
    (C.check_predicted_row, (PRED_W4, PRED_Z4), True, OK),
    (C.check_predicted_row, (np.array(PRED_W4, dtype=np.float32), torch.tensor(PRED_Z4)), True, OK),
    (C.check_predicted_row, (None, None), None, NA),
    (C.check_predicted_row, (PRED_W4, None), None, "now type context_c"),
    (C.check_predicted_row, ([1, 2, 2], PRED_Z4), False, "these are the scores"),
    (C.check_predicted_row, ([0.2, 0.4, 0.4], PRED_Z4), False, "divided the scores by their sum"),
    (C.check_predicted_row, ([0.4223, 0.1554, 0.4223], PRED_Z4), False, "weights of query a"),
    (C.check_predicted_row, ([0.16, 0.42, 0.42], PRED_Z4), False, "round to 4 decimals"),
    (C.check_predicted_row, ([0.4223, 0.4223, 0.1554], PRED_Z4), False, "wrong order"),
    (C.check_predicted_row, (PRED_W4, [3.0, 6.0]), False, "scores (1, 2, 2) instead of the weights"),
    (C.check_predicted_row, (PRED_W4, [1.0, 1.0]), False, "x_c itself"),
    (C.check_predicted_row, ("0.1554 0.4223 0.4223", PRED_Z4), False, "not the text"),
    (C.check_predicted_row, (lambda: PRED_W4, PRED_Z4), False, "not a function"),
    (C.check_predicted_row, ([15.54, 42.23, 42.23], PRED_Z4), False, "sum to 100.0000"),
    (C.check_log_softmax, (log_softmax_torch,), True, OK),
    (C.check_log_softmax, (log_softmax_float32,), True, OK),
    (C.check_log_softmax, (log_softmax_ok,), True, OK),
    (C.check_log_softmax, (stub1,), None, NA),
    (C.check_log_softmax, (stub_raises,), None, NA),
    (C.check_log_softmax, (log_of_softmax,), False, "you took the log of the softmax"),
    (C.check_log_softmax, (log_softmax_naive,), False, "overflow"),
    (C.check_log_softmax, (log_softmax_min_shift,), False, "spans more than 709"),
    (C.check_log_softmax, (log_softmax_mean_shift,), False, "the minimum (or the mean)"),
    (C.check_log_softmax, (log_softmax_global_max,), False, "each row's own maximum"),
    (C.check_log_softmax, (log_softmax_returns_weights,), False, "not their logarithms"),
    (C.check_log_softmax, (log_softmax_no_logsumexp,), False, "but not log(sum(exp(x - max)))"),
    (C.check_log_softmax, (log_softmax_in_place,), False, "in place"),
    (C.check_log_softmax, (log_softmax_log2,), False, "natural logarithm"),
    (C.check_log_softmax, (log_softmax_as_text,), False, "not the text"),
    (C.check_log_softmax, (log_softmax_clipped,), False, "hides the underflow"),
    (C.check_log_softmax, (log_softmax_no_keepdims,), False, "could not be broadcast"),
    (C.check_log_softmax, (log_softmax_no_keepdims_if_square,), False, "keepdims=True is missing"),
    (C.check_log_softmax, (42,), False, "expected a function"),
    (C.check_cosine_attention, (cosine_ok,), True, OK),
    (C.check_cosine_attention, (cosine_loop,), True, OK),
    (C.check_cosine_attention, (stub1,), None, NA),
    (C.check_cosine_attention, (cosine_dot_product,), False, "plain dot product"),
    (C.check_cosine_attention, (cosine_query_norm_only,), False, "only by the query's length"),
    (C.check_cosine_attention, (cosine_no_softmax,), False, "cosine similarities themselves"),
    (C.check_cosine_attention, (cosine_squared,), False, "squared lengths"),
    (C.check_cosine_attention, (cosine_returns_tuple,), False, "got tuple"),
    (C.check_design_embeddings, (DESIGN_OK,), True, OK),
    (C.check_design_embeddings, (DESIGN_OK_NONZERO,), True, OK),
    (C.check_design_embeddings, (torch.tensor(DESIGN_OK),), True, OK),
    (C.check_design_embeddings, (None,), None, NA),
    (C.check_design_embeddings, (DESIGN_SELF,), False, "does not prefer key 1 over itself"),
    (C.check_design_embeddings, (DESIGN_NOT_UNIFORM,), False, "query 2's weights"),
    (C.check_design_embeddings, (DESIGN_QUERY1,), False, "query 1 should attend most to itself"),
    (C.check_design_embeddings, (DESIGN_OK.T,), False, "shape (3, 2)"),
    (C.check_spot_the_bug, (fixed_loop,), True, OK),
    (C.check_spot_the_bug, (context_torch_float32,), True, OK),
    (C.check_spot_the_bug, (stub1,), None, NA),
    (C.check_spot_the_bug, (buggy_loop,), False, "still the bug"),
    (C.check_spot_the_bug, (context_axis0,), False, "wrong axis"),
    (C.check_spot_the_bug, (context_weights_only,), False, "these are the attention weights"),
    (C.check_spot_the_bug, (context_reversed_rows,), False, "wrong order"),
    (C.check_spot_the_bug, (context_in_place,), False, "in place"),
    # 02
    (C.check_attend_to_one, (ONE_W_Q, ONE_W_K), True, OK),
    (C.check_attend_to_one, (torch.tensor(ONE_W_Q, dtype=torch.float32), ONE_W_K.tolist()), True, OK),
    (C.check_attend_to_one, (None, None), None, NA),
    (C.check_attend_to_one, (ONE_W_Q / 20, ONE_W_K), False, "scale W_q or W_k up"),
    (C.check_attend_to_one, (ONE_W_Q, [[0.0], [1.0], [0.0]]), False, "attends most to 'journey'"),
    (C.check_attend_to_one, (ONE_W_Q.T, ONE_W_K.T), False, "(d_k, d_in): transpose it"),
    (C.check_attend_to_one, (ONE_W_Q, np.ones((3, 2))), False, "same number of columns"),
    (C.check_attend_to_one, ("W_q", ONE_W_K), False, "not the text"),
    (C.check_score_scale, (scale_ok,), True, OK),
    (C.check_score_scale, (scale_tensor,), True, OK),
    (C.check_score_scale, (stub1,), None, NA),
    (C.check_score_scale, (scale_sqrt_dk,), False, "standard deviations of 1"),
    (C.check_score_scale, (scale_variances,), False, "used the variances"),
    (C.check_score_scale, (scale_reciprocal,), False, "MULTIPLY"),
    (C.check_score_scale, (scale_as_text,), False, "without quotes"),
    (C.check_shift_matrix, (shift_ok,), True, OK),
    (C.check_shift_matrix, (shift_lstsq,), True, OK),
    (C.check_shift_matrix, (stub1,), None, NA),
    (C.check_shift_matrix, (shift_backwards,), False, "k positions BACK"),
    (C.check_shift_matrix, (shift_same_angle,), False, "same angle"),
    (C.check_shift_matrix, (shift_exponent_i,), False, "counts column PAIRS"),
    (C.check_shift_matrix, (shift_fixed_base,), False, "the base you are given"),
    (C.check_recover_permutation, (perm_ok,), True, OK),
    (C.check_recover_permutation, (perm_as_floats,), True, OK),
    (C.check_recover_permutation, (transfer_stub,), None, NA),
    (C.check_recover_permutation, (perm_inverse,), False, "inverse permutation"),
    (C.check_recover_permutation, (perm_exact,), False, "NEAREST row"),
    (C.check_recover_permutation, (perm_first_column_only,), False, "is not a permutation"),
    # 03
    (C.check_sliding_window_attention, (WindowOK,), True, OK),
    (C.check_sliding_window_attention, (WindowSDPA,), True, OK),
    (C.check_sliding_window_attention, (WindowStub,), None, NA),
    (C.check_sliding_window_attention, (WindowPlainAttribute,), False, "plain attribute"),
    (C.check_sliding_window_attention, (WindowParameter,), False, "nn.Parameter"),
    (C.check_sliding_window_attention, (WindowNoSlice,), False, "self.mask[:T, :T]"),
    (C.check_sliding_window_attention, (WindowCausalBuffer,), False, "plain causal mask"),
    (C.check_sliding_window_attention, (WindowOffByOne,), False, "yours sees window + 1"),
    (C.check_sliding_window_attention, (WindowForwardIgnoresBuffer,), False, "forward ignores the window"),
    (C.check_sliding_window_attention, (WindowReturnsTuple,), False, "not a tuple"),
    (C.check_attention_dropout, (dropout_ok,), True, OK),
    (C.check_attention_dropout, (dropout_binomial_float32,), True, OK),
    (C.check_attention_dropout, (stub1,), None, NA),
    (C.check_attention_dropout, (dropout_no_rescale,), False, "forgot to rescale"),
    (C.check_attention_dropout, (dropout_inverted,), False, "probability p (keep it with probability 1 - p)"),
    (C.check_attention_dropout, (dropout_divide_p,), False, "not by p"),
    (C.check_attention_dropout, (dropout_renormalised,), False, "don't renormalise"),
    (C.check_attention_dropout, (dropout_global_rng,), False, "the rng you are given"),
    (C.check_attention_dropout, (dropout_drops_nothing,), False, "nothing changed"),
    (C.check_attention_dropout, (dropout_only_rescales,), False, "never set any to 0"),
    (C.check_attention_dropout, (dropout_whole_rows,), False, "whole rows"),
    (C.check_attention_dropout, (dropout_whole_columns,), False, "whole columns"),
    (C.check_attention_dropout, (dropout_same_for_batch,), False, "every sequence of the batch"),
    (C.check_causal_bug_fix, (causal_ok,), True, OK),
    (C.check_causal_bug_fix, (causal_sdpa_float32,), True, OK),
    (C.check_causal_bug_fix, (stub1,), None, NA),
    (C.check_causal_bug_fix, (causal_leaky,), False, "still the original bug"),
    (C.check_causal_bug_fix, (causal_after_softmax,), False, "after softmax without renormalising"),
    (C.check_causal_bug_fix, (causal_no_mask,), False, "future leaked"),
    (C.check_causal_bug_fix, (causal_unscaled,), False, "forgot the scaling"),
    (C.check_causal_bug_fix, (causal_rows_reversed,), False, "wrong order"),
    (C.check_causal_bug_fix, (causal_in_place,), False, "in place"),
    # 04
    (C.check_cross_attention, (cross_ok,), True, OK),
    (C.check_cross_attention, (cross_float32,), True, OK),
    (C.check_cross_attention, (cross_mutates_after,), True, OK),
    (C.check_cross_attention, (stub1,), None, NA),
    (C.check_cross_attention, (cross_unscaled,), False, "forgot the scaling"),
    (C.check_cross_attention, (cross_scaled_by_d_v,), False, "not sqrt(d_v)"),
    (C.check_cross_attention, (cross_axis0,), False, "wrong axis"),
    (C.check_cross_attention, (cross_naive_softmax,), False, "subtract each row's maximum"),
    (C.check_cross_attention, (cross_queries_from_kv,), False, "queries must come from X_q"),
    (C.check_cross_attention, (cross_values_from_q,), False, "keys AND values both come from X_kv"),
    (C.check_cross_attention, (cross_causal,), False, "no causal mask"),
    (C.check_split_merge_heads, (split_ok, merge_ok), True, OK),
    (C.check_split_merge_heads, (stub1, stub1), None, NA),
    (C.check_split_merge_heads, (split_ok, stub1), None, NA),
    (C.check_split_merge_heads, (split_direct, merge_ok), False, "reshaped straight to (B, H, T, head_dim)"),
    (C.check_split_merge_heads, (split_no_transpose, merge_ok), False, "swap dims 1 and 2"),
    (C.check_split_merge_heads, (split_ok, merge_no_transpose), False, "transpose back"),
    (C.check_split_merge_heads, (split_ok, merge_view), False, "not contiguous"),
    (C.check_parameter_count, (count_ok,), True, "2,362,368"),
    (C.check_parameter_count, (count_float,), True, OK),
    (C.check_parameter_count, (stub1,), None, NA),
    (C.check_parameter_count, (count_text,), False, "not a string"),
    (C.check_parameter_count, (count_hard_coded,), False, "for every size"),
    (C.check_parameter_count, (count_no_bias,), False, "forgot the biases"),
    (C.check_parameter_count, (count_no_out_proj,), False, "output projection"),
    (C.check_parameter_count, (count_times_heads,), False, "don't multiply"),
    (C.check_fused_attention, (fused_ok,), True, OK),
    (C.check_fused_attention, (fused_by_hand,), True, OK),
    (C.check_fused_attention, (stub1,), None, NA),
    (C.check_fused_attention, (fused_not_causal,), False, "is_causal=True"),
    (C.check_fused_attention, (fused_k_first,), False, "keys as queries"),
    (C.check_fused_attention, (fused_interleaved,), False, "not interleaved per head"),
    (C.check_fused_attention, (fused_no_proj,), False, "output projection"),
    (C.check_fused_attention, (fused_direct_reshape,), False, "reshaped straight"),
    (C.check_grouped_query_attention, (gqa_ok,), True, OK),
    (C.check_grouped_query_attention, (gqa_sdpa,), True, OK),
    (C.check_grouped_query_attention, (gqa_expand_float32,), True, OK),
    (C.check_grouped_query_attention, (stub1,), None, NA),
    (C.check_grouped_query_attention, (gqa_repeat,), False, "repeat_interleave(H // H_kv, dim=1)"),
    (C.check_grouped_query_attention, (gqa_group_of_two,), False, "repeat_interleave(H // H_kv"),
    (C.check_grouped_query_attention, (gqa_unscaled,), False, "forgot the scaling"),
    (C.check_grouped_query_attention, (gqa_one_output_per_kv_head,), False, "every query head keeps its own"),
]


def _id(case):
    checker, answers, _, _ = case
    return f"{checker.__name__}-{'+'.join(getattr(a, '__name__', repr(a)) for a in answers)}"


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    assert result.passed is expected, out
    assert result == expected and bool(result) is (expected is True)
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


def test_reference_solutions_agree_with_pytorch():
    """Independent cross-checks of the references the tests above rely on."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5))
    assert np.allclose(np_softmax(x), torch.softmax(torch.from_numpy(x), dim=-1).numpy())
    big = np.array([[0.0, 1000.0], [-800.0, 5.0]])
    assert np.allclose(log_softmax_ok(big), torch.log_softmax(torch.from_numpy(big), -1).numpy())
    w = np.array(PRED_W)
    assert np.allclose(w, torch.softmax(torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64), -1))
    assert np.allclose(PRED_Z, w @ np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
    for k, d_model, base in ((3, 8, 10000.0), (-2, 6, 100.0)):
        assert np.allclose(shift_ok(k, d_model, base), shift_lstsq(k, d_model, base), atol=1e-6)
    torch.manual_seed(0)
    a, b = WindowOK(3, 2, 6, 2), WindowSDPA(3, 2, 6, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 3)
    assert torch.allclose(a(x), b(x), atol=1e-6)
    Q, K, V = (torch.randn(4, 3, dtype=torch.float64) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True)
    assert np.allclose(causal_ok(Q.numpy(), K.numpy(), V.numpy()), sdpa.numpy())
    X_q, X_kv = torch.randn(2, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    W = [torch.randn(4, 4, dtype=torch.float64) for _ in range(3)]
    sdpa = torch.nn.functional.scaled_dot_product_attention(X_q @ W[0], X_kv @ W[1], X_kv @ W[2])
    assert torch.allclose(cross_ok(X_q, X_kv, *W), sdpa)
    # GPT-2 small: c_attn 768 x 2304 + 2304 biases, c_proj 768 x 768 + 768 biases
    assert count_ok(768, 12) == 768 * 2304 + 2304 + 768 * 768 + 768 == 2_362_368


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0)]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            args = (answer, answer) if name == "check_split_merge_heads" else (answer,)
            result = checker(*args)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_result_shows_nothing_in_a_notebook(capsys):
    result = ex.check_causal_bug_fix(causal_ok)
    capsys.readouterr()
    assert result._ipython_display_() is None
    assert repr(result) == "CheckResult(passed=True)"
    assert result != False and result != None  # noqa: E711, E712 - comparing with the value on purpose


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_sliding_window_attention(WindowOK)
    ex.check_parameter_count(count_ok)
    ex.check_attention_dropout(dropout_global_rng)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002


# ---------------------------------------------------------------------------------------------
# The notebooks: stubs print "not attempted yet", solutions print "correct!" (nbval keeps the
# stored outputs honest by re-running every cell and comparing)
# ---------------------------------------------------------------------------------------------
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SOLUTIONS = sorted((NOTEBOOKS / "solutions").glob("*_solutions.ipynb"))
COURSE = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def checker_cells(path: Path) -> list[tuple[str, str]]:
    """(source, printed text) of every code cell that calls a checker."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for c in nb["cells"]:
        source = "".join(c["source"])
        if c["cell_type"] == "code" and re.search(r"^check_\w+\(", source, flags=re.M):
            text = "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
            cells.append((source, text))
    return cells


def test_there_is_a_solution_notebook_per_numbered_notebook():
    assert [p.name[:3] for p in SOLUTIONS] == [p.name[:3] for p in COURSE]
    for course, solution in zip(COURSE, SOLUTIONS, strict=True):
        assert solution.name == course.name.replace(".ipynb", "_solutions.ipynb")


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_solution_notebook_prints_correct_for_every_exercise(path):
    cells = checker_cells(path)
    assert len(cells) >= 3, f"{path.name} has {len(cells)} exercises"
    for source, text in cells:
        last = text.strip().splitlines()[-1] if text.strip() else ""
        assert last.startswith("correct!"), f"{source.splitlines()[-1]} printed {text!r}"


@pytest.mark.parametrize("path", COURSE, ids=[p.name for p in COURSE])
def test_course_notebook_stubs_print_not_attempted(path):
    for source, text in checker_cells(path):
        assert text.strip().startswith("not attempted yet"), f"{source.splitlines()[-1]} printed {text!r}"
        assert "# TODO" in source, "a stub should say where the learner's code goes"


def test_every_checker_is_used_by_a_solution_notebook():
    used = "".join(src for p in SOLUTIONS for src, _ in checker_cells(p))
    missing = [name for name in ALL_CHECKERS if f"{name}(" not in used]
    assert not missing, missing
