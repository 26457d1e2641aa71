"""``make bench``: attention implementations compared at larger sizes, written to Markdown.

Runs NumPy (the course's reference), naive PyTorch, ``F.scaled_dot_product_attention`` (SDPA) and
the tiled online-softmax ``shared.flash.tiled_attention`` across sequence lengths, float32,
B=1, H=8, head_dim=64, causal and not, on the device :func:`shared.benchmark.pick_device` picks.
Then, at one length: which SDPA backends each dtype can use, which kernel the default call ran,
and each usable backend's time; timing with and without synchronisation; the device's reference
matmul rate and copy bandwidth (the two numbers of the roofline model).

Every time comes from ``torch.utils.benchmark`` with ``num_threads=torch.get_num_threads()`` (the
threads PyTorch uses; the Timer's own default is one). NumPy's BLAS is limited to one thread with
``threadpoolctl`` (see ``NUMPY_THREADS``). Candidates run in turns (interleaved) and medians over
the rounds are quoted. Sizes follow the device: a candidate whose estimated memory exceeds half of
what the device has free is skipped, and one that runs out of memory anyway is reported as OOM
(and not tried at longer lengths) instead of ending the run. Writes
``benchmarks/results-<device>.md``.

    python -m tools.bench              # the default sizes for the device
    python -m tools.bench --quick      # tiny sizes, a smoke test of the script itself
    python -m tools.bench --flex       # FlexAttention only -> benchmarks/results-flex-<device>.md
    python -m tools.bench --flex --threads 1   # the same on one torch thread (a shared machine)

``--flex`` (notebook 11) is a separate run that leaves ``results-<device>.md`` alone: compiled
``flex_attention`` with a ``BlockMask`` against eager FlexAttention, SDPA with the dense boolean
mask, SDPA ``is_causal`` and the course's ``tiled_attention``, for causal, sliding-window and
document masks across sequence lengths (float32 on a CPU, float16 on a GPU). The first call of the
compiled kernel for each mask and length (tracing, code generation, C++/Triton compilation) is
timed on its own, with a fresh compile cache, and kept out of the per-call times.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits
from torch.utils import benchmark

from shared.attention import scaled_dot_product_attention as numpy_attention
from shared.benchmark import (
    attention_bytes,
    attention_flops,
    dtype_works,
    fits_in_memory,
    gflops,
    interleaved_medians,
    is_out_of_memory,
    machine_info,
    memory_bandwidth,
    naive_peak_bytes,
    naive_score_bytes,
    peak_memory,
    pick_device,
    sdpa_backend_times,
    sdpa_backends,
    sdpa_kernel_used,
    synchronize,
    time_fn,
)
from shared.flash import DEFAULT_BLOCK_SIZE, tiled_attention
from shared.modules import naive_attention

ROOT = Path(__file__).resolve().parent.parent
B, H, HEAD_DIM = 1, 8, 64
MATMUL_N = 2048
TILED = "tiled loop (eager)"  # the course's tile loop, one PyTorch call per operation
# NumPy's OpenBLAS keeps worker threads that spin while they wait; next to PyTorch's own pool on a
# machine whose cores are shared, two BLAS threads made NumPy about ten times slower than one
# (measured on the course's 2-core machine). One thread is the fair figure there; say so.
NUMPY_THREADS = 1


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]  # sequence lengths
    numpy_max: int  # longest length NumPy runs at
    rounds: int  # interleaved rounds per length
    min_run_time: float  # seconds per Timer.blocked_autorange
    target_rounds: int  # more rounds at the longest length
    detail_T: int  # the length of the backend, dtype and synchronisation measurements


PLANS = {
    "cpu": Plan((256, 512, 1024, 2048, 4096), 2048, 3, 0.3, 7, 1024),
    "gpu": Plan((512, 1024, 2048, 4096, 8192, 16384), 2048, 5, 0.3, 7, 4096),
    "quick": Plan((64, 128), 128, 2, 0.02, 2, 64),
}


def oom_cleanup(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def estimated_bytes(name: str, T: int, device: torch.device) -> int:
    """Rough peak bytes of one candidate at length T (inputs included), to skip what cannot fit."""
    inputs = 4 * B * H * T * HEAD_DIM * 4  # Q, K, V and the output, float32
    if name in ("naive PyTorch", "NumPy reference"):
        return naive_peak_bytes(B, H, T, T, HEAD_DIM) + inputs
    return 2 * inputs  # SDPA's fused kernels and the tiled loop: linear in T


def candidates(Q, K, V, causal: bool, with_numpy: bool, block_size: int):
    fns = {}
    if with_numpy:
        q, k, v = (x.cpu().numpy() for x in (Q, K, V))

        fns["NumPy reference"] = lambda: numpy_attention(q, k, v, causal=causal)
    fns["naive PyTorch"] = lambda: naive_attention(Q, K, V, causal=causal)
    fns["SDPA"] = lambda: F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    fns[TILED] = lambda: tiled_attention(Q, K, V, causal=causal, block_size=block_size)
    return fns


def run_lengths(device: torch.device, plan: Plan, block_size: int, quick: bool):
    """Time every candidate at every length; returns (rows, targets, notes)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device)
    matmul = lambda: a @ b  # noqa: E731
    rows, targets, notes = [], {}, []
    failed: dict[str, int] = {}  # candidate -> the length at which it ran out of memory
    for T in plan.lengths:
        try:
            Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device) for _ in range(3))
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                raise
            oom_cleanup(device)
            notes.append(f"T = {T}: the inputs themselves did not fit; stopped here.")
            break
        last = T == plan.lengths[-1]
        for causal in (False, True):
            fns = candidates(Q, K, V, causal, T <= plan.numpy_max, block_size)
            skipped = {}
            for name in list(fns):
                if name in failed:
                    skipped[name] = f"OOM at T = {failed[name]}"
                elif not fits_in_memory(estimated_bytes(name, T, device),
                                        "cpu" if name == "NumPy reference" else device):
                    need = estimated_bytes(name, T, device) / 2**30
                    skipped[name] = f"skipped: needs about {need:.1f} GiB"
            for name in skipped:
                fns.pop(name)
            n_rounds = plan.target_rounds if last and not quick else plan.rounds
            t0 = time.perf_counter()
            times: dict[str, list[float]] = {name: [] for name in fns}
            mm: list[float] = []
            for _ in range(n_rounds):
                for name, fn in list(fns.items()):
                    try:
                        times[name].append(time_fn(fn, device, plan.min_run_time))
                    except (RuntimeError, MemoryError) as err:
                        if not is_out_of_memory(err):
                            raise
                        oom_cleanup(device)
                        failed[name] = T
                        skipped[name] = "OOM"
                        fns.pop(name)
                        times.pop(name)
                mm.append(time_fn(matmul, device, plan.min_run_time))
            mm_rate = gflops(2 * MATMUL_N**3, statistics.median(mm))
            flops = attention_flops(B, H, T, T, HEAD_DIM, causal)
            for name, ts in times.items():
                mem = None
                if name != "NumPy reference":
                    try:
                        mem = peak_memory(fns[name], device)
                    except (RuntimeError, MemoryError) as err:
                        if not is_out_of_memory(err):
                            raise
                        oom_cleanup(device)
                median = statistics.median(ts)
                rows.append({
                    "T": T, "causal": causal, "impl": name, "ms": 1e3 * median,
                    "gflops": gflops(flops, median), "of_matmul": gflops(flops, median) / mm_rate,
                    "peak_mib": None if mem is None else mem / 2**20, "rounds": n_rounds,
                    "status": "ok",
                })
            for name, why in skipped.items():
                rows.append({"T": T, "causal": causal, "impl": name, "status": why})
            summary = ", ".join(f"{n} {1e3 * statistics.median(t):.1f} ms"
                                for n, t in times.items())
            summary += "".join(f", {n}: {why}" for n, why in skipped.items())
            print(f"T={T:>5} causal={causal!s:5}: {summary}; matmul {mm_rate:.0f} GFLOP/s "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if last and "SDPA" in times and TILED in times:
                latest = {r["impl"]: r for r in rows if r["T"] == T and r["causal"] == causal}
                ratios = [s / t for s, t in zip(times["SDPA"], times[TILED], strict=True)]
                naive = latest.get("naive PyTorch", {})
                targets["causal" if causal else "non-causal"] = {
                    "ratio_of_medians": statistics.median(times["SDPA"])
                    / statistics.median(times[TILED]),
                    "median_ratio": statistics.median(ratios),
                    "ratios": ratios,
                    "sdpa_of_matmul": latest["SDPA"]["of_matmul"],
                    "sdpa_gflops": latest["SDPA"]["gflops"],
                    "matmul_gflops": mm_rate,
                    "naive_mib": naive.get("peak_mib"),
                    "tiled_mib": latest[TILED]["peak_mib"],
                    "T": T,
                }
        del Q, K, V
    return rows, targets, notes


def unsynchronised_seconds(fn, number: int = 20) -> float:
    """The classic mistake: a bare clock around queued GPU work, no synchronisation."""
    fn()
    fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, timer=time.perf_counter,
                            num_threads=torch.get_num_threads())
    return timer.timeit(number=number).median


