"""Exercise checkers for notebook 08 Attention for generation (PyTorch)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ._core import (
    _arr,
    _call,
    _checker,
    _close,
    _maxdiff,
    _NotAttempted,
    _rng,
    _shape,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_llama_step_fix",
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
# 8.1 Find the bugs: a LLaMA-style step with its own cache
# --------------------------------------------------------------------------------------------
# The ways a step can go wrong that the checker names. Positions of the new tokens: "ok"
# (T + arange(T_new), T = tokens cached before this pass), "zero" (arange(T_new): the planted
# bug), "after" (read T after appending), and one of queries/keys still at arange(T_new).
# Key/value heads for the query heads: "ok" (interleaved, h // g) or "cycle" (Tensor.repeat:
# the planted bug). Mask: "ok" (bottom-right), "top_left" (is_causal=True), "none".
_STEP_HINTS = {
    ("pos", "zero"): "the new tokens are rotated at positions 0 .. T_new-1 in every pass, as if "
                     "each pass started the text again: a token's position is the number of "
                     "tokens cached before it plus its place in the pass, K_cache.shape[2] + "
                     "torch.arange(T_new) (a prefill from an empty cache cannot show this)",
    ("pos", "after"): "the positions start at the number of tokens cached BEFORE this pass: take "
                      "K_cache.shape[2] before appending the new keys",
    ("pos", "q_only"): "the queries are rotated at the right positions but the new keys are "
                       "still rotated at 0 .. T_new-1: rotate both at K_cache.shape[2] + "
                       "torch.arange(T_new)",
    ("pos", "k_only"): "the new keys are rotated at the right positions but the queries are "
                       "still rotated at 0 .. T_new-1: rotate both at K_cache.shape[2] + "
                       "torch.arange(T_new)",
    ("heads", "cycle"): "Tensor.repeat cycles the key/value heads (0, 1, 0, 1, ...), so query "
                        "head h reads head h % H_kv; it must read head h // g, g = H // H_kv: "
                        "repeat_interleave(g, dim=1) (or F.scaled_dot_product_attention(..., "
                        "enable_gqa=True) on the H_kv heads)",
    ("mask", "top_left"): "the mask is aligned top-left (is_causal=True): new query i sits at "
                          "position T + i and may see keys j <= T + i; use the bottom-right "
                          "causal_mask(T_new, T + T_new)",
    ("mask", "none"): "without a mask, the queries of a pass of several tokens see the pass's "
                      "later tokens: keep the bottom-right causal_mask(T_new, T + T_new)",
}
_STEP_OPTIONS = {"pos": ("ok", "zero", "after", "q_only", "k_only"), "heads": ("ok", "cycle"),
                 "mask": ("ok", "top_left", "none")}


def _rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Half-split RoPE (Hugging Face's LLaMA convention) of ``x`` ``(..., T, d)`` at
    ``positions`` ``(T,)`` (NumPy, float64)."""
    half = x.shape[-1] // 2
    angles = positions[:, None] * base ** (-np.arange(half) / half)  # (T, d/2)
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _llama_passes(W, x, passes, H, H_kv, base, pos="ok", heads="ok", mask="ok"):
    """Run a LLaMA-style attention layer (``W``: q, k, v, o weights as ``(out, in)`` arrays) pass
    by pass over ``x`` ``(B, T_all, hidden)`` with a growing cache, making the given mistakes.
    Returns the outputs of all passes, concatenated ``(B, T_all, hidden)``, and the final
    cache ``(K, V)``."""
    B, _, _ = x.shape
    d = W["q"].shape[0] // H
    g = H // H_kv
    K_c, V_c = np.zeros((B, H_kv, 0, d)), np.zeros((B, H_kv, 0, d))
    outs = []
    for a, b in passes:
        n, T = b - a, K_c.shape[2]
        right, zero = T + np.arange(n), np.arange(n)
        q_pos, k_pos = {"ok": (right, right), "zero": (zero, zero), "after": (right + n, right + n),
                        "q_only": (right, zero), "k_only": (zero, right)}[pos]
        xs = x[:, a:b]
        Q, k, v = (y.reshape(B, n, h, d).transpose(0, 2, 1, 3) for y, h in
                   ((xs @ W["q"].T, H), (xs @ W["k"].T, H_kv), (xs @ W["v"].T, H_kv)))
        Q, k = _rope(Q, q_pos, base), _rope(k, k_pos, base)
        K_c, V_c = np.concatenate([K_c, k], axis=2), np.concatenate([V_c, v], axis=2)
        idx = np.arange(H) // g if heads == "ok" else np.arange(H) % H_kv
        allowed = {"ok": _tril(n, T + n, T), "top_left": _tril(n, T + n, 0),
                   "none": np.ones((n, T + n), dtype=bool)}[mask]
        ctx = _masked_attend(Q, K_c[:, idx], V_c[:, idx], allowed)  # (B, H, n, d)
        outs.append(ctx.transpose(0, 2, 1, 3).reshape(B, n, H * d) @ W["o"].T)
    return np.concatenate(outs, axis=1), K_c, V_c


