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
    "check_llama_step_prediction",
    "check_llama_step_fix",
    "check_ceiling_prediction",
    "check_decode_flop_per_byte",
    "check_sink_ring_cache",
    "check_padding_prediction",
    "check_left_padding",
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
# (T + arange(T_new), T = tokens cached before this pass), "zero" (arange(T_new)), "after" (read
# T after appending), and one of queries/keys still at arange(T_new). Key/value heads for the
# query heads: "ok" (interleaved, h // g) or "cycle" (Tensor.repeat: a planted bug). Mask: "ok"
# (bottom-right), "top_left" (is_causal=True), "chunk" (is_causal=T_new > 1: the planted bug,
# top-left for a pass of several tokens, no mask for one), "none".
_STEP_HINTS = {
    ("pos", "zero"): "the outputs equal the layer's in the prefill but differ from the first pass "
                     "after it on: which quantity is different for a pass that starts with tokens "
                     "already in the cache than for a prefill from an empty one?",
    ("pos", "after"): "the new tokens are rotated at positions one pass too far: count the tokens "
                      "that were cached BEFORE this pass",
    ("pos", "q_only"): "the prefill is right and every later pass is wrong, whatever the heads, "
                       "and the cached keys differ from the layer's: at what position is each "
                       "new key rotated, and at what position should it be?",
    ("pos", "k_only"): "the prefill is right and every later pass is wrong, a single decode step "
                       "too, whatever the heads: for each new query and each key it reads, what "
                       "distance do their rotations encode, and what should it be?",
    ("heads", "cycle"): "with grouped-query heads (H_kv < H) the outputs differ already in the "
                        "prefill: write down which key/value head each query head reads in your "
                        "code, and which one it should read (heads 0 .. g-1 share one group)",
    ("mask", "top_left"): "the mask is aligned top-left (is_causal=True): new query i sits at "
                          "position T + i and may see keys j <= T + i",
    ("mask", "chunk"): "the outputs are right in the prefill and in one-token steps, wrong in a "
                       "pass of several tokens after the prefill (a chunk): which keys may each "
                       "query of a chunk see, and which does your mask let it see?",
    ("mask", "none"): "without a mask, the queries of a pass of several tokens see the pass's "
                      "later tokens",
}
_STEP_OPTIONS = {"pos": ("ok", "zero", "after", "q_only", "k_only"), "heads": ("ok", "cycle"),
                 "mask": ("ok", "top_left", "chunk", "none")}


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
                   "chunk": _tril(n, T + n, 0 if n > 1 else T),
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


# The prediction, graded before the fix. First the learner pastes the buggy lines of
# buggy_llama_step, as many as they find (the notebook does not say how many there are): the query
# rotated at its place in the pass ("pos", the `positions` line or the `Q` line), Tensor.repeat
# ("heads", the K or V line) and is_causal=T_new > 1 ("mask"). Then, for each pasted line, that
# bug alone in three runs (H = 8): a prefill of 4 tokens then 3 decode steps, with H_kv = 2 and with
# H_kv = 1, and a prefill of 4, a chunk of 2 and a decode step, H_kv = 2: the first pass whose
# outputs differ from the layer on the whole sequence.
_BUGS = {"pos": {"pos": "k_only"}, "heads": {"heads": "cycle"}, "mask": {"mask": "chunk"}}
_BUG_MARKS = {"pos": ("positions=torch.arange(T_new)", "Q=apply_rope(layer.q_proj"),
              "heads": (".repeat(",), "mask": ("is_causal",)}  # in the code without spaces
_FIXES = ("repeat_interleave", "repeat_kv", "enable_gqa", "causal_mask", "attn_mask",
          "T+torch.arange")
_PREDICT_CHOICES = ("prefill", "chunk", "decode", "never")
# the three runs of the prediction: (H_kv, a chunk of 2 after the prefill?), named as in the hints
_PREDICT_RUNS = ((2, False), (1, False), (2, True))
_RUN_KEYS = ("H_kv=2", "H_kv=1", "chunk")  # the keys of each prediction, in _PREDICT_RUNS' order
_RUN_TEMPLATE = "{" + ", ".join(f"{key!r}: ..." for key in _RUN_KEYS) + "}"
_MASK_HINT = ("compare which keys is_causal=True lets each query see with the bottom-right mask of "
              "section 2, in the two kinds of pass of this run: a prefill from an empty cache "
              "(T_q = T_k) and a step of one query; the mask does not depend on the key/value "
              "heads")
_PREDICT_HINTS = {
    ("heads", 2): "write out which key/value head each of the 8 query heads reads with "
                  "Tensor.repeat and with repeat_interleave when H_kv = 2 (section 4's diagram); "
                  "the queries of a prefill read the keys too",
    ("heads", 1): "write out the list of key/value heads that Tensor.repeat and repeat_interleave "
                  "give the 8 query heads when there is only one",
    ("mask", 2): _MASK_HINT,
    ("mask", 1): _MASK_HINT,
    ("mask", "chunk"): ("compare which keys is_causal=True lets each query see with the "
                        "bottom-right mask of section 2, in each kind of pass of this run: a "
                        "prefill from an empty cache (T_q = T_k), a chunk of 2 after it "
                        "(T_q < T_k) and a step of one query"),
    ("pos", 2): "a query's score with a key depends on the distance between the positions they "
                "were rotated at: work it out for a prefill from an empty cache and for the first "
                "pass after it; the key/value heads play no part in it",
}
_PREDICT_HINTS[("pos", 1)] = _PREDICT_HINTS[("pos", "chunk")] = _PREDICT_HINTS[("pos", 2)]
_PREDICT_HINTS[("heads", "chunk")] = _PREDICT_HINTS[("heads", 2)]