def run_details(device: torch.device, plan: Plan) -> dict:
    """Backends per dtype, the kernel that ran, per-backend times, (un)synchronised timing, and
    the roofline's two numbers, at length ``plan.detail_T``."""
    T = plan.detail_T
    gen = torch.Generator().manual_seed(1)
    base = [torch.randn(B, H, T, HEAD_DIM, generator=gen) for _ in range(3)]
    details: dict = {"T": T, "dtypes": {}}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        if not dtype_works(device, dtype):
            details["dtypes"][name] = {"works": False}
            continue
        Q, K, V = (x.to(device, dtype) for x in base)
        entry = {"works": True, "backends": sdpa_backends(device, dtype)}
        entry["ran"] = [b for b, _ in sdpa_kernel_used(
            lambda Q=Q, K=K, V=V: F.scaled_dot_product_attention(Q, K, V))]
        try:
            entry["times"] = sdpa_backend_times(Q, K, V, min_run_time=plan.min_run_time)
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                raise
            oom_cleanup(device)
            entry["times"] = {}
            entry["oom"] = True
        details["dtypes"][name] = entry
    Q, K, V = (x.to(device) for x in base)
    call = lambda: F.scaled_dot_product_attention(Q, K, V)  # noqa: E731
    details["unsynchronised_ms"] = 1e3 * unsynchronised_seconds(call)
    synchronize(device)
    details["synchronised_ms"] = 1e3 * time_fn(call, device, plan.min_run_time)
    details["matmul_gflops"] = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        if device.type == "cpu" and dtype != torch.float32:
            continue  # half-precision matmuls on a CPU are not what attention runs on there
        if not dtype_works(device, dtype):
            continue
        a = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device, dtype)
        b = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device, dtype)
        seconds = time_fn(lambda a=a, b=b: a @ b, device, plan.min_run_time)
        details["matmul_gflops"][str(dtype).replace("torch.", "")] = gflops(2 * MATMUL_N**3,
                                                                            seconds)
    details["bandwidth_gbs"] = memory_bandwidth(device, mib=8 if plan is PLANS["quick"] else None,
                                                min_run_time=plan.min_run_time)
    return details


