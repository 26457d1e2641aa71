"""Exercise checkers for notebook 05 Attention on the GPU (PyTorch).

5.1 predict what a subtly buggy timing loop reports, then design the fastest-block timer's
(blocks, calls) within a budget of timed calls so that it reports the kernel's time within 2 %
wherever a neighbour's stretch of slowed kernels falls (``shared.benchmark.SimulatedGPU`` with a
per-``synchronize()`` host cost; every position simulated, hidden GPUs too); 5.2 merge two
partial online-softmax states (split-K, as Flash-Decoding does); 5.3 predict the textbook
attention chain's forward + backward peak, in score matrices (the notebook then measures it, and
the chain with the ``nan_to_num`` guard, whose backward makes temporaries of its own);
5.4 find which query rows a key-block loop that never rescales its accumulator still gets right
(the checker runs the loop to find out), then design the smallest test that catches that bug (one
query, two keys in blocks of one, a later maximum, a nonzero earlier value; the checker runs its
own float64 copy of the loop on it), then fix the loop (SDPA and softmax refused, and so are two
sweeps over the keys, a maximum taken by amax, max, sort, topk and the like, and ways out of
PyTorch: the loop is fixed, not replaced); 5.5 the smallest head_dim at which S = Q @ K^T reaches
a device's balance point, or None (exact rational reference; each typical mistake named).

References are computed before the learner's code runs; answers computed in float32 are accepted
(float32 tolerances); numbers must be numbers (text that reads as one is rejected).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from fractions import Fraction

import numpy as np
import torch

from shared.benchmark import SimulatedGPU

from ._core import (
    _arr,
    _call,
    _checker,
    _did_work,
    _NotAttempted,
    _rng,
    _shape,
    _t,
    _Wrong,
)

__all__ = [
    "check_buggy_timing_prediction",
    "check_timing_plan",
    "check_merge_partials",
    "check_training_peak",
    "check_rows_right",
    "check_catching_test",
    "check_key_block_fix",
    "check_compute_bound_head_dim",
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
# 5.1 Time a call on a shared GPU: predict a buggy loop, then design the fastest-block timer's plan
# --------------------------------------------------------------------------------------------
PLAN_GPU = dict(kernel_s=20e-6, launch_s=5e-6, sync_s=10e-6, first_s=1e-3, stretch=40, slow_x=3.0)
PLAN_BUDGET, PLAN_TOL = 200, 0.02  # timed calls in all; the report within 2 % of kernel_s


def _n(count: int, word: str) -> str:
    """``"1 call"``, ``"2 calls"``: a count with its noun, singular or plural."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _fastest_block_s(gpu: SimulatedGPU, blocks: int, calls: int) -> float:
    """Section 3's fastest-block timer on a simulated GPU: one untimed warm-up call, then per
    block synchronize(), read the clock, launch ``calls`` kernels, synchronize(), read the clock;
    seconds per call of the fastest block."""
    gpu.launch()
    best = math.inf
    for _ in range(blocks):
        gpu.synchronize()
        start = gpu.clock()
        for _ in range(calls):
            gpu.launch()
        gpu.synchronize()
        best = min(best, (gpu.clock() - start) / calls)
    return best


def _plan_reports(blocks: int, calls: int, kernel_s, launch_s, sync_s, first_s, stretch, slow_x):
    """(the report with no neighbour, [(first slowed kernel, report)] for every position of the
    stretch that overlaps the timed kernels 1 .. blocks * calls; kernel 0 is the warm-up)."""
    def report(slow):
        gpu = SimulatedGPU(kernel_s, first_s, launch_s, slow_calls=slow, slow_x=slow_x,
                           sync_s=sync_s)
        return _fastest_block_s(gpu, blocks, calls)

    positions = range(2 - stretch, blocks * calls + 1)
    return report(range(0)), [(p, report(range(p, p + stretch))) for p in positions]


def _fewest_calls_per_block() -> int:
    """The fewest calls per block whose clean block reports within PLAN_TOL of the kernel:
    (c kernel + launch + sync) / c <= (1 + tol) kernel."""
    g = PLAN_GPU
    return math.ceil((g["launch_s"] + g["sync_s"]) / (PLAN_TOL * g["kernel_s"]) - 1e-9)


def _blocks_needed(calls: int) -> int:
    """Blocks of ``calls`` calls so that one stays clean: a stretch of k kernels touches at most
    ceil((k - 1) / calls) + 1 of them."""
    return math.ceil((PLAN_GPU["stretch"] - 1) / calls) + 2


def _fewest_plan() -> tuple[int, int]:
    """(blocks, calls) with the fewest timed calls in all on the stated GPU (ties: fewer calls)."""
    c0 = _fewest_calls_per_block()
    plans = [(_blocks_needed(c), c) for c in range(c0, PLAN_BUDGET + 1)]
    return min(plans, key=lambda p: (p[0] * p[1], p[1]))


def _plan_cases():
    """The stated GPU, then hidden ones no harder in either bound: (launch + sync) / kernel at most
    0.75 and a stretch of at most 40 kernels, other speeds and slow-downs."""
    rng = _rng(51)
    hidden = []
    for _ in range(2):
        kernel = float(rng.uniform(10e-6, 2e-3))
        launch = kernel * float(rng.uniform(0.1, 0.3))
        sync = kernel * 0.75 - launch - kernel * float(rng.uniform(0.0, 0.1))
        hidden.append(dict(kernel_s=kernel, launch_s=launch, sync_s=sync, first_s=50 * kernel,
                           stretch=int(rng.integers(25, 41)), slow_x=float(rng.uniform(2.0, 5.0))))
    return [PLAN_GPU] + hidden


@_checker
def check_timing_plan(plan):
    """``plan = (blocks, calls)`` for section 3's fastest-block timer on a simulated shared GPU:
    kernels of 20 us, launches of 5 us, 10 us of host time per ``synchronize()``; a neighbour slows
    a stretch of 40 consecutive kernels x3, anywhere. The report must be within 2 % of 20 us for
    every position of the stretch (and on hidden GPUs no harder in either bound), with the fewest
    timed calls in all (at most 200). A clean block reports (c x 20 + 15) / c us: c >= 38. A
    stretch of 40 can touch ceil(39 / c) + 1 blocks, so one more is needed: (4, 38) works with 152
    calls, (3, 39) with 117, the fewest (:func:`_fewest_plan`)."""
    if plan is None:
        raise _NotAttempted("write (blocks, calls) in plan")
    if isinstance(plan, str) or not isinstance(plan, (tuple, list)) or len(plan) != 2:
        raise _Wrong(f"write two whole numbers, plan = (blocks, calls); got {plan!r:.60}")
    for x in plan:
        if isinstance(x, str):
            raise _Wrong(f"you wrote the text {x!r}: blocks and calls are numbers, not strings")
        if isinstance(x, bool) or not isinstance(x, (numbers.Integral, np.integer)):
            raise _Wrong(f"blocks and calls are counts: write them as ints; got "
                         f"{type(x).__name__} {x!r:.20}")
    blocks, calls = (int(x) for x in plan)
    if blocks < 1 or calls < 1:
        raise _Wrong("blocks and calls are counts: both must be at least 1")
    g = PLAN_GPU
    us, fixed = 1e6 * g["kernel_s"], 1e6 * (g["launch_s"] + g["sync_s"])
    if blocks * calls > PLAN_BUDGET:
        raise _Wrong(f"over budget: {_n(blocks, 'block')} of {_n(calls, 'call')} "
                     f"time{'s' if blocks == 1 else ''} {blocks * calls} calls; the budget is "
                     f"{PLAN_BUDGET}")
    for k, case in enumerate(_plan_cases()):
        clean, reports = _plan_reports(blocks, calls, **case)
        where = "" if k == 0 else " (on a hidden GPU)"
        if clean > (1 + PLAN_TOL) * case["kernel_s"]:
            swapped = k == 0 and calls < blocks and (
                _plan_reports(calls, blocks, **case)[0] <= (1 + PLAN_TOL) * g["kernel_s"])
            order = (f"the order is plan = (blocks, calls): yours times {_n(blocks, 'block')} "
                     f"of {_n(calls, 'call')}, and that is " if swapped else "")
            raise _Wrong(f"{order}too few calls per block{where}: a block's one launch and one "
                         f"synchronize() are a fixed {fixed:.0f} µs, {fixed / us:.0%} of a "
                         f"{us:.0f} µs call, which no kernel hides; over {_n(calls, 'call')} even "
                         f"a clean block reports {clean / case['kernel_s'] - 1:.2%} too much, "
                         f"above {PLAN_TOL:.0%}")
        p, worst = max(reports, key=lambda r: r[1])
        if worst > (1 + PLAN_TOL) * case["kernel_s"]:
            of = f"of {_n(calls, 'call')}"
            touched = {1: "your one block", 2: f"both of your blocks {of}"}.get(
                blocks, f"all {blocks} of your blocks {of}")
            k_slow = case["stretch"]
            raise _Wrong(f"too few blocks{where}: a stretch of {k_slow} slowed kernels starting "
                         f"at timed kernel {p} touches {touched}, and the fastest then reports "
                         f"{worst / case['kernel_s'] - 1:.0%} too much; how many blocks {of} "
                         f"can {k_slow} consecutive kernels touch?")
        if k == 0:
            summary = (clean, worst, len(reports))
    fewest_blocks, fewest_calls = _fewest_plan()
    if blocks * calls > fewest_blocks * fewest_calls:  # name every way the plan is too large
        problems = []
        if blocks > _blocks_needed(calls):
            problems.append(f"blocks of {_n(calls, 'call')} need fewer than {blocks} (how many "
                            f"blocks of {_n(calls, 'call')} can {g['stretch']} consecutive "
                            "kernels touch?)")
        if _blocks_needed(calls) * calls > fewest_blocks * fewest_calls:
            problems.append(
                f"{calls} is the fewest calls per block, but not the cheapest plan (with one "
                f"call more per block, how many blocks can a stretch of {g['stretch']} kernels "
                "touch?)" if calls == _fewest_calls_per_block() else
                "a plan with fewer calls works (for each number of calls per block from the "
                "fewest up, find the fewest blocks, and compare the totals)")
        raise _Wrong(f"({blocks}, {calls}) works, with {blocks * calls} timed calls, but times "
                     "more than it needs: " + "; and ".join(problems))
    clean, worst, n = summary
    return (f"({blocks}, {calls}): {blocks * calls} timed calls; a clean block reports "
            f"{1e6 * clean:.2f} µs per call ({clean / g['kernel_s'] - 1:.2%} over {us:.0f} µs), "
            f"and over all {n} positions of the stretch the report is at most "
            f"{1e6 * worst:.2f} µs; "
            f"right on {len(_plan_cases()) - 1} hidden GPUs too.")