def _distinct(hints) -> list[str]:
    """The hints in order, each once, leaving out one that another hint repeats and extends."""
    hints = list(dict.fromkeys(hints))
    return [h for h in hints if not any(o != h and o.startswith(h) for o in hints)]


def _check_bug_lines(bug_lines) -> list[str]:
    """``bug_lines``: a list of lines pasted from ``buggy_llama_step``, one per bug, any order.
    Returns the bug each line shows; raises _NotAttempted or _Wrong. The hints never quote a line
    of the function, nor say how many bugs there are."""
    if bug_lines is None:
        raise _NotAttempted("find the bugs first: paste each buggy line of buggy_llama_step into "
                            "the list bug_lines")
    if isinstance(bug_lines, str) or not isinstance(bug_lines, (list, tuple)) or not bug_lines:
        raise _Wrong(f"bug_lines must be a list of lines of buggy_llama_step, as strings; got "
                     f"{bug_lines!r}")
    kinds = []
    for i, line in enumerate(bug_lines):
        if not isinstance(line, str):
            raise _Wrong(f"bug_lines[{i}] should be a line of buggy_llama_step, as a string; got "
                         f"{type(line).__name__}")
        code = "".join(line.split("#", 1)[0].split())  # the code without comment or spaces
        if any(fix in code for fix in _FIXES):
            raise _Wrong(f"bug_lines[{i}] looks like a fix: paste the line as it stands in "
                         "buggy_llama_step")
        kind = next((k for k, marks in _BUG_MARKS.items() if any(m in code for m in marks)), None)
        if kind is None:
            raise _Wrong(f"bug_lines[{i}] is not a bug (or not a line of buggy_llama_step): a "
                         "pass after the prefill with 1 < H_kv < H would run it correctly")
        if kind in kinds:
            raise _Wrong(f"bug_lines[{i}] and bug_lines[{kinds.index(kind)}] are one bug: the "
                         "lines go wrong together and one fix mends both; keep one of them")
        kinds.append(kind)
    if len(kinds) < len(_BUGS):
        raise _Wrong(f"{'this line is a bug' if len(kinds) == 1 else 'these lines are bugs'}, and "
                     "the function has more: ask of every line what it computes in the passes "
                     "the author never tested, a decode step or a chunk of several tokens after "
                     "the prefill, with 1 < H_kv < H")
    return kinds


def _first_wrong_pass(bug: dict, H_kv: int, chunk: bool = False, H: int = 8) -> str:
    """Where the outputs of a LLaMA-style step with ``bug`` first differ from the right ones on
    random weights, over a prefill of 4 tokens then 3 decode steps, or with ``chunk`` a prefill of
    4, a chunk of 2 and a decode step: ``"prefill"``, ``"chunk"``, ``"decode"`` or ``"never"``."""
    rng = _rng(806)
    hidden, d = 32, 4
    W = {"q": rng.normal(0, 0.6, (H * d, hidden)), "k": rng.normal(0, 0.6, (H_kv * d, hidden)),
         "v": rng.normal(size=(H_kv * d, hidden)), "o": rng.normal(size=(hidden, H * d))}
    x = rng.normal(size=(1, 7, hidden))
    passes = ((0, 4), (4, 6), (6, 7)) if chunk else ((0, 4), (4, 5), (5, 6), (6, 7))
    ref = _llama_passes(W, x, passes, H, H_kv, 10000.0)[0]
    got = _llama_passes(W, x, passes, H, H_kv, 10000.0, **bug)[0]
    if not _close(got[:, :4], ref[:, :4]):
        return "prefill"
    if chunk and not _close(got[:, 4:6], ref[:, 4:6]):
        return "chunk"
    return "decode" if not _close(got, ref) else "never"