def fmt(x, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(device, rows, targets, details, notes, info, block_size: int, seconds: float) -> str:
    lines = [
        f"# Attention benchmark: {device.type}",
        "",
        "Written by `make bench` (`python -m tools.bench`). float32, B = 1, H = 8, head_dim = 64;",
        f"{TILED} = `shared.flash.tiled_attention` with block_size = {block_size}.",
        "Times are medians over interleaved rounds of",
        "`torch.utils.benchmark.Timer.blocked_autorange`, run",
        f"with `num_threads = torch.get_num_threads()` = {torch.get_num_threads()} (the threads",
        f"PyTorch uses). NumPy runs with {NUMPY_THREADS} BLAS thread (`threadpoolctl`; see",
        "tools/bench.py for why). GFLOP/s count the two matrix products' useful work",
        "(4·B·H·pairs·head_dim, causal: only the pairs j ≤ i); \"vs matmul\" divides by a",
        f"{MATMUL_N}×{MATMUL_N} float32 matrix multiply timed in the same rounds: a reference",
        "point, not a ceiling (a fused kernel can use faster paths than one float32 matmul, e.g.",
        "TF32 tensor cores on recent NVIDIA GPUs). Peak memory: CPU via the profiler's allocation",
        "events (`shared.benchmark.cpu_peak_memory`), CUDA via `torch.cuda.max_memory_allocated`,",
        "none on MPS; the output counts, the inputs do not. A candidate is skipped where its",
        "estimated memory exceeds half of the device's free memory, and reported as OOM where it",
        "ran out anyway. On a shared machine expect ±10 % or more between runs.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
        f"| bench runtime | {seconds:.0f} s |",
        "",
    ]
    if notes:
        lines += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    if targets:
        T = next(iter(targets.values()))["T"]
        lines += [f"## Targets (T = {T})", "", "| figure | target | measured |", "|---|---|---|"]
        for key in ("non-causal", "causal"):
            if key not in targets:
                continue
            t = targets[key]
            lines.append(
                f"| tiled / SDPA throughput, {key} (ratio of medians; median of per-round "
                f"ratios) | ≥ 0.65 | {t['ratio_of_medians']:.2f}; {t['median_ratio']:.2f} |")
        for key in ("non-causal", "causal"):
            t = targets.get(key)
            if t and t["naive_mib"] and t["tiled_mib"]:
                lines.append(
                    f"| naive / tiled peak memory, {key} ({fmt(t['naive_mib'])} MiB / "
                    f"{fmt(t['tiled_mib'])} MiB) | ≥ 50 | {t['naive_mib'] / t['tiled_mib']:.0f} |")
        for key in ("non-causal", "causal"):
            t = targets.get(key)
            if t:
                lines.append(
                    f"| SDPA vs reference matmul GFLOP/s, {key} ({t['sdpa_gflops']:.0f} / "
                    f"{t['matmul_gflops']:.0f}) | reported | {t['sdpa_of_matmul']:.2f} |")
        ratios = "; ".join(f"{k}: " + ", ".join(f"{r:.2f}" for r in t["ratios"])
                           for k, t in targets.items())
        lines += ["", f"Per-round tiled/SDPA ratios, {ratios}.", ""]
    if details:
        T = details["T"]
        lines += [
            f"## SDPA backends (T = {T}, non-causal)",
            "",
            "Usable = the backend accepts a small problem in that dtype when forced with "
            "`torch.nn.attention.sdpa_kernel`; ran = the kernel the default call used, from the "
            "profiler's operator names; times are each usable backend forced in turn.",
            "",
            "| dtype | flash | mem_efficient | cudnn | math | default call ran | time per backend "
            "(ms) |",
            "|---|:---:|:---:|:---:|:---:|---|---|",
        ]
        for dtype, e in details["dtypes"].items():
            if not e["works"]:
                lines.append(f"| {dtype} | – | – | – | – | not supported on this device | |")
                continue
            marks = " | ".join("yes" if e["backends"][b] else "no"
                               for b in ("flash", "mem_efficient", "cudnn", "math"))
            times = ", ".join(f"{b} {1e3 * s:.2f}" for b, s in e["times"].items())
            if e.get("oom"):
                times += " (a backend ran out of memory)"
            lines.append(f"| {dtype} | {marks} | {', '.join(e['ran']) or '?'} | {times} |")
        mm = ", ".join(f"{k} {v:.0f}" for k, v in details["matmul_gflops"].items())
        bw = details["bandwidth_gbs"]
        mm32 = details["matmul_gflops"].get("float32")
        flops = attention_flops(B, H, T, T, HEAD_DIM)
        unfused = flops / attention_bytes(B, H, T, T, HEAD_DIM, fused=False)
        fused = flops / attention_bytes(B, H, T, T, HEAD_DIM)
        lines += [
            "",
            "## Timing without synchronising (SDPA, float32)",
            "",
            f"Bare clock, no synchronisation: {details['unsynchronised_ms']:.3f} ms per call; "
            f"`torch.utils.benchmark` (synchronised): {details['synchronised_ms']:.3f} ms per "
            "call.",
            "",
            "## Roofline numbers",
            "",
            f"Reference matmul ({MATMUL_N}², GFLOP/s): {mm}. Copy bandwidth: {bw:.1f} GB/s. "
            + (f"Machine balance (float32): {mm32 / bw:.1f} FLOP/byte. " if mm32 else "")
            + f"Arithmetic intensity at T = {T}, float32: unfused (scores written and read) "
            f"{unfused:.1f} FLOP/byte, fused {fused:.0f} FLOP/byte.",
            "",
        ]
    lines += [
        "## All sizes",
        "",
        "| T | causal | implementation | time (ms) | GFLOP/s | vs matmul | peak memory (MiB) "
        "| naive score matrix by formula (MiB) |",
        "|---:|:---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        formula = naive_score_bytes(B, H, r["T"], r["T"]) / 2**20
        causal = "yes" if r["causal"] else "no"
        if r["status"] != "ok":
            lines.append(f"| {r['T']} | {causal} | {r['impl']} | {r['status']} | | | | "
                         f"{formula:.1f} |")
            continue
        lines.append(
            f"| {r['T']} | {causal} | {r['impl']} | {r['ms']:.2f} | {r['gflops']:.1f} "
            f"| {r['of_matmul']:.2f} | {fmt(r['peak_mib'])} | {formula:.1f} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# --flex: FlexAttention (notebook 11)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlexPlan:
    lengths: tuple[int, ...]
    window: int  # sliding-window width
    eager_max: int  # longest length eager FlexAttention (scores materialised) runs at
    rounds: int
    min_run_time: float


FLEX_PLANS = {
    "cpu": FlexPlan((512, 1024, 2048, 4096), 256, 2048, 3, 0.3),
    "gpu": FlexPlan((1024, 4096, 16384), 256, 4096, 5, 0.3),
    "quick": FlexPlan((128, 256), 32, 256, 1, 0.02),
}
# Packed documents: each takes this share of the sequence (uneven on purpose; they sum to 1).
DOC_SHARES = (0.05, 0.2, 0.1, 0.15, 0.05, 0.25, 0.1, 0.1)


def doc_ids(T: int) -> torch.Tensor:
    """``(T,)`` document id of each token for ``DOC_SHARES`` (the last document takes the rest)."""
    lengths = [int(share * T) for share in DOC_SHARES[:-1]]
    lengths.append(T - sum(lengths))
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def flex_masks(T: int, window: int, device: torch.device) -> dict:
    from shared import flex

    return {
        "causal": flex.causal,
        f"sliding window {window}": flex.sliding_window(window),
        "documents (8, causal)": flex.document(doc_ids(T).to(device)),
    }


def flex_candidates(compiled, Q, K, V, block_mask, dense, causal: bool, eager: bool) -> dict:
    from torch.nn.attention.flex_attention import flex_attention

    fns = {"flex, compiled": lambda: compiled(Q, K, V, block_mask=block_mask)}
    if eager:
        fns["flex, eager"] = lambda: flex_attention(Q, K, V, block_mask=block_mask)
    fns["SDPA, dense mask"] = lambda: F.scaled_dot_product_attention(Q, K, V, attn_mask=dense)
    if causal:
        fns["SDPA, is_causal"] = lambda: F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        fns["tiled (course), causal"] = lambda: tiled_attention(Q, K, V, causal=True)
    else:
        fns["tiled (course), dense mask"] = lambda: tiled_attention(Q, K, V, mask=dense)
    return fns


# Score elements of one float64 reference chunk: 2^25 x 8 bytes = 256 MiB (twice that at the peak:
# the scores and their softmax).
REFERENCE_CHUNK_ELEMENTS = 2**25


def float64_reference(Q, K, V, mask, rows: int | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` in float64 with the boolean ``mask`` (``(T_q, T_k)``),
    ``rows`` queries at a time (default: as many as keep one chunk's scores within
    ``REFERENCE_CHUNK_ELEMENTS``). No fused kernel takes float64, so SDPA runs its math backend,
    which holds the whole ``(B, H, T_q, T_k)`` score matrix (and its softmax): at B = 1, H = 8,
    T = 16384 that is 16 GiB each, more than a 16 GB GPU has. Each query row's output depends on
    that row alone, so chunks of rows give the same result.

    Shapes: Q ``(B, H, T_q, d)``, K and V ``(B, H, T_k, d)``; returns ``(B, H, T_q, d)`` float64."""
    *batch, T_q, _ = Q.shape
    T_k = K.shape[-2]
    if rows is None:
        rows = max(1, REFERENCE_CHUNK_ELEMENTS // (math.prod(batch) * T_k))
    K, V = K.double(), V.double()
    return torch.cat([F.scaled_dot_product_attention(Q[..., q0:q0 + rows, :].double(), K, V,
                                                     attn_mask=mask[q0:q0 + rows])
                      for q0 in range(0, T_q, rows)], dim=-2)


def run_flex(device: torch.device, plan: FlexPlan) -> dict:
    """Time every candidate for every mask and length; returns rows and the recompile probe."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from shared import flex

    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    gen = torch.Generator().manual_seed(0)
    rows = []
    # The first create_block_mask of a process pays a one-time warm-up (vmap and the operators it
    # dispatches to); one call on a small mask keeps that out of the block mask column.
    create_block_mask(flex.causal, None, None, 256, 256, device=device)
    for T in plan.lengths:
        Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device, dtype)
                   for _ in range(3))
        on_cpu = flex_masks(T, plan.window, torch.device("cpu"))  # for the dense masks
        for name, mod in flex_masks(T, plan.window, device).items():
            t0 = time.perf_counter()
            block_mask = create_block_mask(mod, None, None, T, T, device=device)
            synchronize(device)
            build_s = time.perf_counter() - t0
            dense = flex.dense_mask(on_cpu[name], T).to(device)
            # A fresh compiled function for every mask and length: torch.compile keeps at most
            # torch._dynamo.config.recompile_limit (8) versions of one function and then runs it
            # eagerly, without a word beyond a log line (measured here: the ninth configuration ran
            # at eager speed).
            torch._dynamo.reset()
            compiled = torch.compile(flex_attention, dynamic=False)
            t0 = time.perf_counter()
            compiled(Q, K, V, block_mask=block_mask)  # first call: compiles
            synchronize(device)
            compile_s = time.perf_counter() - t0
            fns = flex_candidates(compiled, Q, K, V, block_mask, dense, name == "causal",
                                  T <= plan.eager_max)
            error = float((compiled(Q, K, V, block_mask=block_mask).double()
                           - float64_reference(Q, K, V, dense)).abs().max())
            medians = interleaved_medians(fns, device, plan.rounds, plan.min_run_time)
            rows.append({"T": T, "mask": name, "sparsity": block_mask.sparsity(),
                         "density": 100 * float(dense.float().mean()), "build_ms": 1e3 * build_s,
                         "compile_s": compile_s, "error": error,
                         "ms": {k: 1e3 * v for k, v in medians.items()}})
            shown = ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in medians.items())
            print(f"T={T:>5} {name}: compile {compile_s:.1f} s, {shown}", flush=True)
        del Q, K, V
    torch._dynamo.reset()
    stale = stale_probe(torch.compile(flex_attention, dynamic=False), device, dtype, plan)
    return {"rows": rows, "recompile": recompile_probe(device, dtype, plan), "stale": stale,
            "dtype": dtype}


def stale_probe(compiled, device: torch.device, dtype, plan: FlexPlan) -> dict:
    """A document mask whose captured ``doc_ids`` change after ``create_block_mask``: what the
    compiled kernel computes, against attention with the new dense mask and with
    ``shared.flex.effective_mask`` (the stale tiles applied to the new mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from shared import flex

    T = 512  # four tiles of 128 per side, so that documents of T/4 fill whole tiles
    gen = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device, dtype) for _ in range(3))
    ids = torch.arange(T) // (T // 4)  # four documents of T/4
    mod = flex.document(ids)
    block_mask = create_block_mask(mod, None, None, T, T, device="cpu")
    ids.copy_(torch.arange(T) // (T // 2))  # now two documents of T/2, same BlockMask
    got = compiled(Q.cpu(), K.cpu(), V.cpu(), block_mask=block_mask).double()
    q, k, v = (x.cpu().double() for x in (Q, K, V))
    return {
        "T": T,
        "vs_new_mask": float((got - F.scaled_dot_product_attention(
            q, k, v, attn_mask=flex.dense_mask(mod, T))).abs().max()),
        "vs_effective": float((got - F.scaled_dot_product_attention(
            q, k, v, attn_mask=flex.effective_mask(block_mask))).abs().max()),
    }


def recompile_widths(plan: FlexPlan) -> tuple[int, ...]:
    """Widths no kernel of the per-call table used (that window at T = lengths[0] would be a
    compile-cache hit, not a compile)."""
    return plan.window // 2, plan.window // 4, plan.window // 8


def recompile_probe(device: torch.device, dtype, plan: FlexPlan) -> dict:
    """First-call seconds of the compiled kernel when a sliding window's width changes, the window
    a ``mask_mod`` with its ``BlockMask``: the width held as a Python int in the mask_mod's closure
    (``shared.flex.sliding_window(w)``, a recompile each) vs as a captured tensor changed in place
    (one mask_mod, compiled once). The BlockMask is rebuilt for each width in both cases (its tiles
    change); that build is kept out of the time."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from shared import flex

    T = plan.lengths[0]
    gen = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device, dtype) for _ in range(3))
    width = torch.tensor(plan.window, device=device)

    def tensor_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < width)

    out = {}
    for kind in ("int", "tensor"):
        torch._dynamo.reset()
        compiled = torch.compile(flex_attention, dynamic=False)
        firsts = []
        for w in recompile_widths(plan):
            if kind == "int":
                mask_mod = flex.sliding_window(w)
            else:
                width.fill_(w)
                mask_mod = tensor_window
            block_mask = create_block_mask(mask_mod, None, None, T, T, device=device)
            t0 = time.perf_counter()
            compiled(Q, K, V, block_mask=block_mask)
            synchronize(device)
            firsts.append(time.perf_counter() - t0)
        out[kind] = firsts
    return out


def flex_markdown(device, result: dict, plan: FlexPlan, info: dict, seconds: float) -> str:
    rows = result["rows"]
    dtype = str(result["dtype"]).replace("torch.", "")
    impls = []
    for r in rows:
        impls += [k for k in r["ms"] if k not in impls]
    lines = [
        f"# FlexAttention benchmark: {device.type}",
        "",
        f"Written by `python -m tools.bench --flex` (notebook 11). {dtype}, B = {B}, H = {H}, "
        f"head_dim = {HEAD_DIM}.",
        "flex, compiled = `torch.compile(flex_attention, dynamic=False)` with the `BlockMask` of "
        "`create_block_mask`",
        "(default 128 × 128 tiles); flex, eager = the same call without compiling (it "
        "materialises every score);",
        "SDPA, dense mask = `F.scaled_dot_product_attention(attn_mask=<boolean (T, T) mask>)`; "
        "tiled (course) =",
        f"`shared.flash.tiled_attention` (blocks of {DEFAULT_BLOCK_SIZE}; with `causal=True` it "
        "skips the tiles above the diagonal,",
        "with a dense mask it computes every tile). Per-call times are medians over "
        f"{plan.rounds} interleaved rounds of",
        "`torch.utils.benchmark.Timer.blocked_autorange`, with "
        f"`num_threads = torch.get_num_threads()` = {torch.get_num_threads()}.",
        "Compile = the first call of the compiled kernel for that mask and length (tracing, "
        "code generation and",
        "compilation, with a fresh compile cache), kept out of the per-call times; block mask = "
        "one `create_block_mask` call",
        "(after one warm-up call at the start of the run, which pays the process's one-time "
        "set-up).",
        "Sparsity = the share of 128 × 128 tiles skipped (`BlockMask.sparsity()`); density = the "
        "share of (query, key)",
        "pairs the mask allows. Error = max |compiled flex − float64 SDPA with the dense mask|. "
        "On a shared machine",
        "expect ±10 % or more between runs.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
        f"| bench runtime | {seconds:.0f} s |",
        "",
        "## Per-call time (ms)",
        "",
        "| mask | T | tiles skipped | pairs allowed | " + " | ".join(impls)
        + " | compile (s) | block mask (ms) | error |",
        "|---|---:|---:|---:|" + "---:|" * len(impls) + "---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (list(DOC_ORDER(rows)).index(r["mask"]), r["T"])):
        cells = " | ".join(f"{r['ms'][k]:.1f}" if k in r["ms"] else "–" for k in impls)
        lines.append(f"| {r['mask']} | {r['T']} | {r['sparsity']:.0f} % | {r['density']:.0f} % "
                     f"| {cells} | {r['compile_s']:.1f} | {r['build_ms']:.1f} | "
                     f"{r['error']:.0e} |")
    rec = result["recompile"]
    T = plan.lengths[0]
    widths = recompile_widths(plan)
    lines += [
        "",
        f"## Recompiles (T = {T})",
        "",
        "First-call seconds of `torch.compile(flex_attention)` for three sliding windows in a row "
        f"({', '.join(map(str, widths))}),",
        "each a mask_mod with its BlockMask (rebuilt for each width, not timed): the width a "
        "Python int in the mask_mod's",
        "closure (`shared.flex.sliding_window(w)`), or a tensor one mask_mod captures and that is "
        "changed in place:",
        "",
        "| width held as | " + " | ".join(f"window {w}" for w in widths) + " |",
        "|---|" + "---:|" * len(widths),
        *(f"| {kind} | " + " | ".join(f"{s:.2f}" for s in rec[kind]) + " |"
          for kind in ("int", "tensor")),
        "",
    ]
    stale = result["stale"]
    lines += [
        f"## A stale BlockMask (T = {stale['T']}, on the CPU)",
        "",
        "A document mask built for four documents of T/4 tokens; then its captured `doc_ids` "
        "are changed in place to two",
        "documents of T/2 and the compiled kernel runs with the old BlockMask. Max abs difference "
        "of its output from",
        f"attention with the new dense mask: {stale['vs_new_mask']:.2f}; from attention with "
        "`shared.flex.effective_mask` (the old tiles,",
        f"the new mask inside the partial ones): {stale['vs_effective']:.0e}.",
        "",
    ]
    return "\n".join(lines)


def DOC_ORDER(rows):  # noqa: N802 - the masks in the order they were timed
    return dict.fromkeys(r["mask"] for r in rows)


def main_flex(device: torch.device, quick: bool, out: Path | None) -> int:
    plan = FLEX_PLANS["quick" if quick else ("cpu" if device.type == "cpu" else "gpu")]
    # A fresh compile cache for this run, so the compile column is a cold compile, not a cache hit.
    info = machine_info(device)
    print("device:", device.type, "|", info["cpu"], "|", info["gpu"], flush=True)
    with tempfile.TemporaryDirectory(prefix="flex-bench-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        result = run_flex(device, plan)
        seconds = time.perf_counter() - t0
    out = out or ROOT / "benchmarks" / f"results-flex-{device.type}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(flex_markdown(device, result, plan, info, seconds), encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} in {seconds:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--flex", action="store_true", help="FlexAttention only (notebook 11): "
                        "writes benchmarks/results-flex-<device>.md")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for every timing (default: torch's own count); on a "
                        "machine whose cores other jobs share, 1 keeps the comparison fair")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="sequence lengths to time instead of the device's default plan")
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default benchmarks/results-<device>.md)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1; got {args.threads}")
        torch.set_num_threads(args.threads)
    device = pick_device()
    if args.flex:
        return main_flex(device, args.quick, args.out)
    plan = PLANS["quick" if args.quick else ("cpu" if device.type == "cpu" else "gpu")]
    if args.lengths:
        lengths = tuple(sorted(args.lengths))
        plan = Plan(lengths, min(plan.numpy_max, lengths[-1]), plan.rounds, plan.min_run_time,
                    plan.target_rounds, lengths[0])
    # NumPy's BLAS threads for the whole run (threadpoolctl acts on the loaded library, unlike an
    # environment variable, which only counts if set before NumPy is first imported).
    with threadpool_limits(limits=NUMPY_THREADS, user_api="blas"):
        info = machine_info(device)
        print("device:", device.type, "|", info["cpu"], "|", info["gpu"], flush=True)
        t0 = time.perf_counter()
        rows, targets, notes = run_lengths(device, plan, args.block_size, args.quick)
        details = run_details(device, plan)
        seconds = time.perf_counter() - t0
    out = args.out or ROOT / "benchmarks" / f"results-{device.type}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(device, rows, targets, details, notes, info, args.block_size, seconds)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
