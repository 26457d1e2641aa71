"""shared.attention against PyTorch's own attention, properties, hand-derived values and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shared.attention import (
    causal_mask,
    multi_head_attention,
    scaled_dot_product_attention,
    self_attention,
    softmax,
)

ATOL = 1e-5


def rand(rng, *shape):
    return rng.standard_normal(shape)


# ------------------------------------------------------------------ agreement with PyTorch
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "batch, T_q, T_k, d_k, d_v",
    [((), 1, 1, 1, 1), ((), 5, 5, 4, 4), ((3,), 6, 6, 8, 3), ((2, 4), 7, 7, 16, 5), ((2,), 3, 9, 4, 6)],
)
def test_sdpa_matches_torch(batch, T_q, T_k, d_k, d_v, causal):
    rng = np.random.default_rng(sum(batch) * 100 + T_q * 10 + T_k + int(causal))
    Q, K, V = rand(rng, *batch, T_q, d_k), rand(rng, *batch, T_k, d_k), rand(rng, *batch, T_k, d_v)
    out, weights = scaled_dot_product_attention(Q, K, V, causal=causal)
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (Q, K, V)), is_causal=causal
    ).numpy()
    assert out.shape == batch + (T_q, d_v)
    assert weights.shape == batch + (T_q, T_k)
    np.testing.assert_allclose(out, expected, atol=ATOL)


@pytest.mark.parametrize("mask_shape", [(5, 7), (1, 5, 7), (2, 5, 7), (2, 1, 7)])
def test_sdpa_boolean_mask_matches_torch(mask_shape):
    rng = np.random.default_rng(7)
    Q, K, V = rand(rng, 2, 5, 4), rand(rng, 2, 7, 4), rand(rng, 2, 7, 3)
    mask = rng.random(mask_shape) < 0.6
    mask[..., 0] = True  # every query keeps at least one key, so torch gives no NaN either
    out, _ = scaled_dot_product_attention(Q, K, V, mask=mask)
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (Q, K, V)), attn_mask=torch.from_numpy(mask)
    ).numpy()
    np.testing.assert_allclose(out, expected, atol=ATOL)


def test_sdpa_float32_inputs_stay_float32_and_match_torch():
    rng = np.random.default_rng(3)
    Q, K, V = (rand(rng, 2, 6, 8).astype(np.float32) for _ in range(3))
    out, weights = scaled_dot_product_attention(Q, K, V, causal=True)
    assert out.dtype == np.float32 and weights.dtype == np.float32
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (Q, K, V)), is_causal=True
    ).numpy()
    np.testing.assert_allclose(out, expected, atol=ATOL)


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_torch(causal):
    rng = np.random.default_rng(11)
    X = rand(rng, 2, 6, 5)
    W_q, W_k, W_v = rand(rng, 5, 4), rand(rng, 5, 4), rand(rng, 5, 3)
    out, weights = self_attention(X, W_q, W_k, W_v, causal=causal)
    Xt = torch.from_numpy(X)
    expected = F.scaled_dot_product_attention(
        Xt @ torch.from_numpy(W_q), Xt @ torch.from_numpy(W_k), Xt @ torch.from_numpy(W_v),
        is_causal=causal,
    ).numpy()
    np.testing.assert_allclose(out, expected, atol=ATOL)
    assert weights.shape == (2, 6, 6)


def torch_mha_reference(X, W_q, W_k, W_v, W_o, num_heads, causal):
    """The same computation with torch.nn.MultiheadAttention, our weights copied in.

    nn.MultiheadAttention stores in_proj_weight as (3*d, d) = [W_q^T; W_k^T; W_v^T] in nn.Linear's
    (out_features, in_features) layout, and out_proj.weight = W_o^T.
    """
    d = X.shape[-1]
    mha = torch.nn.MultiheadAttention(d, num_heads, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([W_q.T, W_k.T, W_v.T], axis=0)))
        mha.out_proj.weight.copy_(torch.from_numpy(W_o.T))
    Xt = torch.from_numpy(X)
    T = X.shape[-2]
    attn_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = blocked
    out, w = mha(Xt, Xt, Xt, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    return out.detach().numpy(), w.detach().numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B, T, d, num_heads", [(1, 4, 8, 2), (3, 7, 12, 3), (2, 5, 16, 4), (1, 3, 6, 1)])
def test_multi_head_matches_torch_multiheadattention(B, T, d, num_heads, causal):
    rng = np.random.default_rng(B * 1000 + T * 100 + d + num_heads)
    X = rand(rng, B, T, d)
    W_q, W_k, W_v, W_o = (rand(rng, d, d) / math.sqrt(d) for _ in range(4))
    out, weights = multi_head_attention(X, W_q, W_k, W_v, num_heads, W_o=W_o, causal=causal)
    ref_out, ref_w = torch_mha_reference(X, W_q, W_k, W_v, W_o, num_heads, causal)
    np.testing.assert_allclose(out, ref_out, atol=ATOL)
    np.testing.assert_allclose(weights, ref_w, atol=ATOL)
    assert weights.shape == (B, num_heads, T, T)


def test_multi_head_equals_heads_run_one_by_one():
    """Head h uses columns h*head_dim:(h+1)*head_dim; without W_o the output is their concat."""
    rng = np.random.default_rng(5)
    X = rand(rng, 2, 5, 6)
    H, hd = 3, 2
    W_q, W_k, W_v = rand(rng, 6, H * hd), rand(rng, 6, H * hd), rand(rng, 6, H * hd)
    out, weights = multi_head_attention(X, W_q, W_k, W_v, num_heads=H, causal=True)
    cols = [slice(h * hd, (h + 1) * hd) for h in range(H)]
    per_head = [self_attention(X, W_q[:, c], W_k[:, c], W_v[:, c], causal=True) for c in cols]
    np.testing.assert_allclose(out, np.concatenate([o for o, _ in per_head], axis=-1), atol=1e-12)
    np.testing.assert_allclose(weights, np.stack([w for _, w in per_head], axis=-3), atol=1e-12)


# ------------------------------------------------------------------ hand-derived values
def test_hand_example_matches_hand_arithmetic():
    """the/cat/sat, identity projections, d_k = 4, causal. Scores q.k/2 worked by hand:
    row "cat": [0, 1] -> softmax = [1/(1+e), e/(1+e)]; row "sat": [1/2, 1/2, 1] ->
    [1, 1, e^(1/2)] / (2 + e^(1/2))."""
    from shared.data import load_hand_example

    ex = load_hand_example()
    out, w = self_attention(ex["X"], ex["W_q"], ex["W_k"], ex["W_v"], causal=ex["causal"])
    e, r = math.e, math.sqrt(math.e)
    expected_w = np.array(
        [[1, 0, 0], [1 / (1 + e), e / (1 + e), 0], [1 / (2 + r), 1 / (2 + r), r / (2 + r)]]
    )
    np.testing.assert_allclose(w, expected_w, atol=1e-12)
    np.testing.assert_allclose(out, expected_w @ ex["X"], atol=1e-12)
    np.testing.assert_allclose(w[1, :2], [0.2689, 0.7311], atol=5e-5)


def test_softmax_known_values_and_overflow():
    np.testing.assert_allclose(softmax([0.0, 0.0]), [0.5, 0.5])
    np.testing.assert_allclose(softmax([0.0, math.log(3.0)]), [0.25, 0.75])
    big = softmax([1000.0, 1001.0, 1002.0])  # naive exp overflows here
    np.testing.assert_allclose(big, softmax([0.0, 1.0, 2.0]))
    assert np.all(np.isfinite(big))


def test_softmax_axis():
    x = np.array([[1.0, 2.0], [3.0, 5.0]])
    np.testing.assert_allclose(softmax(x, axis=0).sum(axis=0), [1.0, 1.0])
    np.testing.assert_allclose(softmax(x, axis=0)[:, 0], softmax([1.0, 3.0]))


def test_causal_mask_values():
    np.testing.assert_array_equal(
        causal_mask(3), [[True, False, False], [True, True, False], [True, True, True]]
    )
    assert causal_mask(1).dtype == np.bool_


# ------------------------------------------------------------------ fully masked rows
def test_fully_masked_row_gives_zero_weights_and_zero_output():
    rng = np.random.default_rng(0)
    Q, K, V = rand(rng, 3, 4), rand(rng, 5, 4), rand(rng, 5, 2)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(Q, K, V, mask=mask)
    assert not np.isnan(out).any() and not np.isnan(w).any()
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_allclose(w[[0, 2]].sum(-1), 1.0)


def test_softmax_all_minus_inf_is_zero_not_nan():
    np.testing.assert_array_equal(softmax([-np.inf, -np.inf]), [0.0, 0.0])
    np.testing.assert_allclose(softmax([-np.inf, 0.0]), [0.0, 1.0])


# ------------------------------------------------------------------ properties (hypothesis)
finite = st.floats(-30, 30, allow_nan=False, allow_infinity=False, width=64)
shapes = st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 5))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=shapes)
def test_rows_sum_to_one_and_masked_weights_exactly_zero(data, shape):
    B, T, d = shape
    Q = data.draw(arrays(np.float64, (B, T, d), elements=finite))
    K = data.draw(arrays(np.float64, (B, T, d), elements=finite))
    V = data.draw(arrays(np.float64, (B, T, d), elements=finite))
    mask = data.draw(arrays(np.bool_, (T, T)))
    _, w = scaled_dot_product_attention(Q, K, V, mask=mask, causal=data.draw(st.booleans()))
    assert np.all(w >= 0)
    sums = w.sum(-1)
    live = w.any(-1)
    np.testing.assert_allclose(sums[live], 1.0, atol=1e-9)
    assert np.all(w[..., ~mask] == 0.0)


@settings(max_examples=60, deadline=None)
@given(x=arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 8)), elements=finite),
       c=st.floats(-1e3, 1e3, allow_nan=False))
def test_softmax_unchanged_by_adding_a_constant(x, c):
    np.testing.assert_allclose(softmax(x + c), softmax(x), atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), T=st.integers(2, 7), d=st.integers(1, 5))
def test_outputs_permute_with_inputs_without_mask(data, T, d):
    X = data.draw(arrays(np.float64, (T, d), elements=st.floats(-3, 3, width=64)))
    rng = np.random.default_rng(T * 10 + d)
    W_q, W_k, W_v = rand(rng, d, 3), rand(rng, d, 3), rand(rng, d, 2)
    perm = np.array(data.draw(st.permutations(range(T))))
    out, w = self_attention(X, W_q, W_k, W_v)
    out_p, w_p = self_attention(X[perm], W_q, W_k, W_v)
    np.testing.assert_allclose(out_p, out[perm], atol=1e-9)
    np.testing.assert_allclose(w_p, w[np.ix_(perm, perm)], atol=1e-9)


# ------------------------------------------------------------------ bad input: clear messages
def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"Q must have at least 2 dimensions .*got shape \(4,\)"):
        scaled_dot_product_attention(np.ones(4), np.ones((3, 4)), np.ones((3, 4)))


def test_rejects_mismatched_inner_dimensions():
    with pytest.raises(ValueError, match=r"share their last dimension d_k; got Q \(2, 4\) and K \(3, 5\)"):
        scaled_dot_product_attention(np.ones((2, 4)), np.ones((3, 5)), np.ones((3, 5)))


def test_rejects_key_value_length_mismatch():
    with pytest.raises(ValueError, match=r"same number of tokens T_k.*K \(3, 4\) and V \(2, 4\)"):
        scaled_dot_product_attention(np.ones((2, 4)), np.ones((3, 4)), np.ones((2, 4)))


def test_rejects_batch_dims_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"leading \(batch\) dimensions must broadcast.*Q \(2, 3, 4\)"):
        scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((3, 3, 4)), np.ones((3, 3, 4)))


def test_rejects_projection_with_wrong_d_in():
    with pytest.raises(ValueError, match=r"W_k must have d_in = 4 rows.*got shape \(3, 2\)"):
        self_attention(np.ones((3, 4)), np.ones((4, 2)), np.ones((3, 2)), np.ones((4, 2)))


def test_rejects_d_out_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"W_q's d_out = 6 \(shape \(4, 6\)\) is not divisible by num_heads = 4"):
        multi_head_attention(np.ones((3, 4)), np.ones((4, 6)), np.ones((4, 6)), np.ones((4, 6)), 4)


@pytest.mark.parametrize("num_heads", [0, -1, 2.0, True])
def test_rejects_bad_num_heads(num_heads):
    with pytest.raises(ValueError, match=r"num_heads must be a positive integer; got"):
        multi_head_attention(np.ones((3, 4)), np.ones((4, 4)), np.ones((4, 4)), np.ones((4, 4)), num_heads)


def test_rejects_w_o_with_wrong_rows():
    with pytest.raises(ValueError, match=r"W_o must be 2-D with 4 rows.*got shape \(3, 4\)"):
        multi_head_attention(np.ones((3, 4)), np.eye(4), np.eye(4), np.eye(4), 2, W_o=np.ones((3, 4)))


def test_rejects_mask_that_does_not_broadcast():
    with pytest.raises(ValueError, match=r"mask of shape \(2, 2\) does not broadcast to the scores' shape \(3, 3\)"):
        scaled_dot_product_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), mask=np.ones((2, 2), bool))


def test_rejects_non_boolean_mask():
    with pytest.raises(TypeError, match=r"mask must be a boolean array \(True = may attend\); got dtype int64"):
        scaled_dot_product_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), mask=np.ones((3, 3), dtype=np.int64))


@pytest.mark.parametrize("bad", [np.array([["a", "b"], ["c", "d"]]), np.ones((2, 2), dtype=bool), np.ones((2, 2)) * 1j])
def test_rejects_non_numeric_arrays(bad):
    with pytest.raises(TypeError, match=r"Q must be a real numeric array .*got dtype"):
        scaled_dot_product_attention(bad, np.ones((2, 2)), np.ones((2, 2)))


def test_rejects_ragged_input():
    with pytest.raises(TypeError, match=r"X must be a real numeric array; could not convert it"):
        self_attention([[1.0, 2.0], [3.0]], np.eye(2), np.eye(2), np.eye(2))


@pytest.mark.parametrize("value, where", [(np.nan, "V"), (np.inf, "K"), (-np.inf, "Q")])
def test_rejects_nan_and_inf_in_qkv(value, where):
    arrs = {"Q": np.ones((2, 3)), "K": np.ones((2, 3)), "V": np.ones((2, 3))}
    arrs[where][1, 2] = value
    with pytest.raises(ValueError, match=rf"{where} must be finite .*found {value} at index \(1, 2\)"):
        scaled_dot_product_attention(**arrs)


def test_softmax_rejects_nan_and_plus_inf():
    with pytest.raises(ValueError, match=r"softmax input x must be finite \(NaN and \+inf are not allowed\); found nan"):
        softmax([1.0, np.nan])
    with pytest.raises(ValueError, match=r"found inf at index \(0,\)"):
        softmax([np.inf, 1.0])


def test_softmax_rejects_bad_axis():
    with pytest.raises(ValueError, match=r"axis must be in \[-2, 1\] for x of shape \(2, 3\); got 2"):
        softmax(np.ones((2, 3)), axis=2)


@pytest.mark.parametrize("T", [0, -3, 2.5, "4"])
def test_causal_mask_rejects_bad_T(T):
    with pytest.raises(ValueError, match=r"T \(the number of tokens\) must be a positive integer; got"):
        causal_mask(T)


def test_rejects_query_and_key_projections_of_different_shapes():
    with pytest.raises(ValueError, match=r"W_q and W_k must have the same shape \(d_in, d_k\); got \(4, 2\) and \(4, 3\)"):
        self_attention(np.ones((3, 4)), np.ones((4, 2)), np.ones((4, 3)), np.ones((4, 2)))