@_checker
def check_llama_step_prediction(bug_lines, first_wrong):
    """``bug_lines``: a list of the buggy lines of ``buggy_llama_step``, pasted as strings, one per
    bug, in any order. ``first_wrong``: one dict per line, in the same order, keyed by run:
    ``"H_kv=2"`` (a prefill of 4 tokens then 3 decode steps, H_kv = 2), ``"H_kv=1"`` (the same with
    H_kv = 1) and ``"chunk"`` (a prefill of 4, a chunk of 2 and a decode step, H_kv = 2), H = 8
    query heads; each value ``"prefill"``, ``"chunk"``, ``"decode"`` or ``"never"``: the first pass
    whose outputs, for that bug alone, differ from the layer on the whole sequence. A triple in the
    order of the keys is accepted too. The lines are checked first; the checker measures the
    passes itself, once every guess is in."""
    kinds = _check_bug_lines(bug_lines)
    if first_wrong is None:
        raise _NotAttempted("every bug found; now write, for each line of bug_lines, a dict "
                            + _RUN_TEMPLATE + " of \"prefill\", \"chunk\", \"decode\" or "
                            "\"never\" into first_wrong; the checker measures it, and shows the "
                            "measurement once all are right")
    if (isinstance(first_wrong, (str, dict)) or not isinstance(first_wrong, (list, tuple))
            or len(first_wrong) != len(kinds)):
        raise _Wrong(f"first_wrong must be a list of {len(kinds)} dicts, one per line of "
                     f"bug_lines in the same order, each {_RUN_TEMPLATE}; got {first_wrong!r}")
    triples = []
    for i, p in enumerate(first_wrong):
        if isinstance(p, dict):
            if set(p) != set(_RUN_KEYS):
                keys = ", ".join(map(repr, _RUN_KEYS))
                raise _Wrong(f"first_wrong[{i}] must have the keys {keys}; "
                             f"got {sorted(p, key=str)!r}")
            p = tuple(p[key] for key in _RUN_KEYS)
        elif isinstance(p, str) or not isinstance(p, (list, tuple)) or len(p) != 3:
            raise _Wrong(f"first_wrong[{i}] must be a dict {_RUN_TEMPLATE}; got {p!r}")
        triples.append(p)
    first_wrong = triples
    for i, triple in enumerate(first_wrong):
        for (_, chunk), key, guess in zip(_PREDICT_RUNS, _RUN_KEYS, triple, strict=True):
            if guess not in _PREDICT_CHOICES:
                raise _Wrong(f"write \"prefill\", \"chunk\", \"decode\" or \"never\" in "
                             f"first_wrong[{i}][{key!r}]; got {guess!r}")
            if guess == "chunk" and not chunk:
                raise _Wrong(f"first_wrong[{i}][{key!r}]: this run has no chunk, only a prefill "
                             "and decode steps")
    off, hints, shown = [], [], []
    for i, (kind, triple) in enumerate(zip(kinds, first_wrong, strict=True)):
        measured = [_first_wrong_pass(_BUGS[kind], H_kv, chunk) for H_kv, chunk in _PREDICT_RUNS]
        shown.append(f"bug_lines[{i}]: {dict(zip(_RUN_KEYS, measured, strict=True))}")
        for (H_kv, chunk), key, guess, m in zip(_PREDICT_RUNS, _RUN_KEYS, triple, measured,
                                                strict=True):
            if guess != m:  # name only the wrong guesses and why, not the measured answers
                off.append(f"first_wrong[{i}][{key!r}]")
                hints.append(_PREDICT_HINTS[(kind, "chunk" if chunk else H_kv)])
    if off:
        raise _Wrong(f"the lines are right; your guess{'es' if len(off) > 1 else ''} "
                     f"{', '.join(off)} {'are' if len(off) > 1 else 'is'} off: "
                     + "; ".join(_distinct(hints)))
    return (f"measured: {'; '.join(shown)}. A test of a cached step needs decode steps, a pass of "
            "several tokens after the prefill (a chunk) and 1 < H_kv < H: the author's test (one "
            "pass from an empty cache, H_kv = H) had none of them.")


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
# 8.2 The roofline of a grouped-query model, from its config.json
# --------------------------------------------------------------------------------------------
def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# Meta-Llama-3-8B's config.json (the entries the exercise needs)
_LLAMA_3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}


