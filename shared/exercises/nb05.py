"""Exercise checkers for notebook 05 Attention on the GPU (PyTorch).

References are computed before the learner's code runs, from inputs the learner only gets copies
of; answers computed in float32 are accepted (float32 tolerances); numbers must be numbers (text
that reads as one is rejected). The timing checker judges the procedure, not only the number: it
hands the learner a simulated GPU (``shared.benchmark.SimulatedGPU``) and reads its event log.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from shared.benchmark import SimulatedGPU

from ._core import (
    _arr,
    _call,
    _checker,
    _maxdiff,
    _rng,
    _shape,
    _softmax,
    _t,
    _Wrong,
)

__all__ = [
    "check_time_call",
    "check_online_softmax_step",
    "check_score_memory",
    "check_block_size",
]

ATOL, RTOL = 1e-5, 1e-4  # float32's tolerances: a float32 answer to a float64 question passes


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=ATOL, rtol=RTOL))


def _number(ans, what: str) -> float:
    """A learner's number as a float: ints, floats, NumPy scalars and one-element tensors are
    fine; text (even text that reads as a number), booleans and containers are not."""
    if isinstance(ans, torch.Tensor) and ans.numel() == 1:
        ans = ans.item()
    if isinstance(ans, np.generic):
        ans = ans.item()
    if isinstance(ans, str):
        raise _Wrong(f"you returned the text {ans!r}: return {what} as a number, not a string "
                     "(no formatting, no units)")
    if isinstance(ans, bool) or not isinstance(ans, numbers.Real):
        raise _Wrong(f"return {what} as a number; got {type(ans).__name__}")
    if not math.isfinite(ans):
        raise _Wrong(f"return {what} as a finite number; got {ans}")
    return float(ans)


# --------------------------------------------------------------------------------------------
# 5.1 Time a call correctly: the procedure, read from the simulated GPU's event log
# --------------------------------------------------------------------------------------------
def _timing_procedure(gpu: SimulatedGPU) -> int:
    """Raise ``_Wrong`` unless the log shows warm-up, a sync before the clock starts, several
    timed calls and a sync before the clock is read again; return the number of timed calls."""
    log = gpu.log
    reads = [i for i, e in enumerate(log) if e[0] == "clock"]
    launches = [i for i, e in enumerate(log) if e[0] == "launch"]
    if not launches:
        raise _Wrong("time_call never called f")
    if not reads:
        raise _Wrong("read the time with the clock you are given (clock()), not time.perf_counter "
                     "or time.time: on a real GPU it would be the same clock, and here it lets "
                     "the checker's simulated GPU follow along")
    if len(reads) < 2:
        raise _Wrong("read the clock twice, once before and once after the timed calls")
    first, last = reads[0], reads[-1]
    if not any(i < first for i in launches):
        raise _Wrong("the first call is slow (memory allocation, kernel selection, caches): make "
                     "a few untimed warm-up calls before starting the clock")
    timed = sum(first < i < last for i in launches)
    if timed == 0:
        raise _Wrong("call f() between the two clock readings: nothing was timed")
    syncs = [i for i, e in enumerate(log) if e[0] == "sync"]
    if not syncs:
        raise _Wrong("the GPU works asynchronously: f() returns once the kernel is queued, so "
                     "call sync() before reading the clock (and before starting it); without it "
                     "you time only the kernel launches")
    busy = [i for i in reads if log[i][2]]
    if last in busy:
        raise _Wrong("call sync() right before reading the clock at the end: kernels were still "
                     "running when you read it, so you timed only their launches")
    if first in busy:
        raise _Wrong("synchronise before starting the clock too (after the warm-up): the warm-up "
                     "kernels were still running, so their time was counted in your timing")
    if busy:
        raise _Wrong("call sync() before every clock reading: kernels were still running at one "
                     "of your readings")
    if timed < 2:
        raise _Wrong("time several calls between the two readings and divide by their number: "
                     "one call is too short to time reliably on a real machine")
    return timed


@_checker
def check_time_call(time_call):
    """``time_call(f, sync, clock=time.perf_counter)`` -> seconds per call of ``f()``, measured
    right: a few untimed warm-up calls, ``sync()`` before starting the clock, ``sync()`` before
    reading it again, the mean over several calls. The checker passes a simulated GPU."""
    notes = []
    for kernel_s in (2e-3, 3.5e-3):  # two speeds: a hard-coded answer cannot pass both
        gpu = SimulatedGPU(kernel_s=kernel_s, first_s=50e-3, launch_s=5e-6)
        ans = _call(time_call, gpu.launch, sync=gpu.synchronize, clock=gpu.clock,
                    name="time_call")
        got = _number(ans, "the seconds per call")
        timed = _timing_procedure(gpu)
        k = kernel_s
        if abs(got - k) <= 0.05 * k:
            notes.append(got)
            continue
        if abs(got - k * 1e3) <= 0.05 * k * 1e3:
            raise _Wrong("return seconds, not milliseconds")
        if abs(got - k * 1e6) <= 0.05 * k * 1e6:
            raise _Wrong("return seconds, not microseconds")
        if timed >= 2 and abs(got - timed * k) <= 0.05 * timed * k:
            raise _Wrong(f"you returned {got * 1e3:.2f} ms, the time of all {timed} timed calls: "
                         "return the time per call (divide by the number of timed calls)")
        raise _Wrong(f"the procedure looks right but the result is {got:.6f} s per call; the "
                     f"simulated kernel takes {k * 1e3:g} ms: compute (end - start) / calls from "
                     "the clock readings, not a fixed number")
    return (f"{notes[0] * 1e3:.2f} ms per call on the checker's simulated GPU (its first call "
            "takes 50 ms, then 2 ms per kernel); warm-up, sync, several calls, sync: all there.")


def _online_ref(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v


@_checker
def check_online_softmax_step(online_softmax_step):
    """``online_softmax_step(m, l, acc, s, v)`` -> ``(m_new, l_new, acc_new)`` after one block of
    scores ``s`` ``(n, b)`` and values ``v`` ``(b, d_v)``: running max ``m`` ``(n, 1)``, running
    sum ``l`` ``(n, 1)``, unnormalised ``acc`` ``(n, d_v)``; the output is ``acc / l`` at the end.
    Torch float64 tensors; start from ``m = -inf``, ``l = 0``, ``acc = 0``."""
    rng = _rng(501)
    n, d_v, b = 3, 2, 4
    V_all = rng.normal(size=(3 * b, d_v))
    S_all = rng.normal(size=(n, 3 * b)) * 2
    S_all[:, b:2 * b] += 3.0  # the second block raises the maximum: rescaling matters

    def step(m, l, acc, s, v):
        out = _call(online_softmax_step, _t(m.copy()), _t(l.copy()), _t(acc.copy()), _t(s.copy()),
                    _t(v.copy()), name="online_softmax_step")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise _Wrong("return the three updated quantities as a tuple (m_new, l_new, acc_new)")
        m_new, l_new, acc_new = (_arr(x, nm) for x, nm in zip(out, ("m_new", "l_new", "acc_new"),
                                                          strict=True))
        for x, nm in ((m_new, "m_new"), (l_new, "l_new")):
            if x.size != n:
                raise _Wrong(f"{nm} has shape {x.shape}; expected (n, 1) = {(n, 1)}")
        _shape(acc_new, (n, d_v), "acc_new", "(n, d_v)")
        return m_new.reshape(n, 1), l_new.reshape(n, 1), acc_new

    # one step from a state whose maximum is overtaken by the new block
    m0 = S_all[:, :b].max(axis=-1, keepdims=True)
    p0 = np.exp(S_all[:, :b] - m0)
    state = (m0, p0.sum(axis=-1, keepdims=True), p0 @ V_all[:b])
    s, v = S_all[:, b:2 * b], V_all[b:2 * b]
    got = step(*state, s, v)
    ref = _online_ref(*state, s, v)
    if not all(_close(g, r) for g, r in zip(got, ref, strict=True)):
        m, l, acc = state
        m_new = ref[0]
        p_new, p_old = np.exp(s - m_new), np.exp(s - m)
        alpha = np.exp(m - m_new)
        if np.isnan(np.concatenate([x.ravel() for x in got])).any():
            raise _Wrong("nan in your update: use exp(m_old - m_new) for the rescale factor (it is "
                         "0 on the first step, when m_old = -inf)")
        if not _close(got[0], m_new):
            if _close(got[0], np.full((n, 1), max(m.max(), s.max()))):
                raise _Wrong("m_new is per query row: the larger of each row's old maximum and "
                             "that row's largest new score (s.amax(dim=-1, keepdim=True)), not "
                             "the maximum over the whole block")
            if _close(got[0], s.max(axis=-1, keepdims=True)):
                raise _Wrong("m_new must be the larger of the old maximum m and this block's "
                             "maximum: torch.maximum(m, s.amax(dim=-1, keepdim=True))")
            raise _Wrong("m_new should be torch.maximum(m, s.amax(dim=-1, keepdim=True))")
        cands = [
            ("forgot to rescale: when the maximum grows, multiply the old l and acc by "
             "exp(m_old - m_new) before adding the new block",
             (l + p_new.sum(-1, keepdims=True), acc + p_new @ v)),
            ("the rescale factor is exp(m_old - m_new) (at most 1), not exp(m_new - m_old)",
             (l / alpha + p_new.sum(-1, keepdims=True), acc / alpha + p_new @ v)),
            ("exponentiate the new scores relative to the NEW maximum: exp(s - m_new)",
             (alpha * l + p_old.sum(-1, keepdims=True), alpha * acc + p_old @ v)),
            ("keep acc unnormalised (a running sum of p @ v); divide by l only once, after the "
             "last block", (ref[1], ref[2] / ref[1])),
        ]
        for hint, (l_c, acc_c) in cands:
            if _close(got[1], l_c) and _close(got[2], acc_c):
                raise _Wrong(hint)
        if not _close(got[1], ref[1]):
            raise _Wrong("l_new should be exp(m - m_new) * l + "
                         "exp(s - m_new).sum(-1, keepdim=True)")
        raise _Wrong("acc_new should be exp(m - m_new) * acc + exp(s - m_new) @ v")
    # the whole online pass, from the initial state, must give softmax(S) @ V
    m, l, acc = np.full((n, 1), -np.inf), np.zeros((n, 1)), np.zeros((n, d_v))
    for j in range(0, 3 * b, b):
        m, l, acc = step(m, l, acc, S_all[:, j:j + b], V_all[j:j + b])
    out = acc / l
    full = _softmax(S_all) @ V_all
    if not _close(out, full):
        if np.isnan(out).any():
            raise _Wrong("nan on the first step (m = -inf): compute m_new first, then the "
                         "rescale factor exp(m - m_new), which is exactly 0 there")
        raise _Wrong(f"after all blocks acc / l differs from softmax(S) @ V by up to "
                     f"{_maxdiff(out, full)}")
    return "three blocks, one running max/sum/accumulator, the same result as softmax(S) @ V."


def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@_checker
def check_score_memory(score_memory_bytes):
    """``score_memory_bytes(B, H, T, block_size=None, dtype=torch.float32)`` -> bytes of scores
    held at once: the full ``B*H*T*T`` matrix for naive attention (``block_size=None``), or one
    ``min(block_size, T) x min(block_size, T)`` tile per (batch, head) for tiled attention."""
    cases = ((1, 1, 4, None, torch.float32), (2, 12, 1024, None, torch.float16),
             (2, 12, 1024, 256, torch.float32), (1, 8, 100, 256, torch.float32),
             (4, 16, 4096, 64, torch.bfloat16), (3, 2, 50, None, torch.float64))
    for B, H, T, bs, dtype in cases:
        ans = _call(score_memory_bytes, B, H, T, block_size=bs, dtype=dtype,
                    name="score_memory_bytes")
        got = _number(ans, "the number of bytes")
        e = _dtype_bytes(dtype)
        side = T if bs is None else min(bs, T)
        ref = B * H * side * side * e
        if got == ref:
            continue
        what = f"B={B}, H={H}, T={T}, block_size={bs}, {dtype}"
        for value, hint in (
            (ref / e, "you returned the number of elements: multiply by the bytes per element "
                      "(4 for float32, 2 for float16/bfloat16, 8 for float64)"),
            (ref / B, "every batch entry has its own scores: multiply by B"),
            (ref / H, "every head has its own scores: multiply by H"),
            (ref / (B * H), "every (batch, head) pair has its own scores: multiply by B * H"),
            (B * H * T * side * e if bs is not None else None,
             "one tile is block_size x block_size, not T x block_size"),
            (B * H * bs * bs * e if bs is not None else None,
             "a block larger than T is clipped to T: use min(block_size, T)"),
            (B * H * T * T * e if bs is not None else None,
             "with a block_size only one block_size x block_size tile exists at a time, not the "
             "whole T x T matrix"),
            (ref * 8, "you counted bits: one byte is 8 bits (float32 = 4 bytes per element)"),
        ):
            if value is not None and got == value:
                raise _Wrong(f"{hint} (case {what})")
        raise _Wrong(f"for {what} expected {ref:,} bytes; got {got:,.0f}")
    return "naive attention's scores grow as T^2; a tile's do not grow with T at all."


def _largest_block(n_tiles: int, element: int, budget: int, strict: bool = False) -> int:
    """The largest power of two b with n_tiles * b * b * element <= budget (< when strict)."""
    b = 1
    while (n_tiles * (2 * b) ** 2 * element < budget if strict
           else n_tiles * (2 * b) ** 2 * element <= budget):
        b *= 2
    return b


@_checker
def check_block_size(choose_block_size):
    """``choose_block_size(B, H, budget_bytes, dtype=torch.float32)`` -> the largest power of two
    ``b`` (1, 2, 4, ...) whose score tiles, ``B * H * b * b`` elements, fit in ``budget_bytes``."""
    cases = ((1, 1, 64, torch.float32), (2, 12, 2 ** 20, torch.float32),
             (2, 12, 2 ** 20, torch.float16), (1, 1, 100, torch.float32),
             (8, 32, 2 ** 30, torch.bfloat16), (3, 1, 3 * 16 * 16 * 4, torch.float32))
    got, refs = [], []
    for B, H, budget, dtype in cases:
        ans = _call(choose_block_size, B, H, budget, dtype=dtype, name="choose_block_size")
        got.append(_number(ans, "the block size"))
        refs.append(_largest_block(B * H, _dtype_bytes(dtype), budget))
    if got == refs:
        return "the largest power-of-two tile that fits the budget."
    # Name the mistake that explains every case, then fall back to the first case that differs.
    patterns = (
        ("you returned the tile's bytes; return the block size b itself",
         lambda B, H, budget, e, ref: B * H * ref * ref * e),
        ("a tile that fills the budget exactly still fits: compare with <=, not <",
         lambda B, H, budget, e, ref: _largest_block(B * H, e, budget, strict=True)),
        ("there is one tile per (batch, head) pair: multiply b * b by B * H",
         lambda B, H, budget, e, ref: _largest_block(1, e, budget)),
        ("multiply by the bytes per element (4 for float32, 2 for float16/bfloat16)",
         lambda B, H, budget, e, ref: _largest_block(B * H, 1, budget)),
        ("you returned the first block that no longer fits: pick the largest block that still "
         "fits (half of yours)", lambda B, H, budget, e, ref: 2 * ref),
    )
    args = [(B, H, budget, _dtype_bytes(dtype), ref)
            for (B, H, budget, dtype), ref in zip(cases, refs, strict=True)]
    for hint, pattern in patterns:
        expected = [pattern(*a) for a in args]
        if expected != refs and all(g == x for g, x in zip(got, expected, strict=True)):
            raise _Wrong(hint)
    i = next(i for i, (g, r) in enumerate(zip(got, refs, strict=True)) if g != r)
    (B, H, budget, dtype), g, ref = cases[i], got[i], refs[i]
    what = f"B={B}, H={H}, budget={budget:,} bytes, {dtype}"
    if g > 0 and g == int(g) and int(g) & (int(g) - 1):
        raise _Wrong(f"block sizes are powers of two: round down to one ({what}: got {g:g}, "
                     f"expected {ref})")
    if g > ref:
        tile = B * H * g * g * _dtype_bytes(dtype)
        raise _Wrong(f"a block of {g:g} needs {tile:,.0f} bytes of scores, more than the budget "
                     f"({what})")
    raise _Wrong(f"a larger block still fits: {what} allows {ref}; got {g:g}")