def _step_cases():
    """The hidden cases: (weights, x, passes, H, H_kv, rope base); a prefill, a chunk, then
    decode steps; grouped-query (g = 3) and multi-query heads."""
    rng = _rng(801)
    cases = []
    for hidden, H, H_kv, base in ((24, 6, 2, 10000.0), (16, 4, 1, 500.0)):
        d = hidden // H
        W = {"q": rng.normal(0, 0.6, (H * d, hidden)), "k": rng.normal(0, 0.6, (H_kv * d, hidden)),
             "v": rng.normal(size=(H_kv * d, hidden)), "o": rng.normal(size=(hidden, H * d))}
        x = rng.normal(size=(2, 9, hidden))
        cases.append((W, x, ((0, 4), (4, 6), (6, 7), (7, 8), (8, 9)), H, H_kv, base))
    return cases


@_checker
def check_llama_step_fix(llama_step):
    """``llama_step(layer, x, K_cache, V_cache)`` -> ``(out, K_cache, V_cache)``: one pass of a
    ``shared.llama.LlamaStyleAttention`` ``layer`` over the new tokens ``x`` ``(B, T_new,
    hidden_size)``, given the rotated keys and the values of the ``T`` earlier tokens ``(B, H_kv,
    T, head_dim)``; ``out`` ``(B, T_new, hidden_size)``, the caches with the new tokens appended.
    Run pass by pass (a prefill, a chunk of 2, then decode steps, each pass fed the caches the
    previous one returned), the outputs must equal the layer on the whole sequence at once."""
    from shared.llama import LlamaStyleAttention  # the layer the learner's step receives

    for W, x, passes, H, H_kv, base in _step_cases():
        B, T_all, hidden = x.shape
        d = hidden // H
        layer = LlamaStyleAttention(hidden, H, H_kv, rope_base=base).double().eval()
        with torch.no_grad():
            for name in "qkvo":
                getattr(layer, f"{name}_proj").weight.copy_(_t(W[name]))
        ref, K_ref, V_ref = _llama_passes(W, x, passes, H, H_kv, base)
        what = f"(H = {H} query heads, H_kv = {H_kv} key/value heads)"
        K_c, V_c, outs = _t(np.zeros((B, H_kv, 0, d))), _t(np.zeros((B, H_kv, 0, d))), []
        for a, b in passes:
            with torch.no_grad():
                ans = _call(llama_step, layer, _t(x[:, a:b].copy()), K_c, V_c, name="llama_step",
                            on_error=f"x of shape {(B, b - a, hidden)}, caches of shape "
                                     f"{(B, H_kv, a, d)} {what}")
            if isinstance(ans, torch.Tensor) or not isinstance(ans, (tuple, list)) or len(ans) != 3:
                raise _Wrong("return three things, (out, K_cache, V_cache): the output and the "
                             "grown caches, which the next pass receives")
            out = _arr(ans[0], "out")
            _shape(out, (B, b - a, hidden), "out", "(B, T_new, hidden_size)")
            for got, what_ in zip(ans[1:], ("K_cache", "V_cache"), strict=True):
                got = _arr(got, what_)
                if got.ndim == 4 and got.shape[1] == H != H_kv:
                    raise _Wrong(f"{what_} has {H} heads: cache the {H_kv} key/value heads and "
                                 f"repeat them only for the attention {what}")
                _shape(got, (B, H_kv, b, d), what_, "(B, H_kv, T + T_new, head_dim): the old "
                       "cache with this pass's tokens appended")
            outs.append(out)
            K_c, V_c = _t(_arr(ans[1])), _t(_arr(ans[2]))
        got = np.concatenate(outs, axis=1)
        if _close(got, ref) and _close(_arr(K_c), K_ref) and _close(_arr(V_c), V_ref):
            continue
        for combo in itertools.product(*_STEP_OPTIONS.values()):
            if combo == ("ok", "ok", "ok"):
                continue
            flags = dict(zip(_STEP_OPTIONS, combo, strict=True))
            out_c, K_combo, _ = _llama_passes(W, x, passes, H, H_kv, base, **flags)
            if _close(got, out_c) and _close(_arr(K_c), K_combo):  # the keys too: under a
                # top-left mask no query reaches this pass's keys, but the next passes do
                hints = [_STEP_HINTS[(k, v)] for k, v in flags.items() if v != "ok"]
                raise _Wrong("; and ".join(hints) + f" {what}")
        if _close(got, ref):
            raise _Wrong("the outputs are right but the returned caches are not the rotated keys "
                         "and the values of all tokens so far (append the new k and v, rotated "
                         f"keys, H_kv heads, along dim=2) {what}")
        n0 = passes[0][1]
        first_bad = next(i for i in range(T_all) if not _close(got[:, i], ref[:, i]))
        where = ("in the prefill (the first pass, from an empty cache)" if first_bad < n0
                 else f"from position {first_bad} on (a pass after the prefill)")
        raise _Wrong(f"the outputs differ from the layer on the whole sequence at once {where}, "
                     f"by up to {_maxdiff(got, ref)} {what}")
    return ("a prefill of 4 tokens, a chunk of 2 and 3 decode steps equal the layer on all 9 "
            "tokens at once, with grouped-query (g = 3) and multi-query heads.")


