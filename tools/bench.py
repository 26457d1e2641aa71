"""``make bench``: attention implementations compared at larger sizes, written to Markdown.

Runs NumPy (the course's reference), naive PyTorch, ``F.scaled_dot_product_attention`` (SDPA) and
the tiled online-softmax ``shared.flash.tiled_attention`` across sequence lengths, float32,
B=1, H=8, head_dim=64, causal and not, on the device :func:`shared.benchmark.pick_device` picks.
Every time comes from ``torch.utils.benchmark``; candidates run in turns (interleaved) and medians
over the rounds are quoted. A large matrix multiply is timed in the same rounds as the
machine's ceiling. Writes ``benchmarks/results-<device>.md``.

    python -m tools.bench              # the default sizes for the device
    python -m tools.bench --quick      # tiny sizes, a smoke test of the script itself
"""

from __future__ import annotations

import os

# NumPy's OpenBLAS and PyTorch each keep a pool of threads that spin while they wait for work; on a
# 2-core machine the two pools fight and NumPy runs several times slower than alone. One BLAS thread
# for NumPy (set before NumPy is first imported) keeps the reference honest and PyTorch undisturbed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from shared.attention import scaled_dot_product_attention as numpy_attention  # noqa: E402
from shared.benchmark import (  # noqa: E402
    attention_flops,
    gflops,
    interleaved_times,
    machine_info,
    naive_score_bytes,
    peak_memory,
    pick_device,
)
from shared.flash import DEFAULT_BLOCK_SIZE, tiled_attention  # noqa: E402
from shared.modules import naive_attention  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
B, H, HEAD_DIM = 1, 8, 64
MATMUL_N = 2048

# (sequence lengths, longest NumPy runs, rounds, min_run_time) per device type
PLANS = {
    "cpu": ([256, 512, 1024, 2048, 4096], 2048, 3, 0.3),
    "gpu": ([512, 1024, 2048, 4096, 8192, 16384], 2048, 5, 0.3),
    "quick": ([64, 128], 128, 2, 0.02),
}
TARGET_ROUNDS = 7  # more rounds at the target size, T = the largest


def candidates(Q, K, V, causal: bool, with_numpy: bool, block_size: int):
    fns = {}
    if with_numpy:
        q, k, v = (x.cpu().numpy() for x in (Q, K, V))
        fns["NumPy reference"] = lambda: numpy_attention(q, k, v, causal=causal)
    fns["naive PyTorch"] = lambda: naive_attention(Q, K, V, causal=causal)
    fns["SDPA"] = lambda: F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    fns["tiled (flash)"] = lambda: tiled_attention(Q, K, V, causal=causal, block_size=block_size)
    return fns