def _roof_numbers(config, T, batch_size, dtype) -> dict:
    H, D = config["num_attention_heads"], config["hidden_size"]
    return {"L": config["num_hidden_layers"], "H": H, "H_kv": config.get("num_key_value_heads", H),
            "D": D, "d": config.get("head_dim", D // H), "F": config["intermediate_size"],
            "V": config["vocab_size"], "T": T, "B": batch_size, "e": _dtype_bytes(dtype)}


def _roofline(c: dict, mistake: str | None = None, ceiling: bool = False) -> float:
    """FLOPs per byte read of one decode step (every sequence ``T`` tokens in, a kernel that reads
    each cached key/value head once), or with ``ceiling`` its limit for a large batch, as the
    given ``mistake`` would compute it."""
    d = c["D"] // c["H"] if mistake == "head_dim" else c["d"]
    kv_heads = c["H"] if mistake == "kv_weights" else c["H_kv"]
    attention_weights = 2 * c["D"] * c["H"] * d + 2 * c["D"] * kv_heads * d  # q, o; k, v
    mlp = 0 if mistake == "no_mlp" else 3 * c["D"] * c["F"]
    output_layer = 0 if mistake == "no_output" else c["V"] * c["D"]
    params = (c["L"] * (attention_weights + mlp) + output_layer
              + (c["V"] * c["D"] if mistake == "embedding" else 0))
    heads = c["H_kv"] if mistake == "kv_flops" else c["H"]
    attention_flops = 0 if mistake == "no_attn_flops" else 4 * c["L"] * heads * d * c["T"]
    e = 2 if mistake == "e2" else c["e"]
    reads = c["H"] // c["H_kv"] if mistake == "repeat" else 1
    cache = 2 * c["L"] * c["H_kv"] * c["T"] * d * e * reads  # one sequence's cache, as read
    per_seq_flops = (1 if mistake == "one_flop" else 2) * params + attention_flops
    if ceiling:
        return per_seq_flops / cache
    B = c["B"]
    weight_bytes = e * params * (B if mistake == "weights_per_seq" else 1)
    ratio = B * per_seq_flops / (weight_bytes + cache * (1 if mistake == "cache_once" else B))
    as_computed = {"units": ratio * 2**30 / 1e9, "gib": ratio * 2**30, "inverted": 1 / ratio}
    return as_computed.get(mistake, ratio)


_ROOF_HINTS = {
    "repeat": "your cache bytes are g = H / H_kv times too many: the kernel here reads each cached "
              "key/value head once for its whole group (H_kv heads, not H)",
    "kv_weights": "your k_proj and v_proj have one head per query head: with grouped-query "
                  "attention they project to the H_kv key/value heads only",
    "no_mlp": "the MLP's three matrices (hidden_size x intermediate_size each) are matrix products "
              "too: count their weights",
    "no_output": "the output layer (vocab_size x hidden_size) is a matrix product every step: "
                 "count its weights",
    "embedding": "the embedding table is not a matrix product: a step reads one row of it per "
                 "sequence; leave it out, as section 3 does",
    "one_flop": "a multiply-add is 2 FLOPs: count 2 per weight and sequence",
    "kv_flops": "every query head does its own dot products with the T cached keys and its own "
                "weighted sum of values: the attention FLOPs count H query heads, not H_kv",
    "no_attn_flops": "you left out attention's own FLOPs: 4 * head_dim * T per query head and "
                     "layer (q . k for every key, then the weights times V)",
    "e2": "the bytes per element depend on dtype (torch.empty((), dtype=dtype).element_size()): "
          "do not assume 2",
    "units": "FLOPs and bytes in mixed units: a GFLOP is 1e9 FLOPs but a GiB is 2**30 bytes; "
             "divide the FLOPs by the bytes as they are",
    "gib": "divide by bytes, not GiB",
    "inverted": "you returned bytes per FLOP: divide the FLOPs by the bytes",
    "weights_per_seq": "the weights are read once per step for the whole batch, not once per "
                       "sequence: only the caches' bytes grow with batch_size",
    "cache_once": "each sequence reads its own cache: the cache's bytes grow with batch_size",
    "head_dim": "when a config gives head_dim, it wins over hidden_size // num_attention_heads",
}

# The hidden cases of the function: (config, T, batch_size, dtype). batch_size != g = H / H_kv
# in each, else the weights and the cache give the same FLOPs per byte and many mistakes cancel.
_ROOF_CASES = (
    (_LLAMA_3_8B, 4096, 8, torch.bfloat16),
    ({"num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 48,
      "head_dim": 10, "intermediate_size": 100, "vocab_size": 70}, 12, 5, torch.float32),
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "intermediate_size": 64,
      "vocab_size": 50}, 9, 2, torch.float64),
    ({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 1, "hidden_size": 64,
      "intermediate_size": 160, "vocab_size": 90}, 30, 16, torch.float16),
)


def _llama3_ceiling(mistake: str | None = None) -> float:
    return _roofline(_roof_numbers(_LLAMA_3_8B, 4096, 1, torch.bfloat16), mistake, ceiling=True)


def _ceiling_hint(p: float, which: str) -> str | None:
    """None if the prediction ``p`` of ceiling ``which`` ("read once" or "repeat_kv") is within 5%
    of the right value, else what it misses: a named mistake when ``p`` is within 4% of one (the
    bands do not overlap each other or the 5% band), else a direction. Never the value itself."""
    right = _llama3_ceiling("repeat" if which == "repeat_kv" else None)
    if abs(p - right) <= 0.05 * right:
        return None
    batch_1 = _roofline(_roof_numbers(_LLAMA_3_8B, 4096, 1, torch.bfloat16))
    mlp_vocab = ("the MLP and the vocabulary differ: Llama-3-8B's wider MLP (14336) and larger "
                 "vocabulary (128256) add FLOPs per sequence, and its k_proj and v_proj are "
                 "smaller; count one sequence's FLOPs for Llama-3-8B")
    no_mlp = ("did you leave out the MLP? Its three 4096 x 14336 matrices are most of the weights, "
              "and each sequence does 2 FLOPs per weight")
    own_copy = ("count only what attention reads, the g = 4 copies, not repeat_kv's own read of "
                "the cache and write of the copies")
    bytes_hints = ((_llama3_ceiling("e2") / 2, "a 16-bit number is 2 bytes, not 4"),
                   (_llama3_ceiling("e2") * 2, "a 16-bit number is 2 bytes, not 1"))
    if which == "read once":
        known = (
            (4 * 7.2, "you scaled Llama-2-7B's 7.2 by 4: the cache shrinks 4 times, but "
                      + mlp_vocab),
            (7.2, "that is Llama-2-7B's ceiling: what happens to the bytes of a sequence's cache "
                  "when 32 query heads share 8 key/value heads?"),
            (_llama3_ceiling("repeat"), "that is the ceiling of a kernel that reads every "
                                        "key/value head g = 4 times (repeat_kv); this kernel "
                                        "reads each cached head once for its group"),
            (_llama3_ceiling("no_mlp"), no_mlp),
            *bytes_hints,
        )
    else:
        known = (
            (7.2, "you took Llama-2-7B's 7.2: through repeat_kv the cache read is as large as "
                  "Llama-2-7B's, but " + mlp_vocab),
            (_llama3_ceiling(), "that is the ceiling of a kernel that reads each cached head "
                                "once; repeat_kv first writes g = 4 copies of every key/value "
                                "head, and attention reads all of them"),
            (_llama3_ceiling("no_mlp") / 4, no_mlp),
            *((v / 4, h) for v, h in bytes_hints),
            *((_llama3_ceiling() / n, f"you counted {n} times the cache's bytes: " + own_copy)
              for n in (5, 9)),
        )
    known = (*known, (batch_1, "that is batch 1, where the weights' bytes dominate; the ceiling is "
                               "the large-batch limit, where all sequences share one read of the "
                               "weights and each reads its own cache"))
    for value, why in known:
        if abs(p - value) <= 0.04 * value:
            return why
    return (f"too {'high' if p > right else 'low'}: at the ceiling only what one sequence does "
            "counts, its FLOPs per step (2 per weight, plus attention) over the bytes of its cache "
            "as the kernel reads them")