def _buggy_loop_ms(kernel_s=2e-3, first_s=50e-3, launch_s=5e-6, warmup=3, repeats=10) -> float:
    """What the notebook's ``time_call_buggy`` reports on a simulated GPU, in ms, run here."""
    gpu = SimulatedGPU(kernel_s=kernel_s, first_s=first_s, launch_s=launch_s)
    calls = warmup + repeats
    for i in range(calls):
        if i == warmup:
            start = gpu.clock()
            gpu.synchronize()
        gpu.launch()
    gpu.synchronize()
    return 1e3 * (gpu.clock() - start) / calls


@_checker
def check_buggy_timing_prediction(buggy_prediction_ms):
    """``buggy_prediction_ms``: what ``time_call_buggy`` reports, in ms per call, on section 3's
    simulated GPU (first call 50 ms, then 2 ms per kernel, each launch returns after 5 us). The
    checker runs the loop itself; a prediction within 1 % counts (one kernel more or less is 2.7 %
    off, and has its own hint)."""
    if buggy_prediction_ms is None:
        raise _NotAttempted("write your prediction in buggy_prediction_ms (milliseconds per "
                            "call); the loop's report is shown once it is filled in")
    pred = _number(buggy_prediction_ms, "your prediction in ms")
    got = _buggy_loop_ms()  # (54 + 20) ms of kernels after the first reading, divided by 13

    def near(value, tol=0.01):
        return abs(pred - value) <= tol * value

    if near(got):
        return (f"the loop reports {got:.4f} ms for a 2 ms kernel: its clock starts before the "
                "warm-up kernels (50 + 2 + 2 ms) have run, and it divides by all 13 calls. A "
                "timer must synchronise before its first reading and divide by the calls it "
                "timed; part (b) also makes it robust to a busy neighbour.")
    if near(got * 1e3, 0.02):
        raise _Wrong("you answered in microseconds: write milliseconds per call")
    if near(got * 1e-3, 0.02):
        raise _Wrong("you answered in seconds: write milliseconds per call")
    if near(2.0, 0.02):  # a correct loop's report, and 26 / 13: the slow first call left out
        raise _Wrong("2 ms is what a correct loop would report, and also what this loop gives if "
                     "the slow 50 ms first call is left out (every call 2 ms); but the line "
                     "`start = clock()` comes before `sync()`: the clock starts while the warm-up "
                     "kernels, the slow first one included, are still queued, and that sync() "
                     "waits for their work inside the timed interval. Follow the clock from the "
                     "first reading to the last, and check what the loop divides by")
    if near(20 / 13, 0.02):  # the divisor seen, the first reading not
        raise _Wrong("you counted only the ten timed kernels: at the first clock reading the "
                     "warm-up kernels have not finished yet; where is the clock when they have?")
    if near(72 / 13) or near(76 / 13):  # one 2 ms kernel too few or too many
        raise _Wrong("one 2 ms kernel off: list the kernels that run between the two clock "
                     "readings, the three warm-up kernels (the first takes 50 ms) and the ten "
                     "timed ones, and which of them each reading sees")
    if near(74 / 10, 0.02):  # the first reading seen, the divisor not
        raise _Wrong("the time between the two readings is right; check what the loop divides "
                     "it by")
    if pred < 0.1:
        raise _Wrong("the loop calls sync() before its last reading, so the kernels' time "
                     "does reach the clock, not only the 5-microsecond launches")
    raise _Wrong("follow the simulated clock: where is it at the first reading (the warm-up "
                 "kernels were only queued), where at the last, and what does the loop divide by?")


# --------------------------------------------------------------------------------------------
# 5.2 Merge two partial online-softmax states (keys split in two parts)
# --------------------------------------------------------------------------------------------
def _partial(s: np.ndarray, v: np.ndarray):
    """(m, l, acc) of one part of the keys: running max, sum of exp(s - m), sum of exp(s - m) v.
    A row with no keys (all scores -inf) gives m = -inf, l = 0, acc = 0."""
    m = s.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - safe)
    return m, p.sum(axis=-1, keepdims=True), p @ v


def _merge_ref(m1, l1, acc1, m2, l2, acc2):
    m = np.maximum(m1, m2)
    safe = np.where(np.isfinite(m), m, 0.0)
    a1, a2 = np.exp(m1 - safe), np.exp(m2 - safe)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def _merge_cases():
    """Hidden cases: (state 1, state 2, S, V) with the keys of S split between the two states.
    Case 0: part 2 holds much larger scores (rescaling matters, by different factors per row).
    Case 1: row 1 has no keys in part 1 and row 2 none in part 2 (m = -inf on one side).
    Case 2: row 0 may attend to no key at all (both sides empty: zero output, never nan)."""
    rng = _rng(502)
    cases = []
    for case in range(3):
        n, d_v, b1, b2 = 4, 3, 5, 3 + case
        S = rng.normal(size=(n, b1 + b2)) * 2
        S[:, b1:] += np.array([[4.0], [0.5], [-3.0], [2.0]])  # per-row shifts: different maxima
        V = rng.normal(size=(b1 + b2, d_v))
        if case >= 1:
            S[1, :b1] = -np.inf
            S[2, b1:] = -np.inf
        if case == 2:
            S[0, :] = -np.inf
        cases.append((_partial(S[:, :b1], V[:b1]), _partial(S[:, b1:], V[b1:]), S, V))
    return cases


def _merge_order(got: list, ref: tuple) -> None:
    """A hint when the learner's three results are the right ones in another order than
    (m, l, acc) (all three, or m and l swapped in front)."""
    names = ("m", "l", "acc")

    def same(g, r):
        return g.size == r.size and _close(g.reshape(r.shape), r)

    orders = [p for p in itertools.permutations(range(3))
              if all(same(g, ref[j]) for g, j in zip(got, p, strict=True))]
    if not orders and same(got[0], ref[1]) and same(got[1], ref[0]):
        orders = [(1, 0, 2)]
    if orders and orders[0] != (0, 1, 2):
        returned = ", ".join(names[j] for j in orders[0])
        raise _Wrong(f"the order of the state is (m, l, acc), the order it arrives in; you "
                     f"returned ({returned})")


