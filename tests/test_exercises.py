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
from tests.checker_helpers import case_id


@pytest.fixture(autouse=True)
def fresh_staged_hints():
    """01's hints are staged (a repeated miss is shown more): start each test fresh."""
    ex.nb01._MISSES.clear()
    ex.nb02._MISSES.clear()
    yield
    ex.nb01._MISSES.clear()
    ex.nb02._MISSES.clear()


def test_exercise_1_1_shows_the_measurement_only_on_a_second_miss(capsys):
    wrong = {"a", "b", "d", "e", "g"}  # doubling X taken for harmless: a temperature, in fact
    _, first = run(capsys, C.check_invariance_prediction, wrong)
    assert "6 of the 7 letters right" in first and "(d) doubles X" in first, first
    assert "measured" not in first, first
    _, second = run(capsys, C.check_invariance_prediction, wrong)
    assert "measured largest change of A" in second and "(d) 0.18" in second, second
    assert "(a) below 1e-12" in second and "(e) below 1e-12" in second, second


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
# Exercise 1.1, derived by hand: softmax ignores a constant per row (a: +5 everywhere, b: +i in
# row i); XX^T is unchanged by X -> -X (e) and by a rotation X -> XR, R R^T = I (g). A constant
# added to one key (c), 2X (scores x4, d) and X + 1 (row i gains sum(x_i) + sum(x_j) + d, which
# depends on j, f) change the weights.
UNCHANGED = {"a", "b", "e", "g"}
E = math.e


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


# Exercise 1.3's prediction, by hand from the printed scores of notebook 01: a row's largest /
# smallest weight is e^(span of its scores). Dot-product spans (largest minus smallest score):
# journey 1.4950-0.7070 = 0.79, one 0.7154-0.2935 = 0.42; cosine spans are 1 minus the smallest
# cosine: journey 1 - 0.709 = 0.29 (flatter), one 1 - 0.2935 / (0.8157 * 0.9721) = 0.63 (sharper).
SHARPER = {"one"}
SIX_TOKENS = ["Your", "journey", "starts", "with", "one", "step"]
# 1.4: x0 = (1, 0), x1 = (1.5, 0.5), x2 = (0.5, -0.5): row 0 scores 1.5 and 0.5 for keys 1 and 2
# (a difference of 1: weight ratio e); x2 scores 0.5 with x0, with x1 and with itself.
DESIGN_OK = np.array([[1.0, 0.0], [1.5, 0.5], [0.5, -0.5]])
DESIGN_ZERO_X2 = [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]  # scores 1 and 0: ratio e, but x2 = 0
DESIGN_SHORT_X2 = [[1.0, 0.0], [1.2, 0.4], [0.2, -0.2]]  # ratio e, but |x2| = 0.2828 < 0.5
DESIGN_PARALLEL = [[1.0, 0.0], [1.5, 0.0], [0.5, 1.0]]  # ratio e, x0 and x1 on one line
DESIGN_NOT_UNIFORM = [[1.0, 0.0], [1.5, 0.5], [0.5, 1.0]]  # ratio e; x2 scores 0.5, 1.25, 1.25
DESIGN_ROUNDED = [[1.0, 0.0], [1.5, 0.5], [0.5, -0.4999]]  # ratio e; scores 0.5, 0.5001, 0.4999
DESIGN_RATIO_ROUNDED = [[1.0, 0.0], [1.5, 0.5], [0.5001, -0.5]]  # difference 0.9999: ratio ~e
DESIGN_SCORE_RATIO = [[1.0, 0.0], [E / 2, 0.5], [0.5, -0.5]]  # x0.x1 / x0.x2 = e, not the difference
DESIGN_SCORE_DIFF_E = [[1.0, 0.0], [0.5 + E, 0.5], [0.5, -0.5]]  # x0.x1 - x0.x2 = e: ratio e^e
DESIGN_REVERSED = [[1.0, 0.0], [-0.5, 0.5], [0.5, -0.5]]  # key 2 gets e times key 1's weight
DESIGN_OTHER = [[1.0, 0.0], [2.0, 1.0], [0.5, -0.5]]  # 1.4's old answer: difference 1.5

def cosine_in_place(X):  # normalises the learner's X itself
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return np_softmax(X @ X.T)


def cosine_softmax_axis0(X):
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return np_softmax((X @ X.T) / (n * n.T), axis=0)


def cosine_raises(X):
    return X @ X  # (T, d) @ (T, d): a shape error for T != d



# 1.5's design half: three unit vectors 120 degrees apart. Every row of X X^T holds 1 (itself)
# and -1/2 twice, so every row has the same maximum and the same sum: the bug cancels.
R3 = math.sqrt(3) / 2
LUCKY = [[1.0, 0.0], [-0.5, R3], [-0.5, -R3]]
LUCKY_TYPED = [[1.0, 0.0], [-0.5, 0.866], [-0.5, -0.866]]  # 4 decimals: within 1e-4
LUCKY_NEARLY = [[1.0, 0.0], [-0.5, 0.8665], [-0.5, -0.8665]]  # maxima 1 and 1.0008
LUCKY_SUMS = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]  # maxima all 1, row sums differ
LUCKY_TINY = [[0.1, 0.0], [-0.05, 0.1 * R3], [-0.05, -0.1 * R3]]  # right, but weights ~1/3


