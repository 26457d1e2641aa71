"""Exercise checkers for notebook 08 Attention for generation (PyTorch)."""

from __future__ import annotations

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _maxdiff,
    _rng,
    _shape,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_decode_step",
    "check_cache_bytes",
    "check_window_mask",
    "check_expand_kv",
]


# --------------------------------------------------------------------------------------------
# 8.1 One decode step with a cache
# --------------------------------------------------------------------------------------------
def _attend(q, K, V):
    """Reference attention of ``q`` ``(..., T_q, d)`` over all of ``K``, ``V`` (NumPy)."""
    return _softmax(q @ np.swapaxes(K, -1, -2) / np.sqrt(q.shape[-1])) @ V


@_checker
def check_decode_step(decode_step):
    """``decode_step(q, k_new, v_new, K_cache, V_cache)`` -> ``(out, K_cache, V_cache)``: append
    ``k_new``, ``v_new`` ``(B, H, 1, d)`` at the end of the caches ``(B, H, T, d)``, attend with the
    single query ``q`` to every cached key; several steps in a row must equal full causal attention
    recomputed over all tokens."""
    rng = _rng(801)
    B, H, d, T0, steps = 2, 3, 8, 2, 4  # d = 8 never equals T + 1 = 3..6
    T_all = T0 + steps
    Q = rng.normal(size=(B, H, T_all, d))
    K = rng.normal(size=(B, H, T_all, d))
    V = rng.normal(size=(B, H, T_all, d))
    # the reference: full causal attention over all tokens, row by row
    full = np.stack([_attend(Q[:, :, t:t + 1], K[:, :, :t + 1], V[:, :, :t + 1])[:, :, 0]
                     for t in range(T_all)], axis=2)
    K_cache, V_cache = K[:, :, :T0].copy(), V[:, :, :T0].copy()
    for t in range(T0, T_all):
        q, k, v = Q[:, :, t:t + 1], K[:, :, t:t + 1], V[:, :, t:t + 1]
        ans = _call(decode_step, _t(q.copy()), _t(k.copy()), _t(v.copy()), _t(K_cache.copy()),
                    _t(V_cache.copy()), name="decode_step",
                    on_error="shapes: q, k_new, v_new are (B, H, 1, head_dim) and the caches "
                             "(B, H, T, head_dim); append along the tokens, dim=-2")
        if isinstance(ans, torch.Tensor) or not isinstance(ans, (tuple, list)) or len(ans) != 3:
            raise _Wrong("return three things, (out, K_cache, V_cache): the output and the grown "
                         "caches, so that the next step can use them")
        out, K_new, V_new = (_arr(a, what) for a, what in
                             zip(ans, ("out", "K_cache", "V_cache"), strict=True))
        T = K_cache.shape[2]
        for got, old, new, what in ((K_new, K_cache, k, "K_cache"), (V_new, V_cache, v, "V_cache")):
            if got.shape == old.shape:
                raise _Wrong(f"the returned {what} has the old shape {got.shape}: append this "
                             "step's key and value to the cache (torch.cat along dim=-2)")
            if got.shape == new.shape:
                raise _Wrong(f"the returned {what} holds only the new token: the cache must keep "
                             "every earlier token too; concatenate, do not replace")
            _shape(got, (B, H, T + 1, d), what, "(B, H, T + 1, head_dim)")
            if _close(got, np.concatenate([new, old], axis=2)):
                raise _Wrong(f"{what}: put the new token at the END of the cache "
                             "(torch.cat([K_cache, k_new], dim=-2)): the cache keeps the tokens in "
                             "order, which masks, windows and position encodings rely on")
            if not _close(got, np.concatenate([old, new], axis=2)):
                raise _Wrong(f"{what} should be the old cache with this step's token appended "
                             f"(max abs diff {_maxdiff(got, np.concatenate([old, new], axis=2))})")
        if out.shape != (B, H, 1, d) and out.shape == (B, H, 1, T + 1):
            raise _Wrong("out has one entry per cached key: those are the attention weights; "
                         "return weights @ V_cache")
        _shape(out, (B, H, 1, d), "out", "(B, H, 1, head_dim): one output row for the one query")
        ref = full[:, :, t:t + 1]
        if not _close(out, ref):
            Kn, Vn = K_new, V_new
            raw = q @ np.swapaxes(Kn, -1, -2)
            cands = [
                ("your query sees only the first cached key: that is what is_causal=True's "
                 "top-left mask does with one query. A decode query attends to every cached key: "
                 "no mask", Vn[:, :, :1]),
                ("attend AFTER appending: the new token's own key and value belong in the "
                 "softmax too", _attend(q, K_cache, V_cache)),
                ("divide the scores by sqrt(head_dim) before the softmax",
                 _softmax(raw) @ Vn),
                ("softmax over the keys (dim=-1); over dim=-2 (a single query) every weight "
                 "becomes 1", Vn.sum(axis=2, keepdims=True)),
                ("the weights must be normalised with a softmax, not used as raw scores",
                 (raw / np.sqrt(d)) @ Vn),
            ]
            for hint, value in cands:
                if _close(out, value):
                    raise _Wrong(hint)
            raise _Wrong(f"step {t - T0 + 1}: out differs from full causal attention recomputed "
                         f"over all {t + 1} tokens by up to {_maxdiff(out, ref)}")
        K_cache, V_cache = K_new, V_new
    return (f"{steps} decode steps from a {T0}-token cache, each equal to the last row of full "
            "causal attention.")


