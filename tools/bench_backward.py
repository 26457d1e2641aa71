"""Training attention: forward + backward of naive attention, SDPA and the course's flash autograd
function, timed and measured on the device :func:`shared.benchmark.pick_device` picks, written to
``benchmarks/results-backward-<device>.md``.

float32, B = 1, H = 8, head_dim = 64, causal and not; T = 1024, 2048, 4096 on a CPU, up to 16384
on a GPU. One *step* is
``torch.autograd.grad(attention(Q, K, V), (Q, K, V), dO)``: the forward pass, then the backward
pass to the gradients of Q, K and V.

* **time**: median over interleaved rounds (every candidate once per round, in turns, so a busy
  neighbour on a shared machine slows all of them alike) of ``shared.benchmark.time_fn``
  (``torch.utils.benchmark``, with the threads PyTorch uses);
* **peak**: the most bytes PyTorch's allocator held at once during the step beyond what existed
  before it (``shared.benchmark.peak_memory``: on a CPU the profiler's allocation events, on CUDA
  ``torch.cuda.max_memory_allocated``), gradients included, inputs and ``dO`` not;
* **saved**: the bytes autograd keeps from the forward pass for the backward one, inputs not
  counted (``shared.flash_backward.saved_tensor_bytes``).

    python -m tools.bench_backward            # the sizes above (several minutes on 2 cores)
    python -m tools.bench_backward --threads 1  # one torch thread (a shared, busy machine)
    python -m tools.bench_backward --quick    # tiny sizes, a smoke test of the script itself
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from shared.benchmark import interleaved_times, machine_info, peak_memory, pick_device
from shared.flash import DEFAULT_BLOCK_SIZE
from shared.flash_backward import flash_attention, saved_tensor_bytes
from shared.modules import naive_attention

ROOT = Path(__file__).resolve().parent.parent
B, H, HEAD_DIM = 1, 8, 64
LENGTHS = {"cpu": (1024, 2048, 4096), "gpu": (1024, 2048, 4096, 8192, 16384)}
CANDIDATES = ("naive", "SDPA", "flash")


def attention_fns(causal: bool) -> dict:
    return {
        "naive": lambda Q, K, V: naive_attention(Q, K, V, causal=causal)[0],
        "SDPA": lambda Q, K, V: F.scaled_dot_product_attention(Q, K, V, is_causal=causal),
        "flash": lambda Q, K, V: flash_attention(Q, K, V, causal=causal),
    }


def measure(T: int, causal: bool, rounds: int, min_run_time: float, device=None) -> dict:
    """``{name: {"seconds", "peak", "saved"}}`` for one length and mask (default device: CPU)."""
    device = torch.device(device or "cpu")
    gen = torch.Generator().manual_seed(T)
    Q, K, V = (torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device).requires_grad_()
               for _ in range(3))
    dO = torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device)
    results = {}
    steps = {}
    for name, attn in attention_fns(causal).items():
        def step(attn=attn):
            return torch.autograd.grad(attn(Q, K, V), (Q, K, V), dO)

        steps[name] = step
        results[name] = {
            "peak": peak_memory(step, device),
            "saved": saved_tensor_bytes(lambda attn=attn: attn(Q, K, V), exclude=(Q, K, V)),
        }
    times = interleaved_times(steps, device, rounds=rounds, min_run_time=min_run_time)
    for name, ts in times.items():
        results[name]["seconds"] = statistics.median(ts)
        results[name]["rounds"] = ts
    return results


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def ratio(r: float) -> str:
    """A memory ratio: ``0.04`` -> ``1/25``; ``0.91`` -> ``0.91``."""
    return f"1/{1 / r:.0f}" if r < 0.2 else f"{r:.2f}"


def threads_text() -> str:
    n = torch.get_num_threads()
    return f"{n} torch thread{'s' if n != 1 else ''}"


def render(all_results: dict, lengths, rounds: int, elapsed: float, device=None) -> str:
    device = torch.device(device or "cpu")
    where = machine_info(device)["gpu"] if device.type == "cuda" else device.type.upper()
    unit, scale = ("s", 1) if device.type == "cpu" else ("ms", 1e3)  # GPU steps: ms
    lines = [
        f"# Training attention: forward + backward on the {where}",
        "",
        "Written by `python -m tools.bench_backward`. float32, B = 1, H = 8, head_dim = 64.",
        "One step = forward + backward to dQ, dK, dV.",
        "naive = `shared.modules.naive_attention` under autograd;",
        "SDPA = `F.scaled_dot_product_attention` (its own fused backward);",
        f"flash = `shared.flash_backward.flash_attention` (block_size = {DEFAULT_BLOCK_SIZE}: the",
        "tiled forward saves O and L, the backward recomputes P tile by tile).",
        f"Time: median of {rounds} interleaved rounds of `torch.utils.benchmark` with",
        f"{threads_text()}. Peak: most bytes the {device.type.upper()} allocator held during",
        "the step beyond what existed before (CPU: profiler allocation events; CUDA:",
        "`torch.cuda.max_memory_allocated`), gradients included,",
        "inputs and dO not. Saved: what autograd keeps from the forward pass for the backward",
        "(inputs not counted)." + (" The machine is shared and noisy: expect ±20 % on times."
                                   if device.type == "cpu" else ""),
        "",
        f"Machine: {platform.machine()}, {threads_text()}, device {device.type}, "
        f"python {platform.python_version()}, torch {torch.__version__}. "
        f"Run took {elapsed / 60:.1f} min.",
        "",
    ]
    for causal in (False, True):
        lines += [
            f"## {'Causal' if causal else 'Not causal'}",
            "",
            f"| T | candidate | time ({unit}) | peak (MiB) | saved (MiB) | flash time / this | "
            "flash peak / this |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for T in lengths:
            res = all_results[(T, causal)]
            flash = res["flash"]
            for name in CANDIDATES:
                r = res[name]
                t_ratio = flash["seconds"] / r["seconds"]
                m_ratio = flash["peak"] / r["peak"]
                lines.append(
                    f"| {T} | {name} | {scale * r['seconds']:.3f} | {mib(r['peak'])} "
                    f"| {mib(r['saved'])} "
                    f"| {t_ratio:.2f} | {ratio(m_ratio)} |"
                )
        lines.append("")
    lines += [
        "## Summary: flash vs naive and vs SDPA",
        "",
        "| mask | T | peak: flash / naive | time: flash / naive | peak: flash / SDPA | "
        "time: flash / SDPA |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for causal in (False, True):
        for T in lengths:
            res = all_results[(T, causal)]
            f, n, s = res["flash"], res["naive"], res["SDPA"]
            lines.append(
                f"| {'causal' if causal else 'none'} | {T} | {ratio(f['peak'] / n['peak'])} | "
                f"{f['seconds'] / n['seconds']:.2f} | {ratio(f['peak'] / s['peak'])} | "
                f"{f['seconds'] / s['seconds']:.2f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: PyTorch's own choice); on a shared, "
                             "oversubscribed machine 1 thread avoids idle waits at every "
                             "parallel region, which penalise many small operations most")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: benchmarks/results-backward-<device>.md")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = pick_device()
    out = args.out or ROOT / "benchmarks" / f"results-backward-{device.type}.md"
    lengths = (64, 128) if args.quick else LENGTHS["cpu" if device.type == "cpu" else "gpu"]
    min_run_time = 0.01 if args.quick else 0.2
    start = time.perf_counter()
    all_results = {}
    for causal in (False, True):
        for T in lengths:
            all_results[(T, causal)] = res = measure(T, causal, args.rounds, min_run_time, device)
            print(f"T={T} causal={causal}: " + ", ".join(
                f"{n} {r['seconds']:.3f} s {mib(r['peak'])} MiB" for n, r in res.items()),
                file=sys.stderr, flush=True)
    text = render(all_results, lengths, args.rounds, time.perf_counter() - start, device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