@_checker
def check_ceiling_prediction(ceiling_read_once, ceiling_repeat_kv):
    """The learner's two predictions, by hand and before any code, of the most FLOPs per byte one
    Llama-3-8B decode step at T = 4096 (16-bit) reaches for any batch: ``ceiling_read_once`` with
    a kernel that reads each cached key/value head once for its group (about 32),
    ``ceiling_repeat_kv`` through ``repeat_kv`` (about 8: attention's reads of the g copies, not
    repeat_kv's own read and write). Each within 5%, so that 4 x 7.2 = 28.8
    (Llama-2-7B's ceiling scaled by g, with Llama-2's MLP and vocabulary) fails. A prediction near
    a known mistake is told which; the values are shown only when both are right."""
    guesses = {"ceiling_read_once": ceiling_read_once, "ceiling_repeat_kv": ceiling_repeat_kv}
    missing = [name for name, v in guesses.items() if v is None]
    if missing:
        raise _NotAttempted(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} still "
                            "None: write down your predictions first")
    number = (int, float, np.integer, np.floating)
    for name, v in guesses.items():
        if isinstance(v, bool) or not isinstance(v, number) or not np.isfinite(v):
            raise _Wrong(f"{name} should be a number of FLOPs per byte; got {v!r}")
    once, repeat = float(ceiling_read_once), float(ceiling_repeat_kv)
    if _ceiling_hint(repeat, "read once") is None and _ceiling_hint(once, "repeat_kv") is None:
        raise _Wrong("your two numbers are swapped: which kernel reads more bytes per step, and "
                     "which ceiling does that lower?")
    hints = {"ceiling_read_once": _ceiling_hint(once, "read once"),
             "ceiling_repeat_kv": _ceiling_hint(repeat, "repeat_kv")}
    if all(h is None for h in hints.values()):
        right, repeated = _llama3_ceiling(), _llama3_ceiling("repeat")
        return (f"read once, {right:.1f} FLOP per byte; through repeat_kv, {repeated:.1f} "
                f"(Llama-2-7B: 7.2). 4 x 7.2 = {4 * 7.2:.1f} would miss that Llama-3-8B's wider "
                "MLP and larger vocabulary add FLOPs per sequence; through repeat_kv the step "
                "reads as many cache bytes as Llama-2-7B's and still does more FLOPs. Now "
                "compute it.")
    given = {"ceiling_read_once": once, "ceiling_repeat_kv": repeat}
    parts = [f"{name} is right" if h is None else f"{name} {given[name]:.3g} is off: {h}"
             for name, h in hints.items()]
    raise _Wrong("; ".join(parts))