# --------------------------------------------------------------------------------------------
# 8.2 Cache size from a config.json
# --------------------------------------------------------------------------------------------
def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@_checker
def check_cache_bytes(cache_bytes):
    """``cache_bytes(config, T, batch_size=1, dtype=torch.float16)`` -> bytes of keys and values:
    ``2 * num_hidden_layers * batch_size * num_key_value_heads * T * head_dim * element size`` with
    ``head_dim = hidden_size // num_attention_heads``; a config without ``num_key_value_heads`` has
    one key/value head per query head."""
    cases = (
        ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "hidden_size": 4096}, 8192, 1, torch.bfloat16),
        ({"num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
          "hidden_size": 48}, 10, 3, torch.float64),
        ({"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1,
          "hidden_size": 40}, 7, 2, torch.float32),
        ({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096},
         4096, 1, torch.float16),
    )
    # Typical mistakes, as formulas of (L, B, H, H_kv, T, head_dim, bytes per element). One
    # mistake can coincide with another on a single case (float16: "no factor 2" = "elements"),
    # so a hint is given only when the formula matches the answers of every case.
    mistakes = (
        ("keys AND values are cached: multiply by 2",
         lambda L, B, H, H_kv, T, d, e: L * B * H_kv * T * d * e),
        ("you returned the number of elements: multiply by the bytes per element "
         "(torch.empty((), dtype=dtype).element_size())",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H_kv * T * d),
        ("the bytes per element depend on dtype (8 for float64, 4 for float32, 2 for "
         "float16/bfloat16): do not assume 2",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H_kv * T * d * 2),
        ("the bytes per element depend on dtype (8 for float64, 4 for float32, 2 for "
         "float16/bfloat16): do not assume 4",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H_kv * T * d * 4),
        ("only the key/value heads are cached: use num_key_value_heads, not "
         "num_attention_heads (that is the point of grouped-query attention)",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H * T * d * e),
        ("the head dimension is hidden_size // num_attention_heads, not hidden_size",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H_kv * T * d * H * e),
        ("the head dimension is hidden_size // num_attention_heads, and only the "
         "num_key_value_heads key/value heads are cached",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H * T * d * H * e),
        ("every sequence in the batch has its own cache: multiply by batch_size",
         lambda L, B, H, H_kv, T, d, e: 2 * L * H_kv * T * d * e),
        ("every layer has its own cache: multiply by num_hidden_layers",
         lambda L, B, H, H_kv, T, d, e: 2 * B * H_kv * T * d * e),
        ("you counted bits: one byte is 8 bits",
         lambda L, B, H, H_kv, T, d, e: 2 * L * B * H_kv * T * d * e * 8),
    )
    answers, shapes = [], []
    for config, T, batch_size, dtype in cases:
        missing = "num_key_value_heads" not in config
        on_error = ("a config without num_key_value_heads has one key/value head per query head: "
                    "config.get('num_key_value_heads', config['num_attention_heads'])"
                    if missing else "")
        ans = _call(cache_bytes, dict(config), T, batch_size=batch_size, dtype=dtype,
                    name="cache_bytes", on_error=on_error)
        try:
            answers.append(float(ans))
        except (TypeError, ValueError):
            raise _Wrong(f"return a number of bytes; got {type(ans).__name__}") from None
        H = config["num_attention_heads"]
        shapes.append((config["num_hidden_layers"], batch_size, H,
                       config.get("num_key_value_heads", H), T, config["hidden_size"] // H,
                       _dtype_bytes(dtype)))
    refs = [2 * L * B * H_kv * T * d * e for L, B, H, H_kv, T, d, e in shapes]
    if answers == refs:
        return ("Llama-3-8B at 8192 tokens: 1 GiB per sequence; without its grouped-query heads "
                "it would be 4 GiB.")
    for hint, formula in mistakes:
        if all(got == formula(*shape) for got, shape in zip(answers, shapes, strict=True)):
            raise _Wrong(hint)
    k = next(i for i, (got, ref) in enumerate(zip(answers, refs, strict=True)) if got != ref)
    config, T, batch_size, dtype = cases[k]
    raise _Wrong(f"for {config}, T = {T}, batch_size = {batch_size}, {dtype} expected "
                 f"{refs[k]:,} bytes; got {answers[k]:,.0f}")