# Exercise 1.5: softmax lines without keepdims=True. References: PyTorch's softmax, and a loop.
# The symptoms its hints report on the six tokens, from the shipped buggy lines themselves
# (buggy_attention below) and by hand: with the shift alone fixed, the rows sum to 1, but 'Your'
# gives 'journey' e^(0.9544 - 1.4950) (row 1's maximum is subtracted from column 1) times the
# weight it gives itself (its own maximum, 0.9995, cancels).
def _six_token_weights(shift_keepdims: bool, sum_keepdims: bool) -> np.ndarray:
    from shared.data import load_embeddings

    scores = load_embeddings()[1] @ load_embeddings()[1].T
    e = np.exp(scores - scores.max(axis=-1, keepdims=shift_keepdims))
    return e / e.sum(axis=-1, keepdims=sum_keepdims)


BUGGY_SIX_SUMS = np.round(_six_token_weights(False, False).sum(axis=-1), 4).tolist()
SHIFT_FIXED_SIX_SUMS = np.round(_six_token_weights(True, False).sum(axis=-1), 4).tolist()
DIVISION_FIXED_RATIO = f"{math.exp(0.9544 - 1.4950):.4f}"
def attention_ok(X):
    Xt = torch.from_numpy(X)
    return torch.softmax(Xt @ Xt.T, dim=-1) @ Xt


def attention_loop(X):
    Z = np.zeros_like(X)
    for i in range(X.shape[0]):
        s = X @ X[i]
        e = np.exp(s - s.max())
        Z[i] = (e / e.sum()) @ X
    return Z


def attention_np_softmax(X):  # section 4's stable_softmax reused: right, but finds no bug
    return np_softmax(X @ X.T) @ X


def attention_float32(X):
    Xt = torch.from_numpy(X).float()
    return torch.softmax(Xt @ Xt.T, dim=-1) @ Xt


def buggy_attention(X):  # as shipped in the exercise
    scores = X @ X.T
    shifted = scores - scores.max(axis=-1)
    e = np.exp(shifted)
    weights = e / e.sum(axis=-1)
    return weights @ X


def attention_shift_fixed_only(X):
    scores = X @ X.T
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1)) @ X


def attention_division_fixed_only(X):
    scores = X @ X.T
    e = np.exp(scores - scores.max(axis=-1))
    return (e / e.sum(axis=-1, keepdims=True)) @ X


def attention_weights_transposed(X):
    return np_softmax(X @ X.T).T @ X


def attention_global_max(X):
    scores = X @ X.T
    e = np.exp(scores - scores.max())
    return (e / e.sum(axis=-1, keepdims=True)) @ X


def attention_no_shift(X):
    e = np.exp(X @ X.T)
    return (e / e.sum(axis=-1, keepdims=True)) @ X


def attention_in_place(X):  # right numbers, but X itself is overwritten
    X[:] = np_softmax(X @ X.T) @ X
    return X


def attention_returns_weights(X):
    return np_softmax(X @ X.T)


def attention_scaled(X):
    return np_softmax(X @ X.T / math.sqrt(X.shape[1])) @ X


def attention_reversed_rows(X):
    return attention_loop(X)[::-1]


def attention_raises(X):
    return np_softmax(X @ X) @ X


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


def _blocked(pe):
    d_model = pe.shape[-1]
    return pe[:, list(range(0, d_model, 2)) + list(range(1, d_model, 2))]


def shift_lstsq(k, d_model, base=10000.0):
    """Independent of any formula for M_k: solve PE_b[p] @ M = PE_b[p + k] over many positions."""
    from shared.positional import sinusoidal_positional_encoding

    pe = _blocked(sinusoidal_positional_encoding(400, d_model, base=base))
    lo, hi = max(0, -k), 400 - max(0, k)
    return np.linalg.lstsq(pe[lo:hi], pe[lo + k:hi + k], rcond=None)[0]


def _shift(k, d_model, base, omega_of, transpose=False, interleaved=False):
    """Pair i is column i (sine) and column i + d_model/2 (cosine), unless ``interleaved``."""
    M, h = np.zeros((d_model, d_model)), d_model // 2
    for i in range(h):
        a = k * omega_of(i)
        s, c = (-1 if transpose else 1) * np.sin(a), np.cos(a)
        si, ci = (2 * i, 2 * i + 1) if interleaved else (i, i + h)
        M[si, si], M[si, ci], M[ci, si], M[ci, ci] = c, -s, s, c
    return M


def shift_ok(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-2 * i / d_model))


def shift_interleaved(k, d_model, base=10000.0):  # section 7's layout, not the figure's
    return _shift(k, d_model, base, lambda i: base ** (-2 * i / d_model), interleaved=True)


def shift_backwards(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-2 * i / d_model), transpose=True)


def shift_same_angle(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: 1.0)


def shift_exponent_i(k, d_model, base=10000.0):
    return _shift(k, d_model, base, lambda i: base ** (-i / d_model))