# --------------------------------------------------------------------------------------------
# 8.2 Cache size from a config.json
# --------------------------------------------------------------------------------------------
def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


_GEMMA_7B = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
             "head_dim": 256, "hidden_size": 3072}


@_checker
def check_cache_bytes(cache_bytes, gemma_7b_gib=None):
    """``cache_bytes(config, T, batch_size=1, dtype=torch.float16)`` -> bytes of keys and values:
    ``2 * num_hidden_layers * batch_size * num_key_value_heads * T * head_dim * element size``
    with ``head_dim`` from the config when it has one, else ``hidden_size //
    num_attention_heads``; a config without ``num_key_value_heads`` has one key/value head per
    query head. ``gemma_7b_gib``: the learner's prediction, made before running the function, of
    Gemma-7B's cache for one sequence of 8192 tokens in bfloat16, in GiB (compared, not graded)."""
    if gemma_7b_gib is None:
        raise _NotAttempted("gemma_7b_gib is still None: write down your prediction for Gemma-7B "
                            "first, then your function")
    if isinstance(gemma_7b_gib, bool) or not isinstance(
            gemma_7b_gib, (int, float, np.integer, np.floating)):
        raise _Wrong(f"gemma_7b_gib should be a number of GiB; got {type(gemma_7b_gib).__name__}")
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
        gemma = _cache_formula(_cache_numbers(_GEMMA_7B, 8192, 1, torch.bfloat16)) / 2**30
        split = 2 * 28 * 16 * 8192 * (3072 // 16) * 2 / 2**30  # head_dim from the hidden size
        if abs(gemma_7b_gib - gemma) <= 0.02 * gemma:
            verdict = "as you predicted"
        elif abs(gemma_7b_gib - split) <= 0.02 * split:
            verdict = (f"you predicted {split:g} GiB, with 3072 / 16 = 192 dimensions per head; "
                       "its config's head_dim, 256, wins: its q_proj maps 3072 to 16 x 256 = "
                       "4096 features")
        else:
            verdict = f"you predicted {float(gemma_7b_gib):.4g} GiB"
        return ("Llama-3-8B at 8192 tokens: 1 GiB per sequence, 4 GiB without its grouped-query "
                f"heads. Gemma-7B: {gemma:g} GiB ({verdict}).")
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