@_checker
def check_decode_flop_per_byte(decode_flop_per_byte):
    """``decode_flop_per_byte(config, T, batch_size, dtype=torch.bfloat16)`` -> FLOPs per byte read
    by one decode step of ``batch_size`` sequences, each ``T`` tokens in, for a Llama-style
    ``config`` dict (``num_hidden_layers``, ``num_attention_heads``, ``hidden_size``,
    ``intermediate_size``, ``vocab_size``; optional ``num_key_value_heads``, default one per query
    head, and ``head_dim``, default ``hidden_size // num_attention_heads``). FLOPs: 2 per weight of
    q, k, v, o, the MLP's 3 matrices and the output layer, per sequence, plus ``4 * L * H *
    head_dim * T`` per sequence. Bytes: the weights once, plus each sequence's cache (H_kv heads
    read once), all in ``dtype``."""
    answers, numbers = [], []
    for config, T, batch_size, dtype in _ROOF_CASES:
        on_error = ("a config without num_key_value_heads has one key/value head per query "
                    "head, and one without head_dim has hidden_size // num_attention_heads: "
                    "use config.get"
                    if "num_key_value_heads" not in config else "")
        ans = _call(decode_flop_per_byte, dict(config), T, batch_size, dtype=dtype,
                    name="decode_flop_per_byte", on_error=on_error)
        try:
            answers.append(float(ans))
        except (TypeError, ValueError):
            raise _Wrong(f"return a number (FLOPs per byte); got {type(ans).__name__}") from None
        numbers.append(_roof_numbers(config, T, batch_size, dtype))
    refs = [_roofline(c) for c in numbers]
    if all(np.isclose(a, r, rtol=1e-6, atol=0) for a, r in zip(answers, refs, strict=True)):
        c = _roof_numbers(_LLAMA_3_8B, 4096, 1, torch.bfloat16)
        at_1024, repeat = _roofline({**c, "B": 1024}), _llama3_ceiling("repeat")
        return (f"Llama-3-8B at T = 4096: {_roofline(c):.1f} FLOP per byte at batch 1, "
                f"{at_1024:.1f} at batch 1024, ceiling {_llama3_ceiling():.1f}; with repeated "
                f"key/value heads the ceiling would be {repeat:.1f}.")
    for mistake, hint in _ROOF_HINTS.items():
        if all(np.isclose(a, _roofline(c, mistake), rtol=1e-6, atol=0)
               for a, c in zip(answers, numbers, strict=True)):
            raise _Wrong(hint)
    k = next(i for i, (a, r) in enumerate(zip(answers, refs, strict=True))
             if not np.isclose(a, r, rtol=1e-6, atol=0))
    config, T, batch_size, dtype = _ROOF_CASES[k]
    raise _Wrong(f"for {config}, T = {T}, batch_size = {batch_size}, {dtype}: expected "
                 f"{refs[k]:.6g} FLOPs per byte, got {answers[k]:.6g}; count the FLOPs and the "
                 "bytes separately and compare each with the rules above")


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
    query over what ``update`` returns must equal full attention under the sink + band mask, and
    the storage behind the returned tensors must stay the one allocated at the first token."""
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
            if not all(isinstance(a, torch.Tensor) for a in ans):
                raise _Wrong("update should return K and V as torch tensors: views of the slots "
                             "you preallocated")
            storage = [(a.untyped_storage().data_ptr(), a.untyped_storage().nbytes()) for a in ans]
            kept = Kc.shape[2]
            if kept > sinks + window:
                raise _Wrong(f"after position {p} the cache returned {kept} tokens: a ring buffer "
                             f"holds at most sinks + window = {sinks + window} {what}")
            out = _masked_attend(Q[:, :, p:p + 1], Kc, Vc, np.ones((1, kept), dtype=bool))
            if _close(out, ref[:, :, p:p + 1]):
                if p == 0:
                    first_storage = storage
                elif storage != first_storage:
                    raise _Wrong(f"your cache allocates new storage at step {p} (the token at "
                                 f"position {p}): a ring buffer allocates its sinks + window slots "
                                 "once, at the first token, writes each new token into one of them "
                                 f"and returns views of them, never a new tensor {what}")
                continue
            cands = [
                (f"the first {sinks} tokens are sinks: they are never evicted, the ring turns only "
                 "over the window slots", _sink_band(T, window, 0)),
                (f"the first {sinks} tokens are sinks: they are never evicted, yet your ring "
                 "turns over all sinks + window slots and overwrites them. Which slots must a new "
                 "token never touch, and which of the others holds the oldest recent token?",
                 _sink_band(T, window + sinks, 0)),
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
                tokens = f"{p + 1} token" + ("s" if p else "")
                raise _Wrong(f"after only {tokens} the cache returned all {kept} slots: the "
                             "slots not written yet (zeros) would get weight in the softmax; "
                             f"return only the filled ones {what}")
            raise _Wrong(f"at position {p}, attention over the tokens your cache returned differs "
                         f"from the sink + window mask by up to "
                         f"{_maxdiff(out, ref[:, :, p:p + 1])} {what}")
    return ("every query, over the tokens the ring buffer kept, equals full attention under the "
            "sink + band mask, and every step wrote into the slots allocated at the first token.")


# --------------------------------------------------------------------------------------------
# 8.4 A batch of ragged prompts: left padding through the cache
# --------------------------------------------------------------------------------------------
def _pad_cases():
    """The hidden cases: (attention_mask (B, T_all) of 0/1 with left padding, passes). Each pass
    (a, b) feeds columns a..b-1; the mask the learner gets covers columns 0..b-1."""
    rng = _rng(804)
    cases = []
    for pads, width, steps, dtype in (((0, 3, 1), 6, (2, 1, 1), torch.long),
                                      ((2, 0), 4, (1, 3, 1), torch.bool),
                                      ((4, 1, 0, 2), 7, (1, 1), torch.int32)):
        order = rng.permutation(len(pads))  # which row holds the unpadded prompt varies
        pads = [pads[i] for i in order]
        T_all = width + sum(steps)
        mask = np.ones((len(pads), T_all), dtype=np.int64)
        for b, n in enumerate(pads):
            mask[b, :n] = 0
        edges = np.cumsum((width, *steps))
        passes = tuple(zip((0, *edges[:-1]), edges, strict=True))
        cases.append((mask, passes, dtype))
    return cases


def _pad_reference(mask, T_new, positions="ok", padding="ok", causal="ok"):
    """Positions ``(B, T_new)`` and allowed ``(B, T_new, T_k)`` for the last ``T_new`` columns of
    ``mask`` ``(B, T_k)``, with the given mistakes (NumPy)."""
    B, T_k = mask.shape
    cols = np.arange(T_k - T_new, T_k)
    pos = {"ok": np.cumsum(mask, axis=1) - 1, "one": np.cumsum(mask, axis=1),
           "cols": np.broadcast_to(np.arange(T_k), (B, T_k)),
           "zero": np.broadcast_to(np.arange(T_k) - (T_k - T_new), (B, T_k))}[positions][:, cols]
    key_ok = {"ok": mask.astype(bool), "none": np.ones_like(mask, dtype=bool),
              "inverted": ~mask.astype(bool)}[padding][:, None, :]  # (B, 1, T_k)
    j = np.arange(T_k)[None, :]
    see = {"ok": j <= cols[:, None], "top_left": j <= np.arange(T_new)[:, None],
           "none": np.ones((T_new, T_k), dtype=bool)}[causal]
    return pos, key_ok & see[None]


_PAD_HINTS = {
    ("positions", "cols"): "the padded sequences' positions count their padding: a sequence "
                           "alone starts at position 0 at its first real token, so a token's "
                           "position is the number of real tokens before it in its own row",
    ("positions", "one"): "the positions are one too large: the first real token of each "
                          "sequence is at position 0",
    ("positions", "zero"): "the new tokens are numbered from 0 in every pass: a decode token's "
                           "position is the number of real tokens before it, prompt included",
    ("padding", "none"): "the real queries attend to the padding tokens: a key whose "
                         "attention_mask is 0 must be masked out for every query of its row",
    ("padding", "inverted"): "the mask keeps the padding and masks the text: attention_mask is 1 "
                             "for real tokens and 0 for padding",
    ("causal", "top_left"): "the causal part is aligned top-left: the new tokens are the LAST "
                            "T_new columns, so query i sits at column T_k - T_new + i",
    ("causal", "none"): "a query of the prefill sees the tokens after it: padding alone is not "
                        "enough, keep the causal part too",
}
_PAD_OPTIONS = {"padding": ("ok", "none", "inverted"), "causal": ("ok", "top_left", "none")}
# ("inverted", "none") shows the same real rows as ("inverted", "ok"): it is never hinted


_PADDING_CHOICES = ("positions", "mask", "both", "neither")


def _padding_changes(model: str) -> dict:
    """Whether each mistake alone changes the real tokens' outputs of a one-head attention over a
    left-padded batch (a prefill; random weights), with ``model`` ``"rope"`` (RoPE on queries and
    keys) or ``"learned"`` (a learned position embedding added to each token):
    ``{"positions": bool, "mask": bool}``."""
    rng = _rng(805)
    d, T, pads = 8, 6, (3, 0, 1)
    x = rng.normal(size=(len(pads), T, d))
    Wq, Wk, Wv = (rng.normal(size=(d, d)) for _ in range(3))
    P = rng.normal(size=(T, d))  # the learned position embeddings, one row per position
    real = np.ones((len(pads), T), dtype=bool)
    for b, n in enumerate(pads):
        real[b, :n] = False

    def outputs(count_padding, mask_padding):
        pos = np.broadcast_to(np.arange(T), real.shape) if count_padding else real.cumsum(1) - 1
        out = np.zeros_like(x)
        for b in range(len(pads)):
            h = x[b] + P[np.maximum(pos[b], 0)] if model == "learned" else x[b]
            q, k = h @ Wq, h @ Wk
            if model == "rope":
                q, k = _rope(q, pos[b], 10000.0), _rope(k, pos[b], 10000.0)
            allowed = _tril(T, T, 0) & (real[b][None] if mask_padding else True)
            out[b] = _masked_attend(q, k, h @ Wv, allowed)
        return out[real]

    right = outputs(False, True)
    return {"positions": not _close(outputs(True, True), right),
            "mask": not _close(outputs(False, False), right)}


_PADDING_WHY = {
    ("rope", "positions"): "with RoPE: its scores depend on the difference of two positions only "
                           "(notebook 07): what does counting the padding do to the difference of "
                           "two real tokens of one row?",
    ("learned", "positions"): "with learned absolute positions: each token gets the embedding of "
                              "its own position added: which one does a real token get when its "
                              "position counts the padding?",
    "mask": "what does a real query's softmax do with a padding key it may see, and where does "
            "that key's value go?",
}
_MODEL_NAMES = {"rope": "RoPE", "learned": "learned absolute positions"}


@_checker
def check_padding_prediction(padding_prediction, padding_prediction_learned):
    """``padding_prediction`` (a layer with RoPE) and ``padding_prediction_learned`` (learned
    absolute position embeddings, as in TinyLM and GPT-2): each ``"positions"``, ``"mask"``,
    ``"both"`` or ``"neither"``: which mistake alone changes the outputs of the real tokens,
    positions that count the padding or a mask that lets the queries see it. Measured by the
    checker."""
    guesses = {"rope": padding_prediction, "learned": padding_prediction_learned}
    if None in guesses.values():
        raise _NotAttempted("padding_prediction and padding_prediction_learned must both be set: "
                            "write \"positions\", \"mask\", \"both\" or \"neither\" in each first")
    for name, guess in zip(("padding_prediction", "padding_prediction_learned"), guesses.values(),
                           strict=True):
        if guess not in _PADDING_CHOICES:
            raise _Wrong(f"write \"positions\", \"mask\", \"both\" or \"neither\" in {name}; "
                         f"got {guess!r}")
    why, mask_wrong = [], []  # the reasoning for each wrong part, not the measurement
    changed = {}
    for model, guess in guesses.items():
        changed[model] = _padding_changes(model)
        predicted = {"positions": guess in ("positions", "both"), "mask": guess in ("mask", "both")}
        if predicted["positions"] != changed[model]["positions"]:
            why.append(_PADDING_WHY[model, "positions"])
        if predicted["mask"] != changed[model]["mask"]:
            mask_wrong.append(_MODEL_NAMES[model])
    if mask_wrong:  # the same reasoning for both models: told once
        why.append(f"the mask, with {' and with '.join(mask_wrong)}: {_PADDING_WHY['mask']}")
    if why:
        raise _Wrong("think again: " + "; ".join(why))

    def effect(model):
        pos, mask = changed[model]["positions"], changed[model]["mask"]
        moved = ("change the real tokens' outputs" if pos
                 else "leave the real tokens' outputs as they are")
        return f"positions counting the padding {moved}, a mask that shows the padding " + \
            ("changes them" if mask else "leaves them")

    return (f"measured with RoPE: {effect('rope')}; with learned positions: {effect('learned')}. "
            "With RoPE, a shift shared by a whole row cancels in every score; a learned embedding "
            "reads the position itself. With any model, padding counted as positions uses up the "
            "context length sooner: a server gets both right.")


@_checker
def check_left_padding(pad_positions_and_mask):
    """``pad_positions_and_mask(attention_mask, T_new)`` -> ``(positions, allowed)``: for a batch
    of left-padded sequences, ``attention_mask`` ``(B, T_k)`` (1 for real tokens, 0 for padding;
    the last ``T_new`` columns are this pass's tokens), ``positions`` ``(B, T_new)`` are the new
    tokens' positions in their own sequences and ``allowed`` ``(B, 1, T_new, T_k)`` (bool, True
    where a query may attend) what each query sees. On every real token both must equal what its
    sequence would get alone, without padding (rows of padding queries are not checked)."""
    runs = []  # (mask so far, T_new, positions, allowed (B, T_new, T_k)) of every pass
    for mask, passes, dtype in _pad_cases():
        B = mask.shape[0]
        for a, b in passes:
            T_new, T_k = int(b - a), int(b)
            pads = (mask[:, :b] == 0).sum(1).tolist()
            what = f"(a pass of T_new = {T_new} tokens, T_k = {T_k} columns, padding {pads})"
            ans = _call(pad_positions_and_mask, torch.from_numpy(mask[:, :b].copy()).to(dtype),
                        T_new, name="pad_positions_and_mask", on_error=what)
            if isinstance(ans, torch.Tensor) or not isinstance(ans, (tuple, list)) or len(ans) != 2:
                raise _Wrong("return two things, (positions, allowed)")
            pos, allowed = _arr(ans[0], "positions"), _arr(ans[1], "allowed")
            _shape(pos, (B, T_new), "positions", "(B, T_new)")
            if allowed.shape == (B, T_new, T_k):
                raise _Wrong("allowed has no head dimension: give it the shape (B, 1, T_new, T_k) "
                             "so that it broadcasts over the heads (a (B, T_new, T_k) mask lines "
                             "the batch up with the heads)")
            _shape(allowed, (B, 1, T_new, T_k), "allowed", "(B, 1, T_new, T_k)")
            if allowed.dtype != bool:
                raise _Wrong("allowed should be a boolean mask (True where a query may attend); "
                             f"got {allowed.dtype}")
            runs.append((mask[:, :b], T_new, pos, allowed[:, 0], what))

    def matches(index, **flags):  # index 0: positions, 1: allowed; real query rows only
        for m, T_new, *got, _ in runs:
            real = m[:, -T_new:].astype(bool)
            if not np.array_equal(got[index][real], _pad_reference(m, T_new, **flags)[index][real]):
                return False
        return True

    if not matches(0):
        for kind in ("cols", "one", "zero"):
            if matches(0, positions=kind):
                raise _Wrong(_PAD_HINTS[("positions", kind)])
        m, T_new, pos, _, what = next(r for r in runs if not np.array_equal(
            r[2][r[0][:, -r[1]:] == 1], _pad_reference(r[0], r[1])[0][r[0][:, -r[1]:] == 1]))
        raise _Wrong(f"the positions of the real tokens are not those of each sequence alone: "
                     f"expected {_pad_reference(m, T_new)[0].tolist()} (padding not checked), got "
                     f"{pos.tolist()} {what}")
    if not matches(1):
        for combo in itertools.product(*_PAD_OPTIONS.values()):
            flags = dict(zip(_PAD_OPTIONS, combo, strict=True))
            if combo not in (("ok", "ok"), ("inverted", "none")) and matches(1, **flags):
                # with left padding the padding keys all precede the real queries: under an
                # inverted padding mask the causal part changes nothing, so name the padding
                raise _Wrong("; and ".join(_PAD_HINTS[(k, v)] for k, v in flags.items()
                                           if v != "ok"))
        for m, T_new, _, got, what in runs:
            ref = _pad_reference(m, T_new)[1]
            bad = np.argwhere((got != ref) & (m[:, -T_new:] == 1)[:, :, None])
            if len(bad):
                r, i, j = bad[0]
                raise _Wrong(f"in row {r}, query {i} (column {m.shape[1] - T_new + i}) should "
                             f"{'' if ref[r, i, j] else 'not '}see key column {j} {what}")
    return ("every real token gets the position and the keys it would have alone, through a "
            "prefill, a chunk and decode steps, with up to 4 padding tokens per row.")