def shift_fixed_base(k, d_model, base=10000.0):
    return _shift(k, d_model, 10000.0, lambda i: 10000.0 ** (-2 * i / d_model))


def variance_ok(d_in, d_k, T):
    W_query, W_key = (torch.nn.Linear(d_in, d_k, bias=False) for _ in range(2))
    X = torch.randn(T, d_in)
    with torch.no_grad():
        return (W_query(X) @ W_key(X).T / math.sqrt(d_k)).var().item()


def variance_unscaled(d_in, d_k, T):
    return variance_ok(d_in, d_k, T) * d_k


def variance_std(d_in, d_k, T):
    return math.sqrt(variance_ok(d_in, d_k, T))


BREAKS_IT = {"c", "d", "g", "i"}  # causal mask; dropout in training; distance bias; fixed mask


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


def perm_centres_in_place(Z, Z_shuffled):  # right permutation, but the inputs are changed
    Z -= Z.mean(axis=0)
    Z_shuffled -= Z_shuffled.mean(axis=0)
    return perm_ok(Z, Z_shuffled)


def bug_fix_ok(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return torch.softmax(Q @ K.T / K.shape[-1] ** 0.5, dim=-1) @ V


def bug_fix_still_in_place(X, W_q, W_k, W_v):
    W_q /= W_k.shape[-1] ** 0.5
    return torch.softmax((X @ W_q) @ (X @ W_k).T, dim=-1) @ (X @ W_v)


def bug_fix_scale_d_in(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return torch.softmax(Q @ K.T / X.shape[-1] ** 0.5, dim=-1) @ V


def bug_fix_columns(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return torch.softmax(Q @ K.T / K.shape[-1] ** 0.5, dim=0) @ V


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


def empty_rows_ok(T, p):  # query i (0-based) sees i + 1 keys; all dropped with probability p^(i+1)
    return sum(p ** (i + 1) for i in range(T))


def empty_rows_no_mask(T, p):
    return T * p**T


def empty_rows_p_to_the_i(T, p):
    return sum(p**i for i in range(T))


MOVED_03 = [0, 1, 2, 3, 4, 5]  # outputs of the buggy code that move when the last of 6 tokens changes


def pairs_ok(T, window):  # query i sees min(i + 1, window) keys
    return sum(min(i + 1, window) for i in range(T))


def pairs_no_clamp(T, window):
    return T * window - window * (window - 1) // 2


def causal_ok(Q, K, V):
    T, d_k = Q.shape
    scores = Q @ K.T / np.sqrt(d_k)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    return np_softmax(np.where(future, -np.inf, scores)) @ V


def causal_sdpa_float32(Q, K, V):
    Qt, Kt, Vt = (torch.from_numpy(a).float() for a in (Q, K, V))
    return torch.nn.functional.scaled_dot_product_attention(Qt, Kt, Vt, is_causal=True)


def causal_leaky(Q, K, V):  # the buggy code shipped in notebook 03: a column sum normalises
    T, d_k = Q.shape
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), Q @ K.T / np.sqrt(d_k), -np.inf)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=0, keepdims=True) @ V


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


# 3.4: a loop-based mask, written independently of the checker's vectorised reference
PAD_ROWS_03 = [(0, 0), (0, 1)]  # sequence 0 is left-padded by 2: its first two queries see only padding
PAD_RETURNS_03 = {"left": True, "right": False}  # 3.4 (b): does dropping the padding mask move a real output?


def padded_mask_ok(key_is_real):
    B, T = key_is_real.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                out[b, i, j] = bool(key_is_real[b, j])
    return out


def padded_mask_queries(key_is_real):  # hides the padding queries (rows), not the padding keys
    T = key_is_real.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril() & key_is_real[:, :, None]


def padded_mask_no_causal(key_is_real):
    T = key_is_real.shape[1]
    return key_is_real[:, None, :].expand(-1, T, -1).clone()