@_checker
def check_merge_partials(merge_partials):
    """``merge_partials(m1, l1, acc1, m2, l2, acc2)`` -> ``(m, l, acc)``: the online-softmax state
    of all the keys, from the states of two disjoint parts of them. ``m``, ``l`` ``(n, 1)``,
    ``acc`` ``(n, d_v)``; ``acc / l`` (where ``l > 0``) is then ``softmax(S) @ V`` over every key.
    A row with no keys in a part has ``m = -inf``, ``l = 0``, ``acc = 0`` there; a row with no
    keys in either part leaves as it arrived, ``m = -inf``, ``l = 0``, ``acc = 0`` (no nan, and
    no finite m: merged again, it would stand in for a later part's real maximum). The state is
    returned in the order ``(m, l, acc)``, with exactly these shapes. Torch float64 tensors; the
    inputs must be left unchanged."""
    names = ("m", "l", "acc")
    for i, (st1, st2, S, V) in enumerate(_merge_cases()):
        n, d_v = S.shape[0], V.shape[1]
        args = [_t(x.copy()) for x in (*st1, *st2)]
        before = [a.clone() for a in args]
        out = _call(merge_partials, *args, name="merge_partials", copy=False,
                    on_error=f"called with m1, l1, m2, l2 of shape {(n, 1)} and acc1, acc2 of "
                             f"shape {(n, d_v)}, float64")
        for nm, a, b in zip(("m1", "l1", "acc1", "m2", "l2", "acc2"), args, before, strict=True):
            if not torch.equal(a, b):  # -inf equals -inf; the inputs hold no nan
                raise _Wrong(f"merge_partials changed its input {nm} in place (e.g. with mul_ or "
                             "*=): build new tensors (alpha * acc1 + ...) and leave the inputs "
                             "as they were, the caller may still need them")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise _Wrong("return the merged state as a tuple (m, l, acc)")
        got = [_arr(x, nm) for x, nm in zip(out, names, strict=True)]
        ref = _merge_ref(*st1, *st2)
        _merge_order(got, ref)
        for x, nm in zip(got[:2], names[:2], strict=True):
            if x.shape != (n, 1):
                raise _Wrong(f"{nm} has shape {x.shape}; expected (n, 1) = {(n, 1)}: keep the "
                             "state's shapes, so that the result can be merged again and acc / l "
                             "divides each row by its own l (an l of shape (n,) lines up with "
                             "acc's columns, not its rows)")
        _shape(got[2], (n, d_v), "acc", "(n, d_v)")
        m, l, acc = got
        if all(_close(g, r) for g, r in zip((m, l, acc), ref, strict=True)):
            continue
        if np.isnan(np.concatenate([m.ravel(), l.ravel(), acc.ravel()])).any():
            where = "row 0, which has no keys in either part" if i == 2 else "a row"
            raise _Wrong(f"nan in {where}: there m1 = m2 = m = -inf and exp(m1 - m) = "
                         "exp(-inf + inf) = nan. Pick a finite reference for rows whose merged "
                         "maximum is -inf, so that their l and acc stay 0")
        m1, l1, acc1 = st1
        m2, l2, acc2 = st2
        if not _close(m, ref[0]):
            empty = ~np.isfinite(ref[0])  # rows with no keys in either part
            if empty.any() and np.isfinite(m[empty]).all() and _close(m[~empty], ref[0][~empty]):
                raise _Wrong(f"a row with no keys in either part leaves as it arrived: m = -inf, "
                             f"l = 0, acc = 0; your m there is {m[empty][0]:g}. Merged again, a "
                             "finite m would stand in for a later part's real maximum: the "
                             "merged m is then wrong, and a part whose maximum lies far below "
                             "it gets exp(m2 - m) = 0 and loses all its keys. Return m = -inf "
                             "there; a finite number belongs only inside the exponents")
            if _close(m, np.full_like(m, np.max(ref[0]))):
                raise _Wrong("m is per query row: torch.maximum(m1, m2), not one maximum for the "
                             "whole block")
            raise _Wrong("the merged maximum is the larger of the two, row by row: "
                         "torch.maximum(m1, m2)")
        mm = ref[0]
        safe = np.where(np.isfinite(mm), mm, 0.0)
        a1, a2 = np.exp(m1 - safe), np.exp(m2 - safe)
        with np.errstate(all="ignore"):
            out1 = np.divide(acc1, l1, out=np.zeros_like(acc1), where=l1 > 0)
            out2 = np.divide(acc2, l2, out=np.zeros_like(acc2), where=l2 > 0)
            cands = [
                ("forgot to rescale: each part summed exp(s - m1) or exp(s - m2); bring both to "
                 "the common maximum m by multiplying part i's l and acc by exp(m_i - m)",
                 (l1 + l2, acc1 + acc2)),
                ("rescale BOTH parts to the common maximum: part 1 by exp(m1 - m) and part 2 by "
                 "exp(m2 - m) (one of them is 1 in each row, but not the same one in every row)",
                 (l1 + a2 * l2, acc1 + a2 * acc2)),
                ("rescale BOTH parts to the common maximum: part 1 by exp(m1 - m) and part 2 by "
                 "exp(m2 - m) (one of them is 1 in each row, but not the same one in every row)",
                 (a1 * l1 + l2, a1 * acc1 + acc2)),
                ("the rescale factor is exp(m_i - m) (at most 1), not exp(m - m_i)",
                 (l1 / a1 + l2 / a2, acc1 / a1 + acc2 / a2)),
                ("keep acc unnormalised (the weighted sum of values): the division by l happens "
                 "once, by the caller, after the last merge",
                 (ref[1], np.divide(ref[2], ref[1], out=np.zeros_like(ref[2]),
                                    where=ref[1] > 0))),
                ("you averaged the two parts' outputs: a part's output counts in proportion to "
                 "its share of the softmax mass, exp(m_i - m) * l_i; merge l and acc, not the "
                 "normalised outputs", (ref[1], (out1 + out2) / 2)),
            ]
        for hint, (l_c, acc_c) in cands:
            if _close(l, l_c) and _close(acc, acc_c):
                raise _Wrong(hint)
        if not _close(l, ref[1]):
            raise _Wrong("l should be exp(m1 - m) * l1 + exp(m2 - m) * l2")
        raise _Wrong("acc should be exp(m1 - m) * acc1 + exp(m2 - m) * acc2")
    return ("two halves of the keys, one exact result: this is how split-K kernels "
            "(Flash-Decoding) combine the work of several thread blocks.")


# --------------------------------------------------------------------------------------------
# 5.3 The graph's bound on the textbook chain's forward + backward peak (score matrices)
# --------------------------------------------------------------------------------------------
def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _training_peak_ratio(T: int, B: int = 1, H: int = 2, d: int = 8, dtype=torch.float32) -> float:
    """Peak CPU bytes of one forward + backward call of ``naive_attention`` in ``dtype``, divided
    by one ``(B, H, T, T)`` score matrix of that dtype, measured with the profiler as the notebook
    does."""
    from shared.benchmark import peak_memory
    from shared.modules import naive_attention

    gen = torch.Generator().manual_seed(503 + T)
    Q, K, V = (torch.randn(B, H, T, d, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    peak = peak_memory(lambda: naive_attention(Q, K, V)[0].sum().backward(), "cpu")
    return peak / (B * H * T * T * _dtype_bytes(dtype))


def _training_peak_limit(dtype=torch.float32) -> float:
    """The limit of the peak, in score matrices of ``dtype``, as T grows: measured at two lengths,
    the part that falls like 1/T (the (B, H, T, d) gradients) extrapolated away."""
    T1, T2 = 128, 256
    r1, r2 = (_training_peak_ratio(T, dtype=dtype) for T in (T1, T2))
    return (T2 * r2 - T1 * r1) / (T2 - T1)


@_checker
def check_training_peak(training_peak_prediction):
    """``training_peak_prediction``: the graph's bound on the peak of one forward + backward call
    of the textbook chain ``softmax(Q K^T / sqrt(d)) @ V`` (no ``nan_to_num`` guard), in
    ``(B, H, T, T)`` score matrices as ``T`` grows: 3, at the softmax's backward step (the
    gradient arriving, the saved P, the gradient made). tests/test_exercises_05.py measures 3 with
    the profiler, independently of this checker. The notebook then measures the guarded chain too:
    platform-dependent, 4.25 on a CPU in float32, 4.5 in the H200 record in float16 (the solutions
    show both). Every non-whole answer (those two included) gets one hint: count whole score
    matrices; every whole answer from 0 to 5 one hint that names the rules, not the direction;
    6 (every T x T tensor made), up to 63, and 64 or more (an answer that grows with T) their
    own."""
    if training_peak_prediction is None:
        raise _NotAttempted("write your prediction in training_peak_prediction (a number of score "
                            "matrices); the measurement is shown once it is filled in")
    pred = _number(training_peak_prediction, "the number of score matrices")
    if pred < 0:
        raise _Wrong("memory is not negative: count the T x T tensors alive together")
    if abs(pred - round(pred)) > 1e-6:  # every non-whole answer gets this one message
        raise _Wrong("count whole score matrices: every large tensor of the textbook chain is a "
                     "float T x T tensor, one score matrix each, and the (B, H, T, d) tensors "
                     "(Q, K, V, the output and their gradients) are d / T of a score matrix and "
                     "vanish as T grows")
    n = round(pred)
    if n == 3:
        return ("at the softmax's backward step the gradient arriving (dP), the P saved for that "
                "step and the gradient it makes (dS) are alive together; the forward never holds "
                "more than two. Now measure, with the guard and without it.")
    if n < 6:  # one hint below and above the bound: it names the rules, not the direction
        raise _Wrong("not the peak. Walk the backward steps one at a time and, at each, list the "
                     "T x T tensors alive: a gradient lives until the step that received it has "
                     "made the next, a saved tensor until the step that needs it has run, and one "
                     "storage saved twice counts once. The peak is the longest list")
    if n == 6:
        raise _Wrong("you added up every T x T tensor the call makes, forward and backward; the "
                     "peak counts only those alive at the same moment")
    if n < 64:
        raise _Wrong("more score matrices than are ever alive at one moment: the peak counts the "
                     "T x T tensors alive together, not all the call makes. Walk the backward "
                     "steps one by one and list which T x T tensors are alive at each")
    raise _Wrong("every large tensor is T x T, so the count in score matrices does not grow "
                 "with T: at one moment only a few are alive together (count score matrices, "
                 "not elements or bytes)")


# --------------------------------------------------------------------------------------------
# 5.4 Find the bug in a tile loop: a key-block loop that never rescales its accumulator
# --------------------------------------------------------------------------------------------
def _buggy_key_blocks(S: torch.Tensor, V: torch.Tensor, block_size: int) -> torch.Tensor:
    """The colleague's loop on given scores S (..., T_q, T_k) and values V (..., T_k, d_v): l is
    rescaled when the running max grows, acc is not."""
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], block_size):
        s = S[..., k0:k0 + block_size]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)
        l = l * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True)
        acc = acc + p @ V[..., k0:k0 + block_size, :]
        m = m_new
    return acc / l


