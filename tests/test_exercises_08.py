"""The checkers of notebook 08: each accepts a reference solution, says "not attempted yet" for the
shipped stub, and rejects typical wrong answers with the hint for that mistake. The reference
solutions here are written independently of the checkers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared import exercises as ex
from shared.exercises import nb08


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


# 8.1 ------------------------------------------------------------------------------------------
def decode_ok(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=-2)
    V_cache = torch.cat([V_cache, v_new], dim=-2)
    out = F.scaled_dot_product_attention(q, K_cache, V_cache)
    return out, K_cache, V_cache


def decode_list(q, k_new, v_new, K_cache, V_cache):  # a list instead of a tuple is fine
    return list(decode_ok(q, k_new, v_new, K_cache, V_cache))


def decode_is_causal(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=-2)
    V_cache = torch.cat([V_cache, v_new], dim=-2)
    return F.scaled_dot_product_attention(q, K_cache, V_cache, is_causal=True), K_cache, V_cache


def decode_attend_before_append(q, k_new, v_new, K_cache, V_cache):
    out = F.scaled_dot_product_attention(q, K_cache, V_cache)
    return out, torch.cat([K_cache, k_new], dim=-2), torch.cat([V_cache, v_new], dim=-2)


def decode_unscaled(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=-2)
    V_cache = torch.cat([V_cache, v_new], dim=-2)
    return torch.softmax(q @ K_cache.transpose(-2, -1), dim=-1) @ V_cache, K_cache, V_cache


def decode_softmax_wrong_dim(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=-2)
    V_cache = torch.cat([V_cache, v_new], dim=-2)
    w = torch.softmax(q @ K_cache.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
    return w @ V_cache, K_cache, V_cache


def decode_prepend(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([k_new, K_cache], dim=-2)
    V_cache = torch.cat([v_new, V_cache], dim=-2)
    return F.scaled_dot_product_attention(q, K_cache, V_cache), K_cache, V_cache


def decode_replace(q, k_new, v_new, K_cache, V_cache):
    return F.scaled_dot_product_attention(q, k_new, v_new), k_new, v_new


def decode_heads_dim(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=1)
    V_cache = torch.cat([V_cache, v_new], dim=1)
    return q, K_cache, V_cache


def decode_no_append(q, k_new, v_new, K_cache, V_cache):
    return F.scaled_dot_product_attention(q, K_cache, V_cache), K_cache, V_cache


def decode_out_only(q, k_new, v_new, K_cache, V_cache):
    return decode_ok(q, k_new, v_new, K_cache, V_cache)[0]


def decode_weights(q, k_new, v_new, K_cache, V_cache):
    K_cache = torch.cat([K_cache, k_new], dim=-2)
    V_cache = torch.cat([V_cache, v_new], dim=-2)
    w = torch.softmax(q @ K_cache.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w, K_cache, V_cache


# 8.2 ------------------------------------------------------------------------------------------
def esize(dtype):
    return torch.tensor([], dtype=dtype).element_size()


def bytes_ok(config, T, batch_size=1, dtype=torch.float16):
    H = config["num_attention_heads"]
    H_kv = config.get("num_key_value_heads", H)
    return 2 * config["num_hidden_layers"] * batch_size * H_kv * T * (config["hidden_size"] // H) * esize(dtype)


def bytes_no_two(config, T, batch_size=1, dtype=torch.float16):
    return bytes_ok(config, T, batch_size, dtype) // 2


def bytes_query_heads(config, T, batch_size=1, dtype=torch.float16):
    H = config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * batch_size * H * T * (config["hidden_size"] // H) * esize(dtype)


def bytes_elements(config, T, batch_size=1, dtype=torch.float16):
    return bytes_ok(config, T, batch_size, dtype) // esize(dtype)


def bytes_hidden_size(config, T, batch_size=1, dtype=torch.float16):
    H = config["num_attention_heads"]
    H_kv = config.get("num_key_value_heads", H)
    return 2 * config["num_hidden_layers"] * batch_size * H_kv * T * config["hidden_size"] * esize(dtype)


def bytes_always_two(config, T, batch_size=1, dtype=torch.float16):
    return bytes_ok(config, T, batch_size, torch.float16)


def bytes_no_batch(config, T, batch_size=1, dtype=torch.float16):
    return bytes_ok(config, T, 1, dtype)


def bytes_key_error(config, T, batch_size=1, dtype=torch.float16):
    H = config["num_attention_heads"]
    H_kv = config["num_key_value_heads"]
    return 2 * config["num_hidden_layers"] * batch_size * H_kv * T * (config["hidden_size"] // H) * esize(dtype)


# 8.3 ------------------------------------------------------------------------------------------
def mask_ok(T, w):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & (j > i - w)


def mask_numpy(T, w):  # NumPy is fine too
    return np.tril(np.ones((T, T), dtype=bool)) & ~np.tril(np.ones((T, T), dtype=bool), k=-w)


def mask_wide(T, w):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & (j >= i - w)


def mask_symmetric(T, w):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (i - j).abs() < w


def mask_inverted(T, w):
    return ~mask_ok(T, w)


def mask_causal_only(T, w):
    return torch.ones(T, T, dtype=torch.bool).tril()


def mask_float(T, w):
    return mask_ok(T, w).float()


def mask_transposed(T, w):
    return mask_ok(T, w).T


def mask_no_diagonal(T, w):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j < i) & (j > i - w)


# 8.4 ------------------------------------------------------------------------------------------
def expand_ok(K, num_heads):
    B, H_kv, T, d = K.shape
    g = num_heads // H_kv
    return K[:, :, None].expand(B, H_kv, g, T, d).reshape(B, num_heads, T, d)


def expand_cycled(K, num_heads):
    return K.repeat(1, num_heads // K.shape[1], 1, 1)


def expand_tokens(K, num_heads):
    return K.repeat_interleave(num_heads // K.shape[1], dim=2)


def expand_unchanged(K, num_heads):
    return K


def expand_too_many(K, num_heads):
    return K.repeat_interleave(num_heads, dim=1)


# ---------------------------------------------------------------------------------------------
NA, OK = "not attempted yet", "correct!"
CHECKERS = list(nb08.__all__)
C = ex
CASES = [
    (C.check_decode_step, (decode_ok,), True, "decode steps"),
    (C.check_decode_step, (decode_list,), True, OK),
    (C.check_decode_step, (stub,), None, NA),
    (C.check_decode_step, (stub_raises,), None, NA),
    (C.check_decode_step, (decode_is_causal,), False, "is_causal=True"),
    (C.check_decode_step, (decode_attend_before_append,), False, "attend AFTER appending"),
    (C.check_decode_step, (decode_unscaled,), False, "sqrt(head_dim)"),
    (C.check_decode_step, (decode_softmax_wrong_dim,), False, "softmax over the keys (dim=-1)"),
    (C.check_decode_step, (decode_prepend,), False, "at the END of the cache"),
    (C.check_decode_step, (decode_replace,), False, "concatenate, do not replace"),
    (C.check_decode_step, (decode_heads_dim,), False, "append along the tokens, dim=-2"),
    (C.check_decode_step, (decode_no_append,), False, "has the old shape"),
    (C.check_decode_step, (decode_out_only,), False, "return three things"),
    (C.check_decode_step, (decode_weights,), False, "those are the attention weights"),
    (C.check_cache_bytes, (bytes_ok,), True, "1 GiB"),
    (C.check_cache_bytes, (stub,), None, NA),
    (C.check_cache_bytes, (bytes_no_two,), False, "keys AND values"),
    (C.check_cache_bytes, (bytes_query_heads,), False, "use num_key_value_heads"),
    (C.check_cache_bytes, (bytes_elements,), False, "number of elements"),
    (C.check_cache_bytes, (bytes_hidden_size,), False, "not hidden_size"),
    (C.check_cache_bytes, (bytes_always_two,), False, "do not assume 2"),
    (C.check_cache_bytes, (bytes_no_batch,), False, "multiply by batch_size"),
    (C.check_cache_bytes, (bytes_key_error,), False, "config.get('num_key_value_heads'"),
    (C.check_window_mask, (mask_ok,), True, OK),
    (C.check_window_mask, (mask_numpy,), True, OK),
    (C.check_window_mask, (stub,), None, NA),
    (C.check_window_mask, (mask_wide,), False, "you let it see w + 1"),
    (C.check_window_mask, (mask_symmetric,), False, "the future leaked"),
    (C.check_window_mask, (mask_inverted,), False, "True means MAY attend"),
    (C.check_window_mask, (mask_causal_only,), False, "the window is missing"),
    (C.check_window_mask, (mask_float,), False, "return a boolean mask"),
    (C.check_window_mask, (mask_transposed,), False, "transpose"),
    (C.check_window_mask, (mask_no_diagonal,), False, "the diagonal (j == i) must be True"),
    (C.check_expand_kv, (expand_ok,), True, "enable_gqa=True"),
    (C.check_expand_kv, (stub,), None, NA),
    (C.check_expand_kv, (expand_cycled,), False, "repeat_interleave"),
    (C.check_expand_kv, (expand_tokens,), False, "along the tokens"),
    (C.check_expand_kv, (expand_unchanged,), False, "must appear num_heads // num_kv_heads"),
    (C.check_expand_kv, (expand_too_many,), False, "not num_heads = 6 times"),
]


def _id(case):
    checker, answers, _, _ = case
    return f"{checker.__name__}-{'+'.join(getattr(a, '__name__', repr(a)) for a in answers)}"


@pytest.mark.parametrize("checker, answers, expected, phrase", CASES, ids=[_id(c) for c in CASES])
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


def test_reference_solutions_agree_with_independent_facts():
    # decode_ok over steps = full causal attention (PyTorch's own)
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    Kc, Vc, outs = K[:, :, :2], V[:, :, :2], []
    for t in range(2, 5):
        out, Kc, Vc = decode_ok(Q[:, :, t:t + 1], K[:, :, t:t + 1], V[:, :, t:t + 1], Kc, Vc)
        outs.append(out)
    full = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    assert torch.allclose(torch.cat(outs, dim=2), full[:, :, 2:])
    # Llama-2-7B, 4096 tokens, float16: 2 GiB (512 KiB per token)
    llama2 = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}
    assert bytes_ok(llama2, 4096) == 2 * 2**30
    # the window mask, by its definition
    assert mask_ok(5, 2).sum().item() == 1 + 2 * 4
    # expand_ok against PyTorch's GQA
    Qg = torch.randn(1, 6, 3, 4, generator=gen)
    Kg, Vg = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(2))
    assert torch.allclose(F.scaled_dot_product_attention(Qg, expand_ok(Kg, 6), expand_ok(Vg, 6)),
                          F.scaled_dot_product_attention(Qg, Kg, Vg, enable_gqa=True), atol=1e-6)


def test_checkers_leave_the_global_random_state_alone(capsys):
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002 - the legacy global state is what we check
    ex.check_decode_step(decode_ok)
    ex.check_expand_kv(expand_ok)
    capsys.readouterr()
    after_torch, after_np = torch.rand(3), np.random.random(3)  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    assert torch.equal(after_torch, torch.rand(3))
    assert np.array_equal(after_np, np.random.random(3))  # noqa: NPY002