# ---------------------------------------------------------------------------------------------
# The table: checker, answer(s), expected return, a phrase the printed line must contain
# ---------------------------------------------------------------------------------------------
NA, OK = "not attempted yet", "correct!"
# This file covers the checkers of notebooks 01-03; 04 onwards have tests/test_exercises_NN.py.
CHECKERS = [*ex.nb01.__all__, *ex.nb02.__all__, *ex.nb03.__all__]
ALL_CHECKERS = [name for name in ex.__all__ if name.startswith("check_")]
C = ex
CASES = [
    # 01
    (C.check_invariance_prediction, (UNCHANGED,), True, OK),
    (C.check_invariance_prediction, (["A", "b", "e", "g"],), True, OK),
    (C.check_invariance_prediction, ("a, b, e, g",), True, OK),
    (C.check_invariance_prediction, (None,), None, NA),
    (C.check_invariance_prediction, ({"a", "e", "g"},), False, "(b) adds a different constant to each row"),
    (C.check_invariance_prediction, ({"a", "b", "c", "e", "g"},), False, "(c) adds 5 to the scores of one key"),
    (C.check_invariance_prediction, ({"a", "b", "e", "f", "g"},), False, "write out (x_i + 1)"),
    (C.check_invariance_prediction, ({"a", "b", "g"},), False, "(e) flips every embedding"),
    (C.check_invariance_prediction, ({"b", "e", "g"},), False, "(a) adds one constant"),
    (C.check_invariance_prediction, ({"a", "b", "e"},), False, "(g) rotates"),
    (C.check_invariance_prediction, ({"a", "h"},), False, "contains 'h'"),
    (C.check_invariance_prediction, ({"a": 1},), False, "got dict"),
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
    (C.check_log_softmax, (log_softmax_no_logsumexp,), False, "forgot the denominator"),
    (C.check_log_softmax, (log_softmax_in_place,), False, "in place"),
    (C.check_log_softmax, (log_softmax_log2,), False, "natural logarithm"),
    (C.check_log_softmax, (log_softmax_as_text,), False, "not the text"),
    (C.check_log_softmax, (log_softmax_clipped,), False, "hides the underflow"),
    (C.check_log_softmax, (log_softmax_no_keepdims,), False, "could not be broadcast"),
    (C.check_log_softmax, (log_softmax_no_keepdims_if_square,), False, "keepdims=True is missing"),
    (C.check_log_softmax, (42,), False, "expected a function"),
    (C.check_cosine_attention, (cosine_ok, SHARPER), True, OK),
    (C.check_cosine_attention, (cosine_loop, ["one"]), True, OK),
    (C.check_cosine_attention, (cosine_ok, {4}), True, OK),
    (C.check_cosine_attention, (stub1,), None, NA),
    (C.check_cosine_attention, (stub1, SHARPER), None, NA),
    (C.check_cosine_attention, (cosine_ok,), None, "now type predicted_sharper_rows"),
    (C.check_cosine_attention, (cosine_ok, set()), False, "not yet."),
    (C.check_cosine_attention, (cosine_ok, {"journey"}), False, "divided by both lengths"),
    (C.check_cosine_attention, (cosine_ok, {"one", "journey"}), False, "not yet."),
    (C.check_cosine_attention, (cosine_ok, {"one", "step"}), False, "only the rows 'journey' and 'one' are asked"),
    (C.check_cosine_attention, (cosine_ok, set(SIX_TOKENS)), False, "contains 'Your', 'starts', 'step' and 'with'"),
    (C.check_cosine_attention, (cosine_ok, {"on"}), False, "not one of the six tokens"),
    (C.check_cosine_attention, (cosine_ok, {"one": 1}), False, "a set of token names"),
    (C.check_cosine_attention, (cosine_dot_product,), False, "plain dot product"),
    (C.check_cosine_attention, (cosine_query_norm_only,), False, "only by the query's length"),
    (C.check_cosine_attention, (cosine_no_softmax,), False, "cosine similarities themselves"),
    (C.check_cosine_attention, (cosine_squared,), False, "squared lengths"),
    (C.check_cosine_attention, (cosine_returns_tuple,), False, "got tuple"),
    (C.check_cosine_attention, (cosine_in_place,), False, "changed X in place"),
    (C.check_cosine_attention, (cosine_softmax_axis0,), False, "softmax over the wrong axis"),
    (C.check_cosine_attention, (cosine_raises,), False, "raised ValueError"),
    (C.check_cosine_attention, (cosine_raises,), False, "on an X of shape (6, 3)"),
    (C.check_design_embeddings, (DESIGN_OK,), True, OK),
    (C.check_design_embeddings, (torch.tensor(DESIGN_OK),), True, OK),
    (C.check_design_embeddings, (None,), None, NA),
    (C.check_design_embeddings, (DESIGN_ZERO_X2,), False, "x2 has length 0.0000; it must be at least 0.5"),
    (C.check_design_embeddings, (DESIGN_SHORT_X2,), False, "x2 has length 0.2828"),
    (C.check_design_embeddings, (DESIGN_PARALLEL,), False, "lie on one line through the origin"),
    (C.check_design_embeddings, (DESIGN_ROUNDED,), False, "nearly: query 2's weights"),
    (C.check_design_embeddings, (DESIGN_NOT_UNIFORM,), False, "query 2's weights are"),
    (C.check_design_embeddings, (DESIGN_RATIO_ROUNDED,), False, "nearly: query 0 gives key 1"),
    (C.check_design_embeddings, (DESIGN_SCORE_RATIO,), False, "your scores are in the ratio e"),
    (C.check_design_embeddings, (DESIGN_SCORE_DIFF_E,), False, "your scores differ by e"),
    (C.check_design_embeddings, (DESIGN_REVERSED,), False, "the other way round"),
    (C.check_design_embeddings, (DESIGN_OTHER,), False, "4.4817 times the weight of key 2, not e"),
    (C.check_design_embeddings, (DESIGN_OK.T,), False, "shape (3, 2)"),
    (C.check_spot_the_bug, (attention_ok, LUCKY), True, OK),
    (C.check_spot_the_bug, (attention_loop, LUCKY_TYPED), True, OK),
    (C.check_spot_the_bug, (attention_float32, np.array(LUCKY) * 2), True, OK),
    (C.check_spot_the_bug, (stub1,), None, NA),
    (C.check_spot_the_bug, (stub1, LUCKY), None, NA),
    (C.check_spot_the_bug, (attention_np_softmax,), None, "now design X_lucky"),
    (C.check_spot_the_bug, (attention_np_softmax, np.zeros((3, 2))), False, "within 0.05 of 1/3"),
    (C.check_spot_the_bug, (attention_ok, LUCKY_TINY), False, "within 0.05 of 1/3"),
    (C.check_spot_the_bug, (attention_ok, [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), False, "maxima [1.0, 4.0, 2.0]"),
    (C.check_spot_the_bug, (attention_ok, LUCKY_SUMS), False, "the row maxima agree (1.0000), but the sums"),
    (C.check_spot_the_bug, (attention_ok, LUCKY_NEARLY), False, "nearly: the buggy weights differ"),
    (C.check_spot_the_bug, (attention_ok, np.array(LUCKY).T), False, "shape (3, 2)"),
    (C.check_spot_the_bug, (buggy_attention, LUCKY), False, "still computes what buggy_attention computes"),
    (C.check_spot_the_bug, (buggy_attention,), False, f"the rows of its weights sum to {BUGGY_SIX_SUMS}, not 1"),
    (C.check_spot_the_bug, (attention_shift_fixed_only,), False, "closer: your shift now cancels"),
    (C.check_spot_the_bug, (attention_shift_fixed_only,), False, f"still sum to {SHIFT_FIXED_SIX_SUMS}, not 1"),
    (C.check_spot_the_bug, (attention_division_fixed_only,), False, "each row of your weights sums to 1 now"),
    (C.check_spot_the_bug, (attention_division_fixed_only,), False, f"'journey' {DIVISION_FIXED_RATIO} times"),
    (C.check_spot_the_bug, (attention_weights_transposed,), False, "wrong axis"),
    (C.check_spot_the_bug, (attention_global_max,), False, "maximum of the whole score matrix"),
    (C.check_spot_the_bug, (attention_no_shift,), False, "without the shift, exp overflows"),
    (C.check_spot_the_bug, (attention_in_place,), False, "changed X in place"),
    (C.check_spot_the_bug, (attention_returns_weights,), False, "the weights; return the context vectors"),
    (C.check_spot_the_bug, (attention_scaled,), False, "does not scale"),
    (C.check_spot_the_bug, (attention_reversed_rows,), False, "wrong order"),
    (C.check_spot_the_bug, (attention_raises,), False, "on an X of shape (6, 3)"),
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
    (C.check_init_variance, (1 / 9, variance_ok), True, OK),
    (C.check_init_variance, (None,), None, NA),
    (C.check_init_variance, (1 / 9,), None, "now write score_variance"),
    (C.check_init_variance, (1 / 9, stub1), None, NA),
    (C.check_init_variance, (1.0, variance_ok), False, "section 2's assumption"),
    (C.check_init_variance, (1 / 3, variance_ok), False, "variance of a product"),
    (C.check_init_variance, (1 / 9, variance_unscaled), False, "not divided by sqrt(d_k)"),
    (C.check_init_variance, (1 / 9, variance_std), False, "not .std()"),
    (C.check_shift_matrix, (shift_ok,), True, OK),
    (C.check_shift_matrix, (shift_lstsq,), True, OK),
    (C.check_shift_matrix, (stub1,), None, NA),
    (C.check_shift_matrix, (shift_backwards,), False, "k positions BACK"),
    (C.check_shift_matrix, (shift_same_angle,), False, "same angle"),
    (C.check_shift_matrix, (shift_exponent_i,), False, "counts column PAIRS"),
    (C.check_shift_matrix, (shift_fixed_base,), False, "the base you are given"),
    (C.check_shift_matrix, (shift_interleaved,), False, "section 7's interleaved columns"),
    (C.check_recover_permutation, (perm_ok, BREAKS_IT), True, OK),
    (C.check_recover_permutation, (perm_as_floats, "c, d, g, i"), True, OK),
    (C.check_recover_permutation, (perm_ok,), None, "now answer breaks_it"),
    (C.check_recover_permutation, (transfer_stub,), None, NA),
    (C.check_recover_permutation, (perm_ok, {"c", "g", "i"}), False, "1 of the 9 options is misjudged"),
    (C.check_recover_permutation, (perm_ok, {"a", "c", "d", "g", "i"}), False, "one map applied to each token"),
    (C.check_recover_permutation, (perm_ok, {"c", "d", "g", "h", "i"}), False, "travel with the token"),
    (C.check_recover_permutation, (perm_inverse,), False, "inverse permutation"),
    (C.check_recover_permutation, (perm_exact,), False, "NEAREST row"),
    (C.check_recover_permutation, (perm_first_column_only,), False, "is not a permutation"),
    (C.check_recover_permutation, (perm_centres_in_place,), False, "changed Z and Z_shuffled in place"),
    (C.check_attention_bug_fix, (bug_fix_ok,), True, OK),
    (C.check_attention_bug_fix, (stub1,), None, NA),
    (C.check_attention_bug_fix, (bug_fix_still_in_place,), False, "changed W_q in place"),
    (C.check_attention_bug_fix, (bug_fix_scale_d_in,), False, "sqrt(d_in)"),
    (C.check_attention_bug_fix, (bug_fix_columns,), False, "softmax over dim=0"),
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
    (C.check_window_pairs, (pairs_ok,), True, OK),
    (C.check_window_pairs, (stub1,), None, NA),
    (C.check_window_pairs, (pairs_no_clamp,), False, "clamp the window to T"),
    (C.check_window_pairs, (lambda T, window: T * window,), False, "that is T * window"),
    (C.check_stacked_reach, (lambda window, layers: layers * (window - 1),), True, OK),
    (C.check_stacked_reach, (stub1,), None, NA),
    (C.check_stacked_reach, (lambda window, layers: layers * window,), False, "counts w per layer"),
    (C.check_stacked_reach, (lambda window, layers: window - 1,), False, "the reach of one layer"),
    (C.check_expected_empty_rows, (empty_rows_ok,), True, OK),
    (C.check_expected_empty_rows, (stub1,), None, NA),
    (C.check_expected_empty_rows, (empty_rows_no_mask,), False, "attention without a mask"),
    (C.check_expected_empty_rows, (empty_rows_p_to_the_i,), False, "query 0 probability 1"),
    (C.check_causal_bug_fix, (MOVED_03, causal_ok), True, OK),
    (C.check_causal_bug_fix, (MOVED_03, causal_sdpa_float32), True, OK),
    (C.check_causal_bug_fix, (MOVED_03, stub1), None, NA),
    (C.check_causal_bug_fix, (None, stub1), None, "moved_outputs is still None"),
    (C.check_causal_bug_fix, ([5], causal_ok), False, "what a correct causal attention does"),
    (C.check_causal_bug_fix, (MOVED_03, causal_leaky), False, "still the original bug"),
    (C.check_causal_bug_fix, (MOVED_03, causal_after_softmax), False, "after softmax without renormalising"),
    (C.check_causal_bug_fix, (MOVED_03, causal_no_mask), False, "future leaked"),
    (C.check_causal_bug_fix, (MOVED_03, causal_unscaled), False, "forgot the scaling"),
    (C.check_causal_bug_fix, (MOVED_03, causal_rows_reversed), False, "wrong order"),
    (C.check_causal_bug_fix, (MOVED_03, causal_in_place), False, "in place"),
    (C.check_padded_causal_mask, (PAD_ROWS_03, PAD_RETURNS_03, padded_mask_ok), True, OK),
    (C.check_padded_causal_mask, (None, None, stub1), None, NA),
    (C.check_padded_causal_mask, (PAD_ROWS_03, PAD_RETURNS_03, stub1), None, "still returns None"),
    (C.check_padded_causal_mask, ([(1, 3), (1, 4)], PAD_RETURNS_03, padded_mask_ok), False, "wrong side"),
    (C.check_padded_causal_mask, (PAD_ROWS_03, PAD_RETURNS_03, padded_mask_queries), False, "wrong axis"),
    (C.check_padded_causal_mask, (PAD_ROWS_03, PAD_RETURNS_03, padded_mask_no_causal), False, "forgot the causal part"),
]


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[case_id(c) for c in CASES])
def test_checker(capsys, checker, answers, expected, phrase):
    result, out = run(capsys, checker, *answers)
    assert result.passed is expected, out
    assert result == expected and bool(result) is (expected is True)
    assert result.message == out.rstrip("\n")
    assert phrase in out, out
    prefix = {True: "correct!", False: "not quite:", None: "not attempted yet"}[expected]
    assert out.startswith(prefix), out