def run(device: torch.device, plan: str, block_size: int) -> tuple[list[dict], dict]:
    lengths, numpy_max, rounds, min_run_time = PLANS[plan]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen).to(device)
    matmul = {"matmul": lambda: a @ b}
    rows, targets = [], {}
    for T in lengths:
        Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device) for _ in range(3))
        last = T == lengths[-1]
        for causal in (False, True):
            fns = candidates(Q, K, V, causal, T <= numpy_max, block_size)
            n_rounds = max(rounds, TARGET_ROUNDS) if last and plan != "quick" else rounds
            t0 = time.perf_counter()
            times = interleaved_times({**fns, **matmul}, device, n_rounds, min_run_time)
            mm_rate = gflops(2 * MATMUL_N**3, statistics.median(times.pop("matmul")))
            flops = attention_flops(B, H, T, T, HEAD_DIM, causal)
            for name, ts in times.items():
                fn = fns[name]
                mem = peak_memory(fn, device) if name != "NumPy reference" else None
                median = statistics.median(ts)
                rows.append({
                    "T": T, "causal": causal, "impl": name, "ms": 1e3 * median,
                    "gflops": gflops(flops, median), "of_matmul": gflops(flops, median) / mm_rate,
                    "peak_mib": None if mem is None else mem / 2**20, "rounds": n_rounds,
                })
            summary = ", ".join(f"{n} {1e3 * statistics.median(t):.1f} ms"
                                for n, t in times.items())
            print(f"T={T:>5} causal={causal!s:5}: {summary}; matmul {mm_rate:.0f} GFLOP/s "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if last:
                latest = {r["impl"]: r for r in rows[-len(times):]}
                ratios = [s / t for s, t in zip(times["SDPA"], times["tiled (flash)"], strict=True)]
                key = "causal" if causal else "non-causal"
                targets[key] = {
                    "ratio_of_medians": statistics.median(times["SDPA"])
                    / statistics.median(times["tiled (flash)"]),
                    "median_ratio": statistics.median(ratios),
                    "ratios": ratios,
                    "sdpa_of_matmul": latest["SDPA"]["of_matmul"],
                    "sdpa_gflops": latest["SDPA"]["gflops"],
                    "matmul_gflops": mm_rate,
                    "naive_mib": latest["naive PyTorch"]["peak_mib"],
                    "tiled_mib": latest["tiled (flash)"]["peak_mib"],
                    "T": T,
                }
    return rows, targets


def fmt_mib(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def markdown(device, rows, targets, info, block_size: int, seconds: float) -> str:
    lines = [
        f"# Attention benchmark: {device.type}",
        "",
        "Written by `make bench` (`python -m tools.bench`). float32, B = 1, H = 8, head_dim = 64;",
        f"tiled = `shared.flash.tiled_attention` with block_size = {block_size}. Times are",
        "medians over interleaved rounds of `torch.utils.benchmark.Timer.blocked_autorange`;",
        "GFLOP/s count the two matrix products' useful work (4·B·H·pairs·head_dim, causal: only",
        f"the pairs j ≤ i); \"of matmul\" divides by a {MATMUL_N}×{MATMUL_N} float32 matrix",
        "multiply timed in the same rounds. Peak memory: CPU via the profiler's allocation events",
        "(`shared.benchmark.cpu_peak_memory`), CUDA via `torch.cuda.max_memory_allocated`; the",
        "output counts, the inputs do not. NumPy runs with one BLAS thread (see tools/bench.py).",
        "The machine is shared with other jobs: expect ±10 % or more between runs.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
        f"| bench runtime | {seconds:.0f} s |",
        "",
        "## Targets (T = {})".format(next(iter(targets.values()))["T"] if targets else "?"),
        "",
    ]
    if targets:
        nc, c = targets["non-causal"], targets["causal"]
        mem_ratio = nc["naive_mib"] / nc["tiled_mib"] if nc["tiled_mib"] else float("nan")
        mem_ratio_c = c["naive_mib"] / c["tiled_mib"] if c["tiled_mib"] else float("nan")
        lines += [
            "| figure | target | measured |",
            "|---|---|---|",
            f"| tiled / SDPA throughput, non-causal (ratio of medians; median of per-round ratios) "
            f"| ≥ 0.65 | {nc['ratio_of_medians']:.2f}; {nc['median_ratio']:.2f} |",
            f"| tiled / SDPA throughput, causal (ratio of medians; median of per-round ratios) "
            f"| ≥ 0.65 | {c['ratio_of_medians']:.2f}; {c['median_ratio']:.2f} |",
            f"| naive / tiled peak memory, non-causal ({fmt_mib(nc['naive_mib'])} MiB / "
            f"{fmt_mib(nc['tiled_mib'])} MiB) | ≥ 50 | {mem_ratio:.0f} |",
            f"| naive / tiled peak memory, causal ({fmt_mib(c['naive_mib'])} MiB / "
            f"{fmt_mib(c['tiled_mib'])} MiB) | ≥ 50 | {mem_ratio_c:.0f} |",
            f"| SDPA / matmul GFLOP/s, non-causal ({nc['sdpa_gflops']:.0f} / "
            f"{nc['matmul_gflops']:.0f}) | reported | {nc['sdpa_of_matmul']:.2f} |",
            f"| SDPA / matmul GFLOP/s, causal ({c['sdpa_gflops']:.0f} / "
            f"{c['matmul_gflops']:.0f}) | reported | {c['sdpa_of_matmul']:.2f} |",
            "",
            "Per-round tiled/SDPA ratios, non-causal: "
            + ", ".join(f"{r:.2f}" for r in nc["ratios"])
            + "; causal: " + ", ".join(f"{r:.2f}" for r in c["ratios"]) + ".",
            "",
        ]
    lines += [
        "## All sizes",
        "",
        "| T | causal | implementation | time (ms) | GFLOP/s | of matmul | peak memory (MiB) "
        "| naive score matrix by formula (MiB) |",
        "|---:|:---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        formula = naive_score_bytes(B, H, r["T"], r["T"]) / 2**20
        lines.append(
            f"| {r['T']} | {'yes' if r['causal'] else 'no'} | {r['impl']} | {r['ms']:.2f} "
            f"| {r['gflops']:.1f} | {r['of_matmul']:.2f} | {fmt_mib(r['peak_mib'])} "
            f"| {formula:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default benchmarks/results-<device>.md)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = pick_device()
    plan = "quick" if args.quick else ("cpu" if device.type == "cpu" else "gpu")
    info = machine_info(device)
    print("device:", device.type, "|", info["cpu"], "|", info["gpu"], flush=True)
    t0 = time.perf_counter()
    rows, targets = run(device, plan, args.block_size)
    seconds = time.perf_counter() - t0
    out = args.out or ROOT / "benchmarks" / f"results-{device.type}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(device, rows, targets, info, args.block_size, seconds)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