def _rows_cases():
    """Hidden cases (S, V, block_size), float64. Each row's maximum is placed on purpose: in the
    first block (in some rows with every later score below every first-block score), in a later
    block (above the first block's max by 0.5 to 1.5, so the loop's row is off by far more than
    1e-3, or by a hair, 1e-6, which a rule with a tolerance misses), or tied exactly between the
    first block and a later one.
    Leading dims (2, 3) with T_k = 19 not a multiple of 5; a square case (the query axis and the
    key axis have the same length); block_size >= T_k; T_k = 12 in blocks of 4."""
    rng = _rng(505)
    cases = []
    shapes = (((2, 3), 7, 19, 5), ((), 6, 6, 2), ((4,), 5, 9, 16), ((3,), 10, 12, 4))
    for lead, T_q, T_k, b in shapes:
        S = rng.normal(size=(*lead, T_q, T_k))
        V = rng.normal(size=(*lead, T_k, 4))
        flat = S.reshape(-1, T_k)
        for r, row in enumerate(flat):
            top = row.max() + rng.uniform(0.5, 1.5)
            kind = r % 5 if b < T_k else 0  # one block: every maximum is in it
            first = int(rng.integers(0, min(b, T_k)))
            later = int(rng.integers(b, T_k)) if b < T_k else None
            if kind in (0, 3):  # the maximum in the first block
                row[first] = top
                if kind == 3:  # and every later score below every first-block score
                    row[b:] -= row[b:].max() - row[:b].min() + 0.5
            elif kind == 1:  # in a later block
                row[later] = top
            elif kind == 2:  # an exact tie between the first block and a later one
                row[first] = row[later] = top
            else:  # a later maximum a hair above the first block's
                row[first], row[later] = top, top + 1e-6
        cases.append((_t(flat.reshape(S.shape)), _t(V), b))
    return cases


def _rows_truth(S: torch.Tensor, V: torch.Tensor, b: int) -> np.ndarray:
    """Which rows the colleague's loop gets right, found by running it: right means within 1e-12
    of softmax(S) @ V. Self-checked: every other row is off by more than 1e-10 (float64 rounding
    is below 1e-14), and the rows that are right are exactly those whose maximum over all keys is
    attained in the first block."""
    err = (_buggy_key_blocks(S, V, b) - torch.softmax(S, dim=-1) @ V).abs().amax(dim=-1)
    right = err < 1e-12
    if not bool((right | (err > 1e-10)).all()):
        raise RuntimeError("self-check: a hidden case has a row off by between 1e-12 and 1e-10")
    if not torch.equal(right, S[..., :b].amax(-1) >= S.amax(-1)):
        raise RuntimeError("self-check: the loop's right rows differ from the first-block rule")
    return right.numpy()


def _rows_candidates(S: torch.Tensor, b: int) -> dict:
    """Typical wrong rules, on one case (each as a bool array of shape S.shape[:-1])."""
    T_q, T_k = S.shape[-2:]
    first, top = S[..., :b].amax(-1), S.amax(-1)
    later = S[..., b:].amax(-1) if b < T_k else torch.full_like(top, -math.inf)
    last0 = (T_k - 1) // b * b
    ones = torch.ones(S.shape[:-1], dtype=torch.bool)
    by_queries = S[..., :b, :].amax(-2) >= S.amax(-2)  # one per key: the blocks cut the queries
    return {
        "last": (S[..., last0:].amax(-1) >= top).numpy(),
        "inverted": (first < top).numpy(),
        "true": ones.numpy(),
        "false": (~ones).numpy(),
        "one_block": (ones if T_k <= b else ~ones).numpy(),  # right only when one block holds all
        "strict": (first > later).numpy(),
        "tolerance": (first >= top - 1e-3).numpy(),  # a later maximum only 1e-6 higher marked right
        "all_first": (S[..., :b].amin(-1) >= later).numpy(),
        "queries": by_queries.numpy() if T_q == T_k else None,
    }


_ROWS_HINTS = {
    "last": "you marked the rows whose maximum lies in the LAST block; m stops changing once it "
            "has met the row's maximum, and what the missing rescale spoils is everything summed "
            "before that: which block must hold the maximum so that nothing summed is ever stale?",
    "inverted": "inverted: the rows you marked True are the ones the loop gets wrong; a row is "
                "right when m never grows after the first block, so the missing factor "
                "exp(m - m_new) is always 1",
    "true": "always True is your colleague's test: with T = 50 and block_size = 64 there is one "
            "block, so m never grows after it. With several blocks, what happens to a row whose "
            "maximum arrives in a later block?",
    "false": "some rows are right: where the row's maximum is in the first block, m never grows "
             "after it, the missing factor exp(m - m_new) is 1, and skipping it costs nothing",
    "one_block": "with several blocks your rule marks every row wrong, but many rows are still "
                 "right: the factor the loop skips, exp(m - m_new), is 1 unless m grows. Which "
                 "rows does the bug actually spoil: in which of them does a later block change "
                 "m?",
    "strict": "ties count as right: when a later block's maximum only equals m, torch.maximum "
              "leaves m unchanged, the factor is exp(0) = 1, and nothing needed rescaling",
    "tolerance": "a later maximum only a hair above the first block's (1e-6 here) still raises m, "
                 "and the loop then skips a factor exp(m - m_new) below 1: compare exactly, with "
                 "no tolerance (isclose or a margin marks such rows right)",
    "all_first": "too strict: only the maximum matters. Later scores below the first block's "
                 "maximum leave m unchanged whatever the first block's other scores are",
    "queries": "wrong axis: the blocks cut the keys (the last axis of S), so the rule reduces over "
               "keys and gives one entry per query row",
}


def _call_catching(fn, *args, name: str):
    """``_call(fn, *args)`` -> ``(result, None)``, or ``(None, the exception)`` when learner code
    raised one (other than NotImplementedError, which still means "not attempted"), so that the
    checker can explain it for the case that caused it."""
    caught = []

    @functools.wraps(fn)
    def guarded(*a, **k):
        try:
            return fn(*a, **k)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - learner code may raise anything
            caught.append(e)
            return _RAISED

    out = _call(guarded, *args, name=name)
    return (None, caught[0]) if out is _RAISED and caught else (out, None)


_RAISED = object()  # what ``_call_catching``'s wrapper returns when learner code raised


def _bool_rows(ans, expected: tuple, n_keys: int) -> np.ndarray:
    """The learner's rule as a NumPy bool array of the expected shape, or a hint."""
    if isinstance(ans, torch.Tensor):
        ans = ans.detach().cpu()
        dtype, got = ans.dtype, ans.numpy() if ans.dtype == torch.bool else None
    elif isinstance(ans, np.ndarray):
        dtype, got = ans.dtype, ans if ans.dtype == np.bool_ else None
    else:
        raise _Wrong(f"return a bool tensor of shape S.shape[:-1] = {expected}, one True/False "
                     f"per query row; got {type(ans).__name__}")
    shape = tuple(ans.shape)
    if shape != expected:
        if shape == expected[:-1] + (n_keys,) and n_keys != expected[-1]:
            raise _Wrong(f"{_ROWS_HINTS['queries']}: expected shape {expected}, got {shape}")
        raise _Wrong(f"expected a bool tensor of shape S.shape[:-1] = {expected} (one entry per "
                     f"query row); got shape {shape}")
    if got is None:
        raise _Wrong(f"return booleans (True where the row is right), not {dtype}: a comparison "
                     "such as a >= b gives them")
    return got


