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
    "check_chunked_prefill",
    "check_cache_bytes",
    "check_sink_ring_cache",
    "check_crossover_context",
]


def _masked_attend(q, K, V, allowed):
    """Reference attention of ``q`` ``(..., T_q, d)`` over ``K``, ``V`` ``(..., T_k, d)`` where
    the boolean ``allowed`` ``(T_q, T_k)`` is True (NumPy, float64; an empty row gives zeros)."""
    scores = q @ np.swapaxes(K, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax(np.where(allowed, scores, -np.inf)) @ V


def _tril(T_q, T_k, diagonal):
    return np.tril(np.ones((T_q, T_k), dtype=bool), k=diagonal)


# --------------------------------------------------------------------------------------------
# 8.1 Chunked prefill through a cache
# --------------------------------------------------------------------------------------------
@_checker
def check_chunked_prefill(prefill_chunk):
    """``prefill_chunk(Q_new, k_new, v_new, K_cache, V_cache)`` -> ``(out, K_cache, V_cache)``:
    append the chunk's ``k_new``, ``v_new`` ``(B, H, T_new, d)`` at the end of the caches
    ``(B, H, T, d)`` and attend with the ``T_new`` queries under the bottom-right causal mask;
    chunks in a row must equal full causal attention recomputed over all tokens."""
    rng = _rng(801)
    B, H, d, T0, chunks = 2, 3, 8, 2, (3, 1, 4, 2)  # d = 8: never a number of cached tokens
    T_all = T0 + sum(chunks)
    Q, K, V = (rng.normal(size=(B, H, T_all, d)) for _ in range(3))
    full = _masked_attend(Q, K, V, _tril(T_all, T_all, 0))  # the reference: all tokens at once
    K_cache, V_cache, t = K[:, :, :T0].copy(), V[:, :, :T0].copy(), T0
    for n in chunks:
        q, k, v = Q[:, :, t:t + n], K[:, :, t:t + n], V[:, :, t:t + n]
        ans = _call(prefill_chunk, _t(q.copy()), _t(k.copy()), _t(v.copy()), _t(K_cache.copy()),
                    _t(V_cache.copy()), name="prefill_chunk",
                    on_error="shapes: Q_new, k_new, v_new are (B, H, T_new, head_dim) and the "
                             "caches (B, H, T, head_dim); append along the tokens, dim=-2")
        if isinstance(ans, torch.Tensor) or not isinstance(ans, (tuple, list)) or len(ans) != 3:
            raise _Wrong("return three things, (out, K_cache, V_cache): the output and the grown "
                         "caches, so that the next chunk can use them")
        out, K_new, V_new = (_arr(a, what) for a, what in
                             zip(ans, ("out", "K_cache", "V_cache"), strict=True))
        T = K_cache.shape[2]
        for got, old, new, what in ((K_new, K_cache, k, "K_cache"), (V_new, V_cache, v, "V_cache")):
            if got.shape == old.shape:
                raise _Wrong(f"the returned {what} has the old shape {got.shape}: append this "
                             "chunk's keys and values to the cache (torch.cat along dim=-2)")
            _shape(got, (B, H, T + n, d), what, "(B, H, T + T_new, head_dim)")
            if _close(got, np.concatenate([new, old], axis=2)):
                raise _Wrong(f"{what}: put the new tokens at the END of the cache "
                             "(torch.cat([K_cache, k_new], dim=-2)): the cache keeps the tokens in "
                             "order, and the bottom-right mask relies on it")
            if not _close(got, np.concatenate([old, new], axis=2)):
                raise _Wrong(f"{what} should be the old cache with this chunk's tokens appended "
                             f"(max abs diff {_maxdiff(got, np.concatenate([old, new], axis=2))})")
        _shape(out, (B, H, n, d), "out", "(B, H, T_new, head_dim): one row per new query")
        ref = full[:, :, t:t + n]
        if not _close(out, ref):
            Kn, Vn, T_k = K_new, V_new, T + n
            cands = [
                ("the mask is aligned top-left (what is_causal=True and torch.ones(T_q, T_k)"
                 ".tril() build): new query i sits at position T + i, so it may see keys "
                 "j <= T + i; build the mask bottom-right, tril(diagonal=T_k - T_q)",
                 _masked_attend(q, Kn, Vn, _tril(n, T_k, 0))),
                ("the future leaked: without a mask, the first queries of the chunk see the "
                 "chunk's later tokens; use the bottom-right causal mask",
                 _masked_attend(q, Kn, Vn, np.ones((n, T_k), dtype=bool))),
                ("each query must see its own key too: the diagonal of the bottom-right mask "
                 "(j == T + i) is allowed, tril(diagonal=T_k - T_q), not T_k - T_q - 1",
                 _masked_attend(q, Kn, Vn, _tril(n, T_k, T_k - n - 1))),
                ("attend AFTER appending: the chunk's own keys and values belong in the softmax "
                 "too", _masked_attend(q, K_cache, V_cache, np.ones((n, T), dtype=bool))),
                ("divide the scores by sqrt(head_dim) before the softmax",
                 _masked_attend(q * np.sqrt(d), Kn, Vn, _tril(n, T_k, T_k - n))),
            ]
            for hint, value in cands:
                if _close(out, value):
                    raise _Wrong(hint)
            raise _Wrong(f"a chunk of {n} queries on top of {T} cached tokens differs from full "
                         f"causal attention recomputed over all {T_k} tokens by up to "
                         f"{_maxdiff(out, ref)}")
        K_cache, V_cache, t = K_new, V_new, t + n
    return (f"chunks of {', '.join(map(str, chunks))} tokens on top of a {T0}-token cache, each "
            "equal to the matching rows of full causal attention.")


# --------------------------------------------------------------------------------------------
# 8.2 Cache size from a config.json
# --------------------------------------------------------------------------------------------
def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@_checker
def check_cache_bytes(cache_bytes):
    """``cache_bytes(config, T, batch_size=1, dtype=torch.float16)`` -> bytes of keys and values:
    ``2 * num_hidden_layers * batch_size * num_key_value_heads * T * head_dim * element size``
    with ``head_dim`` from the config when it has one, else ``hidden_size //
    num_attention_heads``; a config without ``num_key_value_heads`` has one key/value head per
    query head."""
    cases = (
        ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "hidden_size": 4096}, 8192, 1, torch.bfloat16),
        ({"num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
          "hidden_size": 48}, 10, 3, torch.float64),
        ({"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1,
          "hidden_size": 40}, 7, 2, torch.float32),
        ({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096},
         4096, 1, torch.float16),
        # Gemma-7B: 16 heads of an explicit head_dim 256, hidden size 3072 (3072 // 16 = 192)
        ({"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
          "head_dim": 256, "hidden_size": 3072}, 8192, 1, torch.bfloat16),
        ({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
          "head_dim": 6, "hidden_size": 40}, 5, 3, torch.float32),
    )
    # Typical mistakes, as formulas of one case's numbers (a dict: L, B, H, H_kv, T, d, e, hidden;
    # d is the right head_dim). A hint is given only when the formula matches the answers of every
    # case; on these cases no two formulas agree everywhere (tests/test_exercises_08.py checks it).
    mistakes = (
        ("keys AND values are cached: multiply by 2",
         lambda c: c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"]),
        ("you returned the number of elements: multiply by the bytes per element "
         "(torch.empty((), dtype=dtype).element_size())",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"]),
        ("the bytes per element depend on dtype (8 for float64, 4 for float32, 2 for "
         "float16/bfloat16): do not assume 2",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * 2),
        ("the bytes per element depend on dtype (8 for float64, 4 for float32, 2 for "
         "float16/bfloat16): do not assume 4",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * 4),
        ("only the key/value heads are cached: use num_key_value_heads, not "
         "num_attention_heads (that is the point of grouped-query attention)",
         lambda c: 2 * c["L"] * c["B"] * c["H"] * c["T"] * c["d"] * c["e"]),
        ("the head dimension is hidden_size // num_attention_heads (the query heads split the "
         "hidden size), not hidden_size // num_key_value_heads",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * (c["hidden"] // c["H_kv"]) * c["e"]),
        ("when a config gives head_dim, it wins: Gemma-7B has 16 heads of 256 dimensions, more "
         "than hidden_size // num_attention_heads = 192",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * (c["hidden"] // c["H"]) * c["e"]),
        ("the head dimension is hidden_size // num_attention_heads (or the config's head_dim), "
         "not hidden_size",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["hidden"] * c["e"]),
        ("every sequence in the batch has its own cache: multiply by batch_size",
         lambda c: 2 * c["L"] * c["H_kv"] * c["T"] * c["d"] * c["e"]),
        ("every layer has its own cache: multiply by num_hidden_layers",
         lambda c: 2 * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"]),
        ("you counted bits: one byte is 8 bits",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"] * 8),
        ("return bytes, not GiB: do not divide by 2**30",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"] / 2**30),
        ("return bytes, not GB: do not divide by 1e9",
         lambda c: 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"] / 1e9),
    )
    answers, numbers = [], []
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
        numbers.append(_cache_numbers(config, T, batch_size, dtype))
    refs = [_cache_formula(c) for c in numbers]
    if answers == refs:
        return ("Llama-3-8B at 8192 tokens: 1 GiB per sequence; without its grouped-query heads "
                "it would be 4 GiB; Gemma-7B (16 key/value heads of 256): 3.5 GiB.")
    for hint, formula in mistakes:
        if all(np.isclose(got, formula(c), rtol=1e-9, atol=0)
               for got, c in zip(answers, numbers, strict=True)):
            raise _Wrong(hint)
    k = next(i for i, (got, ref) in enumerate(zip(answers, refs, strict=True)) if got != ref)
    config, T, batch_size, dtype = cases[k]
    raise _Wrong(f"for {config}, T = {T}, batch_size = {batch_size}, {dtype} expected "
                 f"{refs[k]:,} bytes; got {answers[k]:,.0f}")


def _cache_numbers(config, T, batch_size, dtype) -> dict:
    H = config["num_attention_heads"]
    return {"L": config["num_hidden_layers"], "B": batch_size, "H": H,
            "H_kv": config.get("num_key_value_heads", H), "T": T,
            "d": config.get("head_dim", config["hidden_size"] // H), "e": _dtype_bytes(dtype),
            "hidden": config["hidden_size"]}


def _cache_formula(c: dict) -> int:
    return 2 * c["L"] * c["B"] * c["H_kv"] * c["T"] * c["d"] * c["e"]


# --------------------------------------------------------------------------------------------
# 8.3 A ring-buffer cache with attention sinks
# --------------------------------------------------------------------------------------------
def _sink_band(T, window, sinks):
    """``(T, T)``: query ``p`` sees key ``j`` when ``j <= p`` and (``j < sinks`` or
    ``p - window < j``)."""
    p, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= p) & ((j < sinks) | (p - j < window))


@_checker
def check_sink_ring_cache(SinkRingCache):
    """``SinkRingCache(window, sinks)``; ``update(k, v)`` with ``k``, ``v`` ``(B, H, 1, d)`` stores
    the next token and returns ``(K, V)`` of every token it keeps: the first ``sinks`` and the
    last ``window`` (at most ``sinks + window`` slots, in any order). Attention of each token's
    query over what ``update`` returns must equal full attention under the sink + band mask."""
    rng = _rng(803)
    B, H, d, T = 1, 2, 5, 14
    for window, sinks in ((4, 2), (3, 1), (5, 0)):
        Q, K, V = (rng.normal(size=(B, H, T, d)) for _ in range(3))
        ref = _masked_attend(Q, K, V, _sink_band(T, window, sinks))
        what = f"(window = {window}, sinks = {sinks})"
        cache = _call(SinkRingCache, window, sinks, name="SinkRingCache")
        update = getattr(cache, "update", None)
        if not callable(update):
            raise _Wrong("SinkRingCache(window, sinks) should build an object with an update(k, v) "
                         "method; keep the stub's class")
        for p in range(T):
            ans = _call(update, _t(K[:, :, p:p + 1].copy()), _t(V[:, :, p:p + 1].copy()),
                        name="update", on_error=f"at position {p} {what}")
            if isinstance(ans, torch.Tensor) or not isinstance(ans, (tuple, list)) or len(ans) != 2:
                raise _Wrong("update(k, v) should return two things, (K, V): the keys and values "
                             "of every token the cache keeps")
            Kc, Vc = (_arr(a, what_) for a, what_ in zip(ans, ("K", "V"), strict=True))
            if Kc.ndim != 4 or Kc.shape[:2] != (B, H) or Kc.shape[3] != d or Vc.shape != Kc.shape:
                raise _Wrong("update should return K and V of shape (B, H, tokens kept, "
                             f"head_dim); got {Kc.shape} and {Vc.shape} at position {p} {what}")
            kept = Kc.shape[2]
            if kept > sinks + window:
                raise _Wrong(f"after position {p} the cache returned {kept} tokens: a ring buffer "
                             f"holds at most sinks + window = {sinks + window} {what}")
            out = _masked_attend(Q[:, :, p:p + 1], Kc, Vc, np.ones((1, kept), dtype=bool))
            if _close(out, ref[:, :, p:p + 1]):
                continue
            cands = [
                (f"the first {sinks} tokens are sinks: they are never evicted, the ring turns only "
                 "over the window slots", _sink_band(T, window, 0)),
                (f"the first {sinks} tokens are sinks: they are never evicted; your ring turns "
                 "over "
                 "all sinks + window slots, so the sinks get overwritten. Token p >= sinks goes to "
                 "slot sinks + (p - sinks) % window", _sink_band(T, window + sinks, 0)),
                ("each query should see the last window tokens, itself included, plus the sinks: "
                 "you keep one recent token too few", _sink_band(T, window - 1, sinks)),
                ("each query should see the last window tokens, itself included, plus the sinks: "
                 "you keep one recent token too many", _sink_band(T, window + 1, sinks)),
                ("the window counts the recent tokens besides the sinks: the cache holds "
                 "sinks + window slots, not window", _sink_band(T, window - sinks, sinks)
                 if window > sinks else None),
            ]
            for hint, allowed in cands:
                if allowed is not None and _close(out, _masked_attend(
                        Q[:, :, p:p + 1], K, V, allowed[p:p + 1])):
                    raise _Wrong(f"{hint} {what}")
            if kept == sinks + window and p + 1 < sinks + window:
                raise _Wrong(f"after only {p + 1} tokens the cache returned all {kept} slots: the "
                             "slots not written yet (zeros) would get weight in the softmax; "
                             f"return only the filled ones {what}")
            raise _Wrong(f"at position {p}, attention over the tokens your cache returned differs "
                         f"from the sink + window mask by up to "
                         f"{_maxdiff(out, ref[:, :, p:p + 1])} {what}")
    return ("every query, over the tokens the ring buffer kept, equals full attention under the "
            "sink + band mask.")


# --------------------------------------------------------------------------------------------
# 8.4 When does the cache outgrow the weights?
# --------------------------------------------------------------------------------------------
@_checker
def check_crossover_context(crossover_context):
    """``crossover_context(config, num_params, batch_size=1, cache_dtype=torch.bfloat16,
    weight_dtype=torch.bfloat16)`` -> the smallest context length ``T`` (an int) at which the
    cache of ``batch_size`` sequences takes more bytes than the weights."""
    llama3 = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096}
    n_llama3 = 8_030_261_248
    small = {"num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2,
             "hidden_size": 96}
    cases = (
        (llama3, n_llama3, 16, torch.bfloat16, torch.bfloat16),
        (llama3, n_llama3, 1, torch.bfloat16, torch.bfloat16),
        (small, 1_000_003, 3, torch.float16, torch.float32),
        (small, 2_000_033, 5, torch.float32, torch.bfloat16),
    )

    def crossover(c, n, B, e_c, e_w, kv_heads=None, factor=2, batch=True):
        H = c["num_attention_heads"]
        H_kv = kv_heads(c) if kv_heads else c.get("num_key_value_heads", H)
        per_token = factor * c["num_hidden_layers"] * (B if batch else 1) * H_kv \
            * (c["hidden_size"] // H) * e_c
        return n * e_w // per_token + 1  # the first T with T * per_token > n * e_w

    def size(dtype):
        return torch.empty((), dtype=dtype).element_size()

    answers = []
    for config, n, B, cache_dtype, weight_dtype in cases:
        ans = _call(crossover_context, dict(config), n, batch_size=B, cache_dtype=cache_dtype,
                    weight_dtype=weight_dtype, name="crossover_context")
        if isinstance(ans, bool) or not isinstance(ans, (int, float, np.integer, np.floating)) \
                and not (isinstance(ans, torch.Tensor) and ans.numel() == 1):
            raise _Wrong(f"return a context length, one number of tokens; got {type(ans).__name__}")
        answers.append(float(ans))
    args = [(c, n, B, size(ec), size(ew)) for c, n, B, ec, ew in cases]
    refs = [crossover(*a) for a in args]
    if answers == [float(r) for r in refs]:
        return (f"Llama-3-8B's cache passes its 16 GB of weights at {refs[0]:,} tokens for a batch "
                f"of 16 (inside its 8192-token context), at {refs[1]:,} tokens for one sequence.")
    if all(a != int(a) for a in answers):
        raise _Wrong("a context length is a whole number of tokens: round up to the first T whose "
                     "cache is larger than the weights")
    mistakes = (
        ("that T's cache is not larger than the weights yet (at most equal): the first T where it "
         "exceeds them is floor(weights / per token) + 1",
         lambda c, n, B, ec, ew: crossover(c, n, B, ec, ew) - 1),
        ("the weights and the cache have their own dtypes: weight bytes = num_params x "
         "weight_dtype's size, cache bytes per element = cache_dtype's size (do not assume 2)",
         lambda c, n, B, ec, ew: crossover(c, n, B, 2, 2)),
        ("num_params counts parameters, not bytes: multiply by the weight dtype's size "
         "before comparing with the cache's bytes",
         lambda c, n, B, ec, ew: crossover(c, n, B, ec, 1)),
        ("the cache's bytes per element come from cache_dtype (the weights use weight_dtype)",
         lambda c, n, B, ec, ew: crossover(c, n, B, ew, ew)),
        ("every sequence in the batch has its own cache, while the weights are shared: the "
         "cache per token grows with batch_size",
         lambda c, n, B, ec, ew: crossover(c, n, B, ec, ew, batch=False)),
        ("keys AND values are cached: 2 vectors per token, head and layer",
         lambda c, n, B, ec, ew: crossover(c, n, B, ec, ew, factor=1)),
        ("only the key/value heads are cached: use num_key_value_heads, not num_attention_heads",
         lambda c, n, B, ec, ew: crossover(c, n, B, ec, ew,
                                           kv_heads=lambda c: c["num_attention_heads"])),
    )
    for hint, formula in mistakes:
        if all(got == float(formula(*a)) for got, a in zip(answers, args, strict=True)):
            raise _Wrong(hint)
    k = next(i for i, (got, ref) in enumerate(zip(answers, refs, strict=True)) if got != ref)
    config, n, B, ec, ew = cases[k]
    raise _Wrong(f"for {config} with {n:,} parameters ({ew}), batch_size = {B}, cache {ec}: "
                 f"expected T = {refs[k]:,}; got {answers[k]:,.0f}")