@pytest.mark.parametrize("fixed", [buggy_attention, attention_shift_fixed_only,
                                   attention_division_fixed_only])
def test_spot_the_bug_hints_give_symptoms_not_the_fix(capsys, fixed):
    """Exercise 1.5 is finding the fix: resubmitting the bug (or half of the fix) must not hand it over."""
    _, out = run(capsys, C.check_spot_the_bug, fixed)
    assert "keepdims" not in out and "(T, 1)" not in out and "broadcast" not in out, out
    assert "six tokens" in out, out  # a symptom the learner can reproduce


@pytest.mark.parametrize("guess", [set(), {"journey"}, {"one", "journey"}, [1, 4], (1,)])
def test_cosine_prediction_is_graded_then_shows_the_measurement(capsys, guess):
    """Exercise 1.3's prediction is committed before the measurement: a wrong guess is shown the
    measured rows (recomputed here in torch, independently of the checker), never the reason, and
    the first miss does not tell which of the two rows it got right."""
    from shared.data import load_embeddings

    tokens, X = load_embeddings()
    x = torch.from_numpy(X)
    dots = x @ x.T
    cos = torch.nn.functional.cosine_similarity(x[:, None, :], x[None, :, :], dim=-1)
    span = lambda s: (s.max(dim=-1).values - s.min(dim=-1).values)  # noqa: E731
    ratio = {t: (math.exp(a), math.exp(b)) for t, a, b in zip(tokens, span(dots), span(cos), strict=True)}
    assert ratio["one"][1] > ratio["one"][0] and ratio["journey"][1] < ratio["journey"][0]
    _, first = run(capsys, C.check_cosine_attention, cosine_ok, guess)
    assert first.startswith("not quite: not yet."), first
    assert "sharper" not in first and "flatter" not in first and "right" not in first, first
    _, out = run(capsys, C.check_cosine_attention, cosine_ok, guess)
    assert out.startswith("not quite: measured"), out
    for t in ("journey", "one"):
        word = "sharper" if ratio[t][1] > ratio[t][0] else "flatter"
        assert f"{t} {ratio[t][0]:.2f} -> {ratio[t][1]:.2f} ({word})" in out, out
    assert "because" not in out, out  # the reason is the learner's to find


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
    X01 = rng.normal(size=(5, 3)) * np.array([[29.0], [0.1], [1.0], [3.0], [0.5]])
    assert np.allclose(attention_loop(X01), attention_ok(X01).numpy())
    lucky = np.array(LUCKY)
    assert np.allclose(lucky @ lucky.T, np.where(np.eye(3, dtype=bool), 1.0, -0.5))
    assert np.allclose(buggy_attention(lucky), attention_ok(lucky).numpy(), atol=1e-12)
    assert not np.allclose(buggy_attention(np.array(LUCKY_SUMS)), attention_loop(np.array(LUCKY_SUMS)))
    D = torch.tensor(DESIGN_OK)
    A_D = torch.softmax(D @ D.T, dim=-1)
    assert torch.allclose(A_D[2], torch.full((3,), 1 / 3, dtype=torch.float64))  # query 2 uniform
    assert math.isclose(A_D[0, 1] / A_D[0, 2], E)  # query 0: key 1 gets e times key 2's weight
    # 1.3's prediction, measured independently with PyTorch on the six tokens
    from shared.data import load_embeddings

    tokens, X6 = load_embeddings()
    A_dot = torch.softmax(torch.from_numpy(X6 @ X6.T), dim=-1)
    A_cos = cosine_ok(X6)
    ratio = lambda A: A.max(dim=-1).values / A.min(dim=-1).values  # noqa: E731
    assert {t for t, a, c in zip(tokens, ratio(A_dot), ratio(A_cos), strict=True) if c > a} == SHARPER
    # 1.1's hand-derived set, measured with PyTorch (a rotation by 0.7 rad about the third axis)
    X6t = torch.from_numpy(X6)
    S6 = X6t @ X6t.T
    c, s_ = math.cos(0.7), math.sin(0.7)
    R = torch.tensor([[c, -s_, 0.0], [s_, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    scores = {"a": S6 + 5, "b": S6 + torch.arange(6.0, dtype=torch.float64)[:, None],
              "c": S6 + 5 * (torch.arange(6) == 0), "d": 4 * S6, "e": (-X6t) @ (-X6t).T,
              "f": (X6t + 1) @ (X6t + 1).T, "g": (X6t @ R) @ (X6t @ R).T}
    same = {k for k, v in scores.items() if torch.allclose(torch.softmax(v, -1), A_dot, atol=1e-12, rtol=0)}
    assert same == UNCHANGED
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


def test_checkers_never_raise_on_odd_answers(capsys):
    odd = [None, 3, "text", lambda *a, **k: "text", lambda *a, **k: object(),
           lambda *a, **k: (1, 2), lambda *a, **k: np.zeros(0)]
    for name in CHECKERS:
        checker = getattr(ex, name)
        for answer in odd:
            result = checker(answer)
            out = capsys.readouterr().out
            assert result.passed in (None, False), (name, answer, out)
            assert out.count("\n") == 1, (name, out)


def test_result_shows_nothing_in_a_notebook(capsys):
    result = ex.check_causal_bug_fix(MOVED_03, causal_ok)
    capsys.readouterr()
    assert result._ipython_display_() is None
    assert repr(result) == "CheckResult(passed=True)"
    assert result != False and result != None  # noqa: E711, E712 - comparing with the value on purpose


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_sliding_window_attention(WindowOK)
    ex.check_causal_bug_fix(MOVED_03, causal_ok)
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
    """(source, printed text) of every code cell that calls a checker, except demonstrations of a
    checker on deliberately buggy code (a ``# demo:`` line in the cell)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for c in nb["cells"]:
        source = "".join(c["source"])
        demo = re.search(r"^# demo:", source, flags=re.M)  # a checker shown on buggy code
        if c["cell_type"] == "code" and not demo and re.search(r"^(if )?check_\w+\(", source, flags=re.M):
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
    verdicts = ("correct!", "not quite:", "not attempted yet")
    for source, text in cells:  # the checker's one line (a worked answer may print more after it)
        lines = [ln for ln in text.splitlines() if ln.startswith(verdicts)]
        assert lines and all(ln.startswith("correct!") for ln in lines), (
            f"{source.splitlines()[-1]} printed {text!r}")


def todo_cells(path: Path) -> list[str]:
    """Sources of the code cells that carry a ``# TODO`` (where the learner's code goes)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"]
            if c["cell_type"] == "code" and "# TODO" in "".join(c["source"])]


@pytest.mark.parametrize("path", COURSE, ids=[p.name for p in COURSE])
def test_course_notebook_stubs_print_not_attempted(path):
    todos = todo_cells(path)
    for source, text in checker_cells(path):
        assert text.strip().startswith("not attempted yet"), f"{source.splitlines()[-1]} printed {text!r}"
        if "# TODO" in source:
            continue
        # a prediction typed before a measurement is graded after it: the TODO is in the earlier cell
        # that assigns the checker's first argument
        answer = re.search(r"^check_\w+\((\w+)", source, flags=re.M).group(1)
        assert any(re.search(rf"^{answer} = ", todo, flags=re.M) for todo in todos), (
            f"a stub should say where the learner's code goes: no # TODO cell assigns {answer}")


def test_every_checker_is_used_by_a_solution_notebook():
    used = "".join(src for p in SOLUTIONS for src, _ in checker_cells(p))
    missing = [name for name in ALL_CHECKERS if f"{name}(" not in used]
    assert not missing, missing


LOG_SOFTMAX_WRONG = [log_of_softmax, log_softmax_naive, log_softmax_min_shift, log_softmax_mean_shift,
                     log_softmax_global_max, log_softmax_returns_weights, log_softmax_no_logsumexp,
                     log_softmax_log2, log_softmax_clipped, log_softmax_no_keepdims_if_square]


@pytest.mark.parametrize("answer", LOG_SOFTMAX_WRONG, ids=lambda f: f.__name__)
def test_log_softmax_hints_name_the_mistake_without_handing_over_the_formula(answer, capsys):
    """Exercise 1.2 asks the learner to derive log-softmax from the shift identity, so no hint
    may print the finished expression, in any spelling."""
    result = ex.check_log_softmax(answer)
    out = capsys.readouterr().out.replace(" ", "")
    assert result.passed is False
    for giveaway in ("log(sum(exp", "logsumexp", "x-max)-log", "np.log(np.exp(z).sum"):
        assert giveaway not in out, out


# ---------------------------------------------------------------------------------------------
# 01 section 5's prediction (not an exercise): the larger of A[i, j] and A[j, i]. The weights are
# PyTorch's softmax of the course's six tokens and the hand example, not the notebook's code.
# ---------------------------------------------------------------------------------------------
def torch_weights(X):
    X = torch.as_tensor(np.asarray(X), dtype=torch.float64)
    return torch.softmax(X @ X.T, dim=-1).numpy()


def six_token_weights():
    from shared.data import load_embeddings

    return torch_weights(load_embeddings()[1])


THE_CAT_SAT = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]  # A[0, 1] = A[1, 0] = 1 / (1 + e + e^2)


def test_mirror_prediction_is_silent_until_typed(capsys):
    assert ex.nb01.grade_mirror_prediction(..., six_token_weights()) is None
    assert ex.nb01.grade_mirror_prediction(None, six_token_weights()) is None
    assert capsys.readouterr().out == ""
    assert "grade_mirror_prediction" not in ex.__all__  # a teaching-cell prediction, not an exercise


@pytest.mark.parametrize("prediction, pair, passed, phrase", [
    ("A[4, 1]", (1, 4), True, "you predicted A[4, 1] > A[1, 4]; measured: A[4, 1] = 0.1958 > A[1, 4] = 0.1082 too"),
    (" a[4,1] ", (1, 4), True, "too"),
    ("A[1, 4]", (1, 4), False, "which of rows 1 and 4 has the larger sum?"),  # "the long query gets more"
    ("equal", (1, 4), False, "is it the same in rows 1 and 4?"),  # "A is symmetric like Omega"
    ("A[0, 2]", (0, 2), True, "measured: A[0, 2] = 0.1981 > A[2, 0] = 0.1390 too"),  # the other way round
    ("A[2, 0]", (0, 2), False, "which of rows 0 and 2 has the larger sum?"),
    ("A[2, 3]", (1, 4), False, 'type one of "A[1, 4]", "A[4, 1]" or "equal"'),
    (False, (1, 4), False, "should be text in quotes"),
])
def test_mirror_prediction(capsys, prediction, pair, passed, phrase):
    result = ex.nb01.grade_mirror_prediction(prediction, six_token_weights(), *pair)
    out = capsys.readouterr().out
    assert result.passed is passed and phrase in out, out
    assert out.count("\n") == 1


def test_mirror_prediction_knows_an_equal_pair(capsys):
    A = torch_weights(THE_CAT_SAT)
    assert math.isclose(A[0, 1], 1 / (1 + math.e + math.e**2), rel_tol=1e-12)
    result = ex.nb01.grade_mirror_prediction("equal", A, 0, 1)
    assert result.passed is True and "A[0, 1] = A[1, 0] = 0.0900 too" in capsys.readouterr().out
    result = ex.nb01.grade_mirror_prediction("A[1, 0]", A, 0, 1)
    out = capsys.readouterr().out
    assert result.passed is False and "divide it by the same sum" in out, out