@_checker
def check_rows_right(rows_right):
    """``rows_right(S, block_size)`` -> bool tensor of shape ``S.shape[:-1]``: True where the
    colleague's ``attention_by_key_blocks`` (which rescales l but not acc) returns the row of
    ``softmax(S) @ V``. The checker runs its own copy of the loop on hidden score matrices (float64)
    to find those rows: exactly the rows whose maximum over all keys is attained in the first key
    block (``S[..., :b].amax(-1) >= S.amax(-1)``; ties with a later block count as right). A rule
    that raises on the case with block_size >= T_k (a maximum of the empty later keys) is told
    what that case is, not only the exception."""
    got, truths, cands = [], [], []
    for S, V, b in _rows_cases():
        truth = _rows_truth(S, V, b)
        T_k = S.shape[-1]
        if b >= T_k and callable(rows_right):  # one block: a rule built on later keys may raise
            ans, error = _call_catching(rows_right, S, b, name="rows_right")
            if error is not None:
                said = str(error).strip().splitlines()[0][:70] if str(error).strip() else ""
                said = f" ({said})" if said else ""
                raise _Wrong(f"your rule raised {type(error).__name__}{said} when block_size >= "
                             f"T_k (S of shape {tuple(S.shape)}, block_size = {b}, T_k = {T_k}): "
                             "then one block holds every key and there are no later keys "
                             f"(S[..., {b}:] is empty, and an empty slice has no maximum). "
                             "Which rows are right then? Make your rule give them")
        else:
            ans = _call(rows_right, S, b, name="rows_right",
                        on_error=f"called with S of shape {tuple(S.shape)} (float64), "
                                 f"block_size={b}")
        got.append(_bool_rows(ans, tuple(S.shape[:-1]), S.shape[-1]))
        truths.append(truth)
        cands.append(_rows_candidates(S, b))
    if all(np.array_equal(g, t) for g, t in zip(got, truths, strict=True)):
        return ("a row is right exactly when its maximum is in the first block: then m never "
                "grows, the factor the loop skips is exp(0) = 1. One block (T = 50, block_size = "
                "64) holds every maximum, so the colleague's test could not see the bug. Now "
                "design a test that does.")
    for key, hint in _ROWS_HINTS.items():
        expected = [c[key] for c in cands]
        if any(e is None for e in expected):
            continue
        differs = any(not np.array_equal(e, t) for e, t in zip(expected, truths, strict=True))
        if differs and all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True)):
            raise _Wrong(hint)
    i = next(i for i, (g, t) in enumerate(zip(got, truths, strict=True))
             if not np.array_equal(g, t))
    S, _, b = _rows_cases()[i]
    wrong = int((got[i] != truths[i]).sum())
    raise _Wrong(f"for S of shape {tuple(S.shape)} with block_size = {b}, {wrong} of "
                 f"{truths[i].size} rows {'is' if wrong == 1 else 'are'} marked wrongly. When "
                 "does m grow after the first block, and what does the loop then fail to "
                 "rescale?")


# (b) the smallest test that catches the bug ------------------------------------------------------
CATCH_TOL = 1e-3  # "catches": the loop differs from softmax(S) V by more than this somewhere


def _as_real(x, name: str, shape: str) -> torch.Tensor:
    """One of the learner's Q, K, V as a float64 CPU tensor (lists and NumPy arrays are fine)."""
    if isinstance(x, str):
        raise _Wrong(f"{name} should be a tensor of shape {shape}; got the text {x!r:.30}")
    try:
        t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    except Exception:  # noqa: BLE001 - anything torch.as_tensor refuses
        raise _Wrong(f"{name} should be a tensor of shape {shape} (a nested list or a NumPy "
                     f"array is fine too); got {type(x).__name__}") from None
    if t.dtype == torch.bool or t.is_complex():
        raise _Wrong(f"{name} should hold real numbers; got dtype {t.dtype}")
    if t.dim() < 2:
        raise _Wrong(f"{name} should have shape {shape} (two dims, batch dims in front allowed); "
                     f"got shape {tuple(t.shape)}")
    if 0 in t.shape:
        raise _Wrong(f"{name} has shape {tuple(t.shape)}, with no entries along one dim: every "
                     "dim needs at least 1")
    if not torch.isfinite(t).all():
        raise _Wrong(f"{name} has entries that are not finite (inf or nan): use finite numbers")
    return t.double()


def _catch_inputs(test):
    """The learner's (Q, K, V, block_size) checked for shapes: float64 tensors and an int, or a
    hint naming what was expected and what came."""
    if isinstance(test, str) or not isinstance(test, (tuple, list)) or len(test) != 4:
        what = f"{len(test)} items" if isinstance(test, (tuple, list)) else f"{test!r:.40}"
        raise _Wrong(f"write four things, catching_test = (Q, K, V, block_size); got {what}")
    Q = _as_real(test[0], "Q", "(T_q, d_k)")
    K = _as_real(test[1], "K", "(T_k, d_k)")
    V = _as_real(test[2], "V", "(T_k, d_v)")
    b = test[3]
    if isinstance(b, bool) or not isinstance(b, (numbers.Integral, np.integer)):
        raise _Wrong(f"block_size should be a positive int (a count of keys); got "
                     f"{type(b).__name__} {b!r:.20}")
    if b < 1:
        raise _Wrong(f"block_size should be a positive int (a count of keys); got {b}")
    shapes = f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}"
    if not Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]:
        raise _Wrong(f"Q, K and V should have the same batch dims in front (or none); got {shapes}")
    if Q.shape[-1] != K.shape[-1]:
        raise _Wrong(f"Q and K should have the same last dim d_k (a score is a dot product of a "
                     f"query and a key); got {shapes}")
    if K.shape[-2] != V.shape[-2]:
        raise _Wrong(f"K and V should have one row per key, the same T_k; got {shapes}")
    return Q, K, V, int(b)


def _stale_keys(S: torch.Tensor, b: int) -> torch.Tensor:
    """Bool (..., T_q, T_k): True where key j was summed into acc against a running max below the
    row's final one, so that the colleague's loop leaves its term exp(s_j - m) v_j too large."""
    running = torch.cummax(torch.stack([s.amax(-1) for s in S.split(b, dim=-1)], dim=-1),
                           dim=-1).values
    per_key = running.repeat_interleave(b, dim=-1)[..., :S.shape[-1]]
    return per_key < S.amax(-1, keepdim=True)


@_checker
def check_catching_test(catching_test):
    """``catching_test = (Q, K, V, block_size)``: inputs on which the colleague's
    ``attention_by_key_blocks`` differs from softmax(Q K^T / sqrt(d_k)) V by more than 1e-3
    somewhere, with the fewest tokens: one query, two keys. The checker runs its own copy of the
    loop in float64. The loop's error in a row is sum_j (exp(s_j - m_j) - exp(s_j - M)) v_j / l
    (m_j the running max when key j was summed, M the row's max): it needs a key summed before the
    max grew (several blocks, a later maximum) whose value row is not zero. Equal value rows do
    not hide it: the loop's weights then sum to more than 1."""
    if catching_test is None:
        raise _NotAttempted("write (Q, K, V, block_size) in catching_test")
    Q, K, V, b = _catch_inputs(catching_test)
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    if not torch.isfinite(S).all():
        raise _Wrong("the scores Q K^T / sqrt(d_k) overflow float64: use smaller numbers")
    ref = torch.softmax(S, dim=-1) @ V
    got = _buggy_key_blocks(S, V, b)
    if not (torch.isfinite(ref).all() and torch.isfinite(got).all()):
        raise _Wrong("the outputs overflow float64: use smaller numbers")
    err = float((got - ref).abs().max())
    T_q, T_k = Q.shape[-2], K.shape[-2]
    if err <= CATCH_TOL:
        stale = _stale_keys(S, b)
        if b >= T_k:
            yours = ("your one key is one block whatever block_size is" if T_k == 1 else
                     f"block_size = {b} makes your T_k = {T_k} keys one block too")
            raise _Wrong(f"one block: every maximum is in it, as in your colleague's test (T = 50 "
                         f"keys, block_size = 64), so m never grows after the first block; "
                         f"{yours}: the keys must span several blocks")
        if not stale.any():
            raise _Wrong("m never grows after the first block, so the missing rescale multiplies "
                         "by 1: put a row's largest score in a later block")
        zero_v = (V == 0).all(dim=-1).unsqueeze(-2)  # (..., 1, T_k): key j's value row is zero
        if (~stale | zero_v).all():
            raise _Wrong("every key summed before the maximum grew has a value row of zero, so "
                         "its stale term exp(s - m) v is zero whatever the factor: the missing "
                         "rescale cannot show. Give those keys nonzero values")
        raise _Wrong(f"the error is only {err:.1e}: make the later maximum stand further above "
                     "the earlier scores, or the earlier keys' values larger")
    too_big = [f"how many keys must there be for a maximum to arrive after the first block "
               f"(you have {T_k})"] if T_k > 2 else []
    too_big += [f"how many queries do you need (you have {T_q})"] if T_q > 1 else []
    if too_big:
        raise _Wrong(f"it catches the bug (off by {err:.3g}); now make it the smallest: "
                     f"{', and '.join(too_big)}?")
    if Q.dim() > 2 and math.prod(Q.shape[:-2]) > 1:
        raise _Wrong(f"it catches the bug (off by {err:.3g}); now make it the smallest: your batch "
                     f"dims {tuple(Q.shape[:-2])} repeat the test {math.prod(Q.shape[:-2])} "
                     "times, and once is enough")
    return (f"the loop is off by {err:.3g}: two keys in blocks of one, the second raising the "
            "max, the first with a nonzero value (its term stays too large by exp(m_new - m)). "
            "A test with one block, with every maximum in the first block, or with zero values "
            "before the maximum passes the buggy loop: test tile loops with several blocks and "
            "late maxima.")


