"""Exercise checkers for notebook 05 Attention on the GPU (PyTorch)."""

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
    "check_time_call",
    "check_online_softmax_step",
    "check_score_memory",
    "check_block_size",
]

class _FakeGPU:
    """A simulated asynchronous device with a virtual clock.

    ``launch()`` costs the host 5 microseconds and queues a kernel (50 ms the first time: warm-up,
    then 2 ms); ``sync()`` waits until the queue is empty; ``clock()`` reads the host time."""

    LAUNCH, FIRST, KERNEL = 5e-6, 50e-3, 2e-3

    def __init__(self):
        self.now = 0.0
        self.busy_until = 0.0
        self.calls = self.syncs = self.reads = 0
        self.calls_at_first_read = None
        self.busy_at_first_read = None

    def launch(self, *args, **kwargs):
        self.now += self.LAUNCH
        start = max(self.now, self.busy_until)
        self.busy_until = start + (self.FIRST if self.calls == 0 else self.KERNEL)
        self.calls += 1

    def sync(self):
        self.now = max(self.now, self.busy_until)
        self.syncs += 1

    def clock(self):
        if self.reads == 0:
            self.calls_at_first_read = self.calls
            self.busy_at_first_read = self.busy_until > self.now
        self.reads += 1
        return self.now


@_checker
def check_time_call(time_call):
    """``time_call(f, sync, clock=time.perf_counter)`` -> seconds per call of ``f()``, measured
    right: a few untimed warm-up calls, ``sync()`` before starting the clock, ``sync()`` before
    reading it again, the mean over several calls. The checker passes a simulated GPU."""
    gpu = _FakeGPU()
    ans = _call(time_call, gpu.launch, sync=gpu.sync, clock=gpu.clock, name="time_call")
    try:
        got = float(ans)
    except (TypeError, ValueError):
        raise _Wrong(f"return the seconds per call as a number; got {type(ans).__name__}") from None
    k = gpu.KERNEL
    if gpu.calls == 0:
        raise _Wrong("time_call never called f")
    if gpu.reads == 0:
        raise _Wrong("read the time with the clock you are given (clock()), so the checker's "
                     "simulated GPU can follow along")
    if abs(got - k) <= 0.05 * k:
        return (f"{got * 1e3:.2f} ms per call on the checker's simulated GPU (its first call "
                "takes 50 ms, then 2 ms per kernel).")
    if got < 0.5 * k:
        raise _Wrong(f"you measured {got * 1e6:.1f} microseconds per call, but each kernel runs "
                     "2 ms: the GPU works asynchronously, so call sync() before reading the clock "
                     "at the end (you timed only the kernel launches)")
    if gpu.calls_at_first_read == 0:
        raise _Wrong("the first call is slow (memory allocation, kernel selection, caches): make "
                     "a few untimed warm-up calls before starting the clock")
    if gpu.busy_at_first_read:
        raise _Wrong("synchronise before starting the clock too (after the warm-up): otherwise "
                     "unfinished warm-up work is counted in your timing")
    ratio = got / k
    if abs(ratio - round(ratio)) < 0.05 * ratio and round(ratio) >= 2:
        raise _Wrong(f"you returned {got * 1e3:.2f} ms, about {round(ratio)} calls' worth: return "
                     "the time per call (divide by the number of timed calls)")
    if abs(got - k * 1e3) <= 0.05 * k * 1e3:
        raise _Wrong("return seconds, not milliseconds")
    raise _Wrong(f"expected about {k * 1e3:.2f} ms per call (as seconds: {k}); got {got:.6f} s")


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
            if _close(got[0], s.max(axis=-1, keepdims=True)) or _close(got[0], s.max()):
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
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a number of bytes; got {type(ans).__name__}") from None
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


@_checker
def check_block_size(choose_block_size):
    """``choose_block_size(B, H, budget_bytes, dtype=torch.float32)`` -> the largest power of two
    ``b`` (1, 2, 4, ...) whose score tiles, ``B * H * b * b`` elements, fit in ``budget_bytes``."""
    cases = ((1, 1, 64, torch.float32), (2, 12, 2 ** 20, torch.float32),
             (2, 12, 2 ** 20, torch.float16), (1, 1, 100, torch.float32),
             (8, 32, 2 ** 30, torch.bfloat16))
    for B, H, budget, dtype in cases:
        ans = _call(choose_block_size, B, H, budget, dtype=dtype, name="choose_block_size")
        try:
            got = float(ans)
        except (TypeError, ValueError):
            raise _Wrong(f"return a block size (an int); got {type(ans).__name__}") from None
        e = _dtype_bytes(dtype)
        ref = 1
        while B * H * (2 * ref) ** 2 * e <= budget:
            ref *= 2
        if got == ref:
            continue
        what = f"B={B}, H={H}, budget={budget:,} bytes, {dtype}"
        tile = B * H * got * got * e
        if got > 0 and got == int(got) and int(got) & (int(got) - 1):
            raise _Wrong(f"block sizes are powers of two: round down to one ({what}: got "
                         f"{got:g}, expected {ref})")
        if got == 2 * ref:
            raise _Wrong(f"a block of {got:g} needs {tile:,.0f} bytes, more than the budget: pick "
                         f"the largest block that still fits ({what})")
        if got > ref:
            raise _Wrong(f"a block of {got:g} needs {tile:,.0f} bytes of scores: did you forget "
                         f"B * H or the bytes per element? ({what})")
        raise _Wrong(f"a larger block still fits: {what} allows {ref}; got {got:g}")
    return "the largest power-of-two tile that fits the budget."