# --------------------------------------------------------------------------------------------
# 8.3 A sliding-window mask
# --------------------------------------------------------------------------------------------
def _band(T, lo, hi):
    """``lo <= i - j <= hi`` for every (query i, key j)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (i - j >= lo) & (i - j <= hi)


@_checker
def check_window_mask(sliding_window_mask):
    """``sliding_window_mask(T, w)`` -> ``(T, T)`` boolean, True where ``i - w < j <= i``."""
    for T, w in ((6, 3), (7, 1), (5, 5), (4, 10), (9, 4), (8, 2)):
        ans = _call(sliding_window_mask, T, w, name="sliding_window_mask")
        got = _arr(ans, "your mask")
        _shape(got, (T, T), "your mask", "(T, T): rows are queries, columns keys")
        ref = _band(T, 0, w - 1)
        what = f"(T = {T}, w = {w})"
        if got.dtype != np.bool_:
            if set(np.unique(got)) <= {0.0, 1.0} and np.array_equal(got.astype(bool), ref):
                raise _Wrong("the right pattern, but return a boolean mask (True = may attend), "
                             "e.g. straight from the comparisons; masked_fill needs booleans")
            raise _Wrong(f"return a boolean (T, T) mask; got values of dtype {got.dtype}")
        if np.array_equal(got, ref):
            continue
        cands = [
            (~ref, "True means MAY attend: you returned the masked positions"),
            (ref.T, "rows are queries and columns keys: you built the transpose (the future)"),
            (_band(T, -(w - 1), w - 1), "the future leaked: keys after the query (j > i) must "
                                        "be masked"),
            (_band(T, 0, T), "the window is missing: keys w or more positions back (j <= i - w) "
                             "must be masked too"),
            (_band(T, 0, w), "each query should see w keys, itself included: keep i - w < j "
                             "(strictly); you let it see w + 1"),
            (_band(T, 1, w - 1) if w > 1 else None,
             "a query attends to itself too: the diagonal (j == i) must be True"),
            (_band(T, 0, w - 2) if w > 1 else None,
             "each query should see w keys, itself included: you let it see w - 1"),
        ]
        for value, hint in cands:
            if value is not None and np.array_equal(got, value):
                raise _Wrong(f"{hint} {what}")
        i, j = np.argwhere(got != ref)[0]
        raise _Wrong(f"entry (query {i}, key {j}) should be {bool(ref[i, j])} {what}")
    return "every query sees its w most recent tokens, itself included."


# --------------------------------------------------------------------------------------------
# 8.4 Repeat the key/value heads
# --------------------------------------------------------------------------------------------
@_checker
def check_expand_kv(expand_kv):
    """``expand_kv(K, num_heads)``: ``(B, num_kv_heads, T, d)`` -> ``(B, num_heads, T, d)`` with
    query head ``h`` reading key/value head ``h // (num_heads // num_kv_heads)``; attention on the
    result equals ``F.scaled_dot_product_attention(..., enable_gqa=True)``."""
    rng = _rng(804)
    for B, H_kv, T, d, H in ((2, 2, 5, 3, 6), (1, 1, 4, 2, 4), (1, 4, 3, 2, 4), (2, 3, 2, 2, 6)):
        K = rng.normal(size=(B, H_kv, T, d))
        got = _arr(_call(expand_kv, _t(K.copy()), H, name="expand_kv"), "expand_kv(K, num_heads)")
        g = H // H_kv
        ref = np.repeat(K, g, axis=1)
        what = f"(K of shape {K.shape}, num_heads = {H})"
        if got.shape == (B, H_kv, T * g, d) and g > 1:
            raise _Wrong(f"you repeated along the tokens (dim 2): repeat the heads, dim=1 {what}")
        if got.shape == (B, H_kv * H, T, d) and g != H:
            raise _Wrong(f"repeat each key/value head num_heads // num_kv_heads = {g} times, not "
                         f"num_heads = {H} times {what}")
        if got.shape == K.shape and g > 1:
            raise _Wrong(f"the result still has {H_kv} heads; each key/value head must appear "
                         f"num_heads // num_kv_heads = {g} times {what}")
        _shape(got, ref.shape, "expand_kv(K, num_heads)", "(B, num_heads, T, d)")
        if _close(got, ref):
            continue
        if _close(got, np.tile(K, (1, g, 1, 1))):
            raise _Wrong("the heads are cycled (0, 1, 0, 1, ...), what Tensor.repeat does: query "
                         "head h must read key/value head h // group, so neighbours share; use "
                         f"K.repeat_interleave(group, dim=1) {what}")
        raise _Wrong(f"head h of the result should be key/value head h // {g} {what}")
    Q = rng.normal(size=(1, 6, 5, 4))
    K, V = rng.normal(size=(2, 1, 2, 5, 4))
    ours = _attend(Q, _arr(_call(expand_kv, _t(K.copy()), 6, name="expand_kv")),
                   _arr(_call(expand_kv, _t(V.copy()), 6, name="expand_kv")))
    sdpa = torch.nn.functional.scaled_dot_product_attention(_t(Q), _t(K), _t(V), enable_gqa=True)
    if not _close(ours, sdpa.numpy()):
        raise _Wrong("attention on your expanded K and V differs from SDPA(enable_gqa=True)")
    return "attention on the expanded heads equals F.scaled_dot_product_attention(enable_gqa=True)."