# (c) the fix -------------------------------------------------------------------------------------
_FORBIDDEN = {"scaled_dot_product_attention": "F.scaled_dot_product_attention",
              "softmax": "a softmax", "log_softmax": "a log-softmax", "_softmax": "a softmax",
              "multi_head_attention_forward": "nn.MultiheadAttention"}


# Ops that take a maximum over a dimension, or sort along it (its last entry is the maximum), or
# logsumexp (a maximum and a sum in one):
# name -> (position of the dim argument after the tensor, its default; None = every dim)
_MAX_OPS = {"amax": (1, None), "max": (1, None), "argmax": (1, None), "sort": (1, -1),
            "argsort": (1, -1), "msort": (None, 0), "topk": (2, -1), "kthvalue": (2, -1),
            "cummax": (1, None), "logsumexp": (1, None)}
# Ways out of PyTorch (the checker cannot follow what is computed after them)
_ESCAPES = {"numpy": "Tensor.numpy()", "__array__": "np.asarray / np.array",
            "tolist": "Tensor.tolist()"}


class _Recorder(torch.overrides.TorchFunctionMode):
    """Records which of the _FORBIDDEN functions learner code calls, which ways out of PyTorch it
    takes (_ESCAPES), the widths that exp and maxima over the keys were taken over, and which
    blocks' maxima were taken before the first exp; every call goes through.

    A maximum over the keys is any _MAX_OPS op over the last dimension (amax, max, argmax, sort,
    argsort, topk, kthvalue, cummax; with no dim, every dimension), or msort, which sorts along
    dimension 0 (a transposed block's keys)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.escapes: list[str] = []  # the _ESCAPES taken, in order
        self.exp_widths: set[int] = set()  # last-dimension sizes exp was taken over
        self.max_widths: set[int] = set()  # sizes of the key dimension a maximum was taken over
        self.exp_seen = False  # whether any exp has run yet
        self.maxed_before_exp: set[tuple] = set()  # the blocks maximised before it (fingerprints)

    def _keys_dim(self, name, t, args, kwargs):
        """The size of the dimension ``name`` takes a maximum over when it is the keys'
        (the last one, or dim 0 for msort), else None."""
        at, default = _MAX_OPS[name]
        if at is None:
            return t.shape[0]
        kwargs = kwargs or {}
        dim = kwargs.get("dim", args[at] if len(args) > at else default)
        if isinstance(dim, torch.Tensor) or "other" in kwargs:
            return None  # torch.max(a, b): an element-wise maximum
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        if any(k is None or (isinstance(k, int) and k % t.dim() == t.dim() - 1) for k in dims):
            return t.shape[-1]
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _FORBIDDEN and _FORBIDDEN[name] not in self.seen:
            self.seen.append(_FORBIDDEN[name])
        if name in _ESCAPES and _ESCAPES[name] not in self.escapes:
            self.escapes.append(_ESCAPES[name])
        if name in ("exp", "exp_"):
            self.exp_seen = True
            if args and isinstance(args[0], torch.Tensor) and args[0].dim():
                self.exp_widths.add(args[0].shape[-1])
        if name in _MAX_OPS and args and isinstance(args[0], torch.Tensor) and args[0].dim():
            t = args[0]
            width = self._keys_dim(name, t, args, kwargs)
            if width is not None:  # over the keys
                self.max_widths.add(width)
                if not self.exp_seen:  # the mode is off in here: these calls are not recorded
                    x = torch.nan_to_num(t.detach().double(), posinf=0.0, neginf=0.0)
                    self.maxed_before_exp.add((tuple(sorted(t.shape)), x.sum().item(),
                                               x.square().sum().item()))
        return func(*args, **(kwargs or {}))


def _fix_cases():
    """Hidden cases (Q, K, V, block_size, what): leading dims (2, 3) and none; T_q != T_k;
    d_v != d_k; T_k not a multiple of block_size; block_size >= T_k; block_size 1; float32 with
    scores of a few hundred (exp without the max overflows); one case where every row's maximum
    is in the first block (the colleague's loop is right there) beside cases where it is not."""
    gen = torch.Generator().manual_seed(555)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    cases = [
        (rand(2, 3, 7, 8), rand(2, 3, 19, 8), rand(2, 3, 19, 5), 5, "float64"),
        (rand(6, 4), rand(10, 4), rand(10, 3), 16, "float64"),
        (rand(5, 4), rand(6, 4), rand(6, 2), 1, "float64"),
    ]
    Q, K = rand(2, 9, 6), rand(2, 14, 6)  # every row's maximum in the first block of 4 keys
    Q[..., -1], K[..., :4, -1], K[..., 4:, -1] = 1.0, 20.0, 0.0
    cases.append((Q, K, rand(2, 14, 3), 4, "float64"))
    Q, K = 8 * rand(2, 6, 4), 8 * rand(2, 11, 4)  # scores of a few hundred
    cases.append((Q.float(), K.float(), rand(2, 11, 5).float(), 3, "float32, scores up to "
                  f"{(Q @ K.mT / 2).abs().max().item():.0f}"))
    return cases


def _attention_ref(Q, K, V) -> np.ndarray:
    Q, K, V = (x.double() for x in (Q, K, V))
    return (torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V).numpy()


def _wrong_key_blocks(Q, K, V, b, how: str) -> np.ndarray:
    """The colleague's loop and typical wrong fixes, in the inputs' dtype."""
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    if how == "bug":
        return _buggy_key_blocks(S, V, b).double().numpy()
    m = torch.full((*S.shape[:-1], 1), -math.inf, dtype=S.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*S.shape[:-1], V.shape[-1], dtype=S.dtype)
    for k0 in range(0, S.shape[-1], b):
        s, v = S[..., k0:k0 + b], V[..., k0:k0 + b, :]
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        if how == "block_max":  # each block's own maximum as the reference, no running maximum
            m_new = s.amax(dim=-1, keepdim=True)
        alpha = torch.exp(m - m_new)
        p = torch.exp(s if how == "no_max" else s - m_new)
        if how == "l_not_rescaled":
            l, acc = l + p.sum(-1, keepdim=True), alpha * acc + p @ v
        elif how in ("inverted", "inverted_guarded"):  # guarded: 0 on the first block, no nan
            alpha = torch.exp(m_new - m)
            if how == "inverted_guarded":
                alpha = torch.where(torch.isfinite(m), alpha, torch.zeros_like(alpha))
            l, acc = alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v
        elif how == "normalised":
            l = alpha * l + p.sum(-1, keepdim=True)
            acc = (alpha * acc + p @ v) / l
        elif how == "no_max":
            l, acc = l + p.sum(-1, keepdim=True), acc + p @ v
        elif how == "block_max":
            l, acc = alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v
        elif how == "after":
            l, acc = alpha * l + p.sum(-1, keepdim=True), (acc + p @ v) * alpha
        m = m_new
    return (acc if how == "normalised" else acc / l).double().numpy()


_FIX_HINTS = {
    "bug": "this is the colleague's loop: rows whose maximum arrives after the first block are "
           "wrong, because acc still holds terms exp(s - m) v scaled by an old maximum. When m "
           "grows, rescale acc by exp(m - m_new), as l is",
    "l_not_rescaled": "acc is rescaled now, but l no longer is: both sums are taken against the "
                      "running maximum, so both need the factor exp(m - m_new) when it grows",
    "inverted": "the factor is exp(m - m_new) (old minus new, at most 1): exp(m_new - m) is at "
                "least 1, infinite on the first block where m = -inf (inf * 0 = nan), and too "
                "large wherever m grows",
    "inverted_guarded": None,  # the same hint as "inverted"
    "normalised": "normalise once, after the last block: acc and l are running sums, and dividing "
                  "acc by l inside the loop mixes normalised and unnormalised terms",
    "block_max": "inf or nan in float32: your reference is each block's own maximum, not the "
                 "running one. exp(s - m_block) is fine, but when a block's maximum lies below "
                 "an earlier one the factor exp(m - m_block) exceeds 1 and re-expresses the old "
                 "sums against the lower reference: they grow by the gap, and once the largest "
                 "score so far stands more than 88 above the current block's maximum, l and acc "
                 "overflow float32 (inf / inf = nan). Keep the running maximum, the larger of m "
                 "and the block's: then the factor is at most 1",
    "no_max": "exp overflowed: in float32 exp(s) is inf once s > 88, and these scores reach a "
              "few hundred (inf / inf = nan). Subtract the running maximum before exp, as the "
              "colleague's loop did",
    "after": "the factor rescales only what was summed before this block: alpha * acc + p @ V; "
             "you multiplied the new block's p @ V by it too (and on the first block, where "
             "alpha = 0, erased it)",
}


@_checker
def check_key_block_fix(fn):
    """``attention_by_key_blocks_fixed(Q, K, V, block_size)`` -> softmax(Q K^T / sqrt(d_k)) V
    (..., T_q, d_v) in the inputs' dtype, keys visited block_size at a time with the accumulator
    rescaled by exp(m - m_new), like l. Hidden cases against a float64 reference; inputs must be
    left unchanged; SDPA, softmax and nn.MultiheadAttention are refused (fix the loop, do not
    replace it), and so are two sweeps over the keys: a maximum over all keys at once, an exp over
    all keys at once, or (with T_k > 2 block_size) the maxima of two or more different key blocks
    taken before the first exp (every block's maximum first, then the sums; a maximum by amax,
    max, argmax, sort, argsort, msort, topk, kthvalue or cummax). Tensor.numpy, np.asarray and
    Tensor.tolist inside the fix are refused too: the checker cannot follow what is computed
    outside PyTorch. Each block's own
    maximum as the reference (no running maximum) is right in float64 and overflows in the float32
    case; its hint names the growing rescale factor, not exp(s)."""
    got, refs, cases = [], [], _fix_cases()
    for Q, K, V, b, what in cases:
        ref = _attention_ref(Q, K, V)
        args = [Q.clone(), K.clone(), V.clone()]
        with _Recorder() as rec:
            out = _call(fn, *args, b, name="attention_by_key_blocks_fixed", copy=False,
                        on_error=f"called with Q {tuple(Q.shape)}, K {tuple(K.shape)}, V "
                                 f"{tuple(V.shape)}, block_size={b}, {what}")
        if rec.seen:
            raise _Wrong(f"fix the loop, do not replace it: your function calls "
                         f"{' and '.join(rec.seen)}. Keep the colleague's block loop and add "
                         "the missing rescale")
        if rec.escapes:
            raise _Wrong(f"keep the loop in PyTorch: your function leaves it ("
                         f"{' and '.join(rec.escapes)}), and the checker cannot follow what is "
                         "computed outside (it refuses a sweep over all the keys before the "
                         "loop). Fix the colleague's torch loop where it is: add the missing "
                         "rescale")
        T_k = K.shape[-2]
        if T_k > b and T_k in rec.max_widths:
            raise _Wrong(f"your function takes the maximum over all {T_k} keys at once, with "
                         f"block_size={b} (Q {tuple(Q.shape)}, K {tuple(K.shape)}): a first pass "
                         "over the keys, which the online softmax avoids. Keep the running maximum "
                         "m, one block at a time, and rescale what was summed when it grows")
        if T_k > b and T_k in rec.exp_widths:
            raise _Wrong(f"your function takes exp over {T_k} keys at once, with "
                         f"block_size={b} (Q {tuple(Q.shape)}, K {tuple(K.shape)}): that needs the "
                         "row's maximum over all keys first. Keep the colleague's block loop, one "
                         "block of keys at a time, and add the missing rescale")
        if T_k > 2 * b and rec.exp_seen and len(rec.maxed_before_exp) >= 2:
            raise _Wrong(f"your loop sweeps the {T_k} keys twice, with block_size={b}: every "
                         "block's maximum first, then the sums. The fix keeps the colleague's "
                         "one sweep, each block's maximum and sums together, and rescales the "
                         "running sums by exp(m - m_new) (old maximum minus new) when the "
                         "maximum grows")
        for name, a, orig in zip("QKV", args, (Q, K, V), strict=True):
            if not torch.equal(a, orig):
                raise _Wrong(f"your function changed its input {name} in place (e.g. with /= or "
                             f"a method ending in _): build new tensors and leave {name} as it was")
        if not isinstance(out, torch.Tensor):
            raise _Wrong(f"return a torch tensor of shape {ref.shape}; got {type(out).__name__}")
        if tuple(out.shape) != ref.shape:
            raise _Wrong(f"expected shape {ref.shape} (..., T_q, d_v), got {tuple(out.shape)} "
                         f"(Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)})")
        if out.dtype != Q.dtype:
            raise _Wrong(f"expected dtype {Q.dtype} (the inputs'), got {out.dtype}")
        got.append(out.detach().double().numpy())
        refs.append(ref)

    def close(a, r, dtype, nan_ok=False):
        tol = 1e-4 if dtype == torch.float32 else 1e-9
        return bool(np.allclose(a, r, atol=tol, rtol=tol, equal_nan=nan_ok))

    if all(close(g, r, c[0].dtype) for g, r, c in zip(got, refs, cases, strict=True)):
        return ("one rescale of l and acc by exp(m - m_new) per block: FlashAttention's inner "
                "loop. FlashAttention-2 also defers the division by l to after the last block, "
                "one division per row instead of one per block.")
    for how, hint in _FIX_HINTS.items():
        hint = hint or _FIX_HINTS["inverted"]
        expected = [_wrong_key_blocks(*c[:4], how) for c in cases]
        if any(not close(e, r, c[0].dtype, True) for e, r, c in zip(expected, refs, cases,
                                                                     strict=True)) and \
                all(close(g, e, c[0].dtype, True) for g, e, c in zip(got, expected, cases,
                                                                     strict=True)):
            raise _Wrong(hint)
    i = next(i for i, (g, r, c) in enumerate(zip(got, refs, cases, strict=True))
             if not close(g, r, c[0].dtype))
    Q, K, V, b, what = cases[i]
    if not np.isfinite(got[i]).all():
        if cases[i][0].dtype == torch.float32:
            raise _Wrong(f"inf or nan for {what}: a number overflowed float32 (exp(x) is inf once "
                         "x > 88, and so is any sum or product past about 3.4e38). Subtract the "
                         "running maximum m_new inside every exp, exp(s - m_new) and "
                         "exp(m - m_new), so that no term and no factor exceeds 1")
        raise _Wrong(f"inf or nan for Q {tuple(Q.shape)}, K {tuple(K.shape)}, block_size={b}: "
                     f"{_FIX_HINTS['inverted']}")
    err = float(np.abs(got[i] - refs[i]).max())
    raise _Wrong(f"for Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, block_size="
                 f"{b} ({what}) the output is off by up to {err:.3g}: when m grows, what "
                 "must happen to l and to acc?")


# --------------------------------------------------------------------------------------------
# 5.5 When does S = Q @ K^T become compute-bound? The smallest head_dim at the balance point
# --------------------------------------------------------------------------------------------
H200_F16 = 989e12 / 4.8e12  # section 5's roofline table: float16 dense products / HBM3e bytes
A100_F16, A100_F32, T4_F16 = 312e12 / 2039e9, 19.5e12 / 2039e9, 65e12 / 320e9

# (T, bytes_per_element, balance): the notebook's case first (T = 4096, float16 on an H200), then
# hidden ones: float16 and float32, several GPUs and T. Each bound x = b e T / (2 (T - b e)) is at
# least 0.07 from a whole number, except at (384, 2, 64.0), where it is exactly 96 (so `>` is
# refused); no head_dim works at (300, 2, A100_F16), (300, 4, A100_F16) and (300, 2, 150.0), the
# last with T / e equal to the balance.
_HEAD_DIM_CASES = ((4096, 2, H200_F16), (1024, 2, A100_F16), (16384, 2, A100_F16),
                   (16384, 4, A100_F32), (300, 4, A100_F32), (4096, 4, H200_F16),
                   (1024, 2, T4_F16), (16384, 4, T4_F16), (1024, 4, T4_F16),
                   (300, 2, A100_F16), (300, 4, A100_F16), (384, 2, 64.0), (300, 2, 150.0))


def _intensity(T: int, e: int, d: int) -> Fraction:
    """Q @ K^T's arithmetic intensity, exactly: 2 T^2 d FLOPs over the bytes of Q and K read
    (T x d each) and S written (T x T), ``e`` bytes per element."""
    return Fraction(2 * T * T * d, (2 * T * d + T * T) * e)


def _head_dim(T: int, e: int, balance: float, flops_per_mac: int = 2, reads: bool = True,
              write: bool = True, rounding: str = "up"):
    """The smallest head_dim ``d >= 1`` with intensity >= ``balance`` in exact arithmetic, or
    None; the keywords give typical mistakes (1 FLOP per multiply-add, the reads of Q and K or the
    write of S left out, the bound rounded down / to nearest, ``>`` for ``>=``).
    f T^2 d >= b e (2 r T d + w T^2)  <=>  d (f T^2 - 2 r b e T) >= w b e T^2."""
    be = Fraction(balance) * e
    A = flops_per_mac * T * T - 2 * reads * be * T
    B = write * be * T * T
    if A < 0 or (A == 0 and B > 0):
        return None  # the intensity stays below the balance for every d
    if A == 0:
        return 1
    x = B / A
    d = {"up": math.ceil(x), "down": math.floor(x), "nearest": round(x),
         "strict": math.floor(x) + 1}[rounding]
    return max(d, 1) if rounding in ("up", "strict") else d


_HEAD_DIM_MISTAKES = (
    (dict(write=False),
     "you left out the write of S: the kernel writes its T x T result, T^2 * bytes_per_element "
     "bytes, besides reading Q and K. Count its bytes too"),
    (dict(reads=False),
     "you left out the reads of Q and K (T x d each): your head_dim depends on the balance and "
     "bytes_per_element only, not on T. The kernel reads both, besides writing S"),
    (dict(flops_per_mac=1),
     "count 2 FLOPs per multiply-add: each of the T^2 entries of S is a dot product of length d, "
     "d multiplications and d additions"),
    (dict(rounding="down"),
     "off by one where the bound is fractional: head_dim is an integer, the smallest one at or "
     "above the bound, so round up (rounding down or to the nearest leaves the intensity just "
     "below the balance)"),
    (dict(rounding="nearest"), None),  # the same hint as rounding down
    (dict(e=2),
     "you used 2 bytes per element whatever bytes_per_element is: the float32 cases (4 bytes) "
     "move twice the bytes. Use bytes_per_element"),
    (dict(e=4),
     "you used 4 bytes per element whatever bytes_per_element is: the float16 cases (2 bytes) "
     "move half the bytes. Use bytes_per_element"),
    (dict(rounding="strict"),
     "compute-bound means an intensity of at least the balance point (>=): where the bound is "
     "an exact integer, that head_dim itself reaches the balance, and your answer is one more"),
)


def _head_dim_answer(ans, case: str):
    """A learner's head_dim as an int, a float (judged later) or None; text, bools and other
    types are refused at once."""
    if isinstance(ans, torch.Tensor) and ans.numel() == 1:
        ans = ans.item()
    if isinstance(ans, np.generic):
        ans = ans.item()
    if ans is None:
        return None
    if isinstance(ans, str):
        raise _Wrong(f"you returned the text {ans!r:.30} for {case}: return head_dim as an int "
                     "(or None), not a string")
    if isinstance(ans, bool):
        raise _Wrong(f"you returned {ans} for {case}: return head_dim as an int, the smallest "
                     "one that reaches the balance (or None), not a comparison's bool")
    if isinstance(ans, numbers.Integral):
        return int(ans)
    if isinstance(ans, numbers.Real):
        return float(ans)
    raise _Wrong(f"return head_dim as an int (or None when no head_dim works); got "
                 f"{type(ans).__name__} for {case}")


@_checker
def check_compute_bound_head_dim(compute_bound_head_dim):
    """``compute_bound_head_dim(T, bytes_per_element, balance)`` -> the smallest int head_dim d
    for which S = Q @ K^T (Q, K (T, d) read, S (T, T) written, ``bytes_per_element`` bytes each;
    2 T^2 d FLOPs) has an arithmetic intensity of at least ``balance`` FLOP/byte, or None when no
    d does. I(d) = 2 T^2 d / ((2 T d + T^2) e) grows with d towards T / e, so: None when
    T <= balance * e, else ceil(balance e T / (2 (T - balance e))). Hidden cases against exact
    rational arithmetic; Python and NumPy ints pass, floats (even whole ones), bools and text do
    not; each typical mistake (:data:`_HEAD_DIM_MISTAKES`, a number where no head_dim works) is
    recognised from the answers on all the cases."""
    answers = []
    for T, e, balance in _HEAD_DIM_CASES:
        case = f"T = {T}, bytes_per_element = {e}, balance = {balance:.6g}"
        none_case = T <= Fraction(balance) * e
        why = (f"there T / bytes_per_element = {T / e:g} FLOP/byte is "
               f"{'equal to' if T == Fraction(balance) * e else 'below'} the balance: the "
               "intensity grows with head_dim towards T / bytes_per_element and never reaches "
               "the balance" if none_case else "")
        try:
            ans = _call(compute_bound_head_dim, T, e, balance, name="compute_bound_head_dim",
                        none_ok=True, on_error=why)
        except _Wrong as w:  # a time-out's message does not name the case: add it
            text = w.args[0]
            if " when called with " not in text:
                text += f" (on {case}{'; ' + why if why else ''})"
            raise _Wrong(text) from None
        answers.append(_head_dim_answer(ans, case))
    if all(a is None for a in answers):
        if not _did_work(compute_bound_head_dim):
            raise _NotAttempted("compute_bound_head_dim still returns None: replace the TODO "
                                "with your code and run the cell again")
        raise _Wrong("your function returned None on every case, also where T / "
                     "bytes_per_element is far above the balance: did you forget the `return` "
                     "line, or is your test for 'no head_dim works' the wrong way round?")
    refs = [_head_dim(*c) for c in _HEAD_DIM_CASES]
    if answers == refs:  # 230 == 230.0: floats with the right values land here too
        floats = [a for a in answers if isinstance(a, float)]
        if floats:
            raise _Wrong(f"right values, but head_dim is a count: return an int (you returned "
                         f"{floats[0]!r}; np.ceil and np.floor return floats, math.ceil an int)")
        T, e, balance = _HEAD_DIM_CASES[0]
        d = refs[0]
        return (f"T = {T} in float16 on an H200 (balance {balance:.1f} FLOP/byte): "
                f"{float(_intensity(T, e, d - 1)):.2f} FLOP/byte at head_dim {d - 1}, "
                f"{float(_intensity(T, e, d)):.2f} at {d}. The intensity grows with head_dim "
                f"towards T / bytes_per_element; where that is at most the balance, no head_dim "
                "reaches it.")
    for kw, hint in _HEAD_DIM_MISTAKES:
        hint = hint or _HEAD_DIM_MISTAKES[3][1]
        wrong = [_head_dim(T, kw.get("e", e), b, **{k: v for k, v in kw.items() if k != "e"})
                 for T, e, b in _HEAD_DIM_CASES]
        if wrong != refs and answers == wrong:
            raise _Wrong(hint)
    for (T, e, balance), a, r in zip(_HEAD_DIM_CASES, answers, refs, strict=True):
        if r is None and a is not None:
            raise _Wrong(f"for T = {T}, bytes_per_element = {e}, balance = {balance:.6g} you "
                         f"returned {a!r}, but no head_dim works there: the intensity grows "
                         "with head_dim towards T / bytes_per_element, and if that is at most "
                         "the balance it never reaches it. Return None in that case")
    for (T, e, balance), a in zip(_HEAD_DIM_CASES, answers, strict=True):
        if isinstance(a, float) and math.isfinite(a) and a != int(a):
            raise _Wrong(f"head_dim is an integer: the smallest one that reaches the balance, so "
                         f"round up (you returned {a:g} for T = {T}, bytes_per_element = {e}, "
                         f"balance = {balance:.6g})")
    k = next(i for i, (a, r) in enumerate(zip(answers, refs, strict=True)) if a != r)
    (T, e, balance), a = _HEAD_DIM_CASES[k], answers[k]
    case = f"T = {T}, bytes_per_element = {e}, balance = {balance:.6g}"
    if a is None:
        raise _Wrong(f"you returned None for {case}, but there T / bytes_per_element = "
                     f"{T / e:g} FLOP/byte is above the balance: the intensity grows with "
                     "head_dim towards that, so some head_dim reaches the balance")
    if not math.isfinite(a) or a < 1 or a != int(a):
        raise _Wrong(f"you returned {a!r} for {case}: head_dim is a whole number, at least 1")
    d = int(a)
    if _intensity(T, e, d) < Fraction(balance):
        raise _Wrong(f"for {case} your head_dim {d} gives an intensity of "
                     f"{float(_intensity(T, e, d)):.2f} FLOP/byte (2 T^2 d FLOPs over the bytes "
                     "of Q and K read and S written), below the balance: still memory-bound. "
                     "Count the FLOPs and the bytes again")
    raise _Wrong(f"for {case} your head_dim {d} reaches the balance "
                 f"({float(_intensity(T, e, d)):.2f} FLOP/byte), but it is not the smallest that "
                 "does: a smaller one reaches it too. Compare the intensity with the balance by "
                 ">= and take the smallest whole head_dim that passes")
