"""Record notebook 05's measurements on a GPU, for learners without one: ``data/gpu/<gpu>.json``.

Notebook 05 measures on whatever device it runs on; on a CPU it cannot show what a GPU does. This
script measures, on the GPU :func:`shared.benchmark.pick_device` picks, the numbers 05's section
10, "The same measurements on an H200", draws: B = 1, H = 8, head_dim = 64, not causal.

* ``forward_ms``: time per call of naive PyTorch (``shared.modules.naive_attention``), SDPA and the
  course's eager tile loop (``shared.flash.tiled_attention``, blocks of 256; up to T = 8192), in
  float32, float16 and bfloat16, T = 512 ... 16384 (``shared.benchmark.best_times_ms``: candidates
  in turns, each keeping its fastest block).
* ``forward_peak_mib`` and ``train_peak_mib``: peak memory of a forward call and of a forward +
  backward step (``shared.benchmark.peak_memory``: ``torch.cuda.max_memory_allocated``), naive and
  SDPA, float16, inputs not counted.
* ``timing_ways_ms``: SDPA, float32, T = 8192, timed with a bare clock (no synchronisation) and
  synchronised (``shared.benchmark.timing_ways_ms``).
* ``fixed_cost_us``: notebook 05's section 4, 256 tiny sequences (H = 1, T = 8, d = 8) in a loop of
  4-D calls against one batched call: (loop - batched) / 255.
* ``backends``: at T = 4096, for float32 and float16, the kernel SDPA's default call ran (the
  profiler's operator names) and each backend's time when forced.
* ``operations``: PyTorch operations per call (``shared.benchmark.operation_count``) of the tile
  loop, naive attention and SDPA at T = 8192, per dtype, to divide the loop's time by.
* ``meta``: the GPU, its memory (``torch.cuda.get_device_properties``), the versions, the date.

    python -m tools.record_gpu            # on a CUDA machine -> data/gpu/<gpu name>.json
    python -m tools.record_gpu --quick    # tiny sizes on any device, to try the script itself
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from shared.benchmark import (
    best_times_ms,
    machine_info,
    operation_count,
    peak_memory,
    pick_device,
    sdpa_backend_calls,
    sdpa_kernel_used,
    timing_ways_ms,
)
from shared.flash import tiled_attention
from shared.modules import naive_attention

ROOT = Path(__file__).resolve().parent.parent
B, H, HEAD_DIM, TILE = 1, 8, 64, 256
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def inputs(T: int, device, dtype, requires_grad: bool = False):
    gen = torch.Generator().manual_seed(T)
    return [torch.randn(B, H, T, HEAD_DIM, generator=gen).to(device, dtype)
            .requires_grad_(requires_grad) for _ in range(3)]


def forward_fns(Q, K, V, tiled: bool) -> dict:
    fns = {"naive PyTorch": lambda: naive_attention(Q, K, V),
           "SDPA": lambda: F.scaled_dot_product_attention(Q, K, V)}
    if tiled:
        fns["tiled loop (eager)"] = lambda: tiled_attention(Q, K, V, block_size=TILE)
    return fns


def train_steps(Q, K, V) -> dict:
    """One forward + backward call each, naive and SDPA (Q, K, V require grad)."""
    return {"naive PyTorch": lambda: naive_attention(Q, K, V)[0].sum().backward(),
            "SDPA": lambda: F.scaled_dot_product_attention(Q, K, V).sum().backward()}


def default_kernel(Q, K, V) -> str | None:
    ran = sdpa_kernel_used(lambda: F.scaled_dot_product_attention(Q, K, V))
    return ran[0][0] if ran else None


def record(device, lengths, tiled_max: int, detail_T: int, min_run_time: float) -> dict:
    out: dict = {"forward_ms": {}, "forward_peak_mib": {}, "train_peak_mib": {}}
    for name, dtype in DTYPES.items():
        out["forward_ms"][name] = rows = {}
        for T in lengths:
            Q, K, V = inputs(T, device, dtype)
            fns = forward_fns(Q, K, V, tiled=T <= tiled_max)
            for f in fns.values():  # one untimed call each: buffers allocated before timing
                f()
            rows[str(T)] = best_times_ms(fns, device, rounds=3, min_run_time=min_run_time)
            print(f"{name} T={T}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in rows[str(T)].items()),
                  file=sys.stderr, flush=True)
    for T in lengths:
        Q, K, V = inputs(T, device, torch.float16)
        out["forward_peak_mib"][str(T)] = {name: peak_memory(f, device) / 2**20
                                           for name, f in forward_fns(Q, K, V, tiled=False).items()}
        steps = train_steps(*inputs(T, device, torch.float16, requires_grad=True))
        out["train_peak_mib"][str(T)] = {name: peak_memory(step, device) / 2**20
                                         for name, step in steps.items()}
    Q, K, V = inputs(detail_T * 2, device, torch.float32)
    sdpa = forward_fns(Q, K, V, tiled=False)["SDPA"]
    out["timing_ways_ms"] = {"T": detail_T * 2, "dtype": "float32", **timing_ways_ms(sdpa, device)}
    gen = torch.Generator().manual_seed(3)
    Qs, Ks, Vs = (torch.randn(256, 1, 8, 8, generator=gen).to(device) for _ in range(3))
    slices = [(Qs[i:i + 1], Ks[i:i + 1], Vs[i:i + 1]) for i in range(256)]
    loop_ms = best_times_ms({
        "loop": lambda: torch.cat([F.scaled_dot_product_attention(q, k, v) for q, k, v in slices]),
        "batched": lambda: F.scaled_dot_product_attention(Qs, Ks, Vs)}, device, rounds=3)
    out["fixed_cost_us"] = 1e3 * (loop_ms["loop"] - loop_ms["batched"]) / 255
    out["backends"] = {}
    for name in ("float32", "float16"):
        Q, K, V = inputs(detail_T, device, DTYPES[name])
        forced = best_times_ms(sdpa_backend_calls(Q, K, V), device, 3, min_run_time)
        out["backends"][name] = {"T": detail_T, "default ran": default_kernel(Q, K, V),
                                 "forced_ms": forced}
    T_ops = min(tiled_max, lengths[-1])
    out["operations"] = {"T": T_ops}
    for name, dtype in DTYPES.items():
        Q, K, V = inputs(T_ops, device, dtype)
        fns = forward_fns(Q, K, V, tiled=True)
        out["operations"][name] = {call: operation_count(f) for call, f in fns.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--out", type=Path, default=None, help="default: data/gpu/<gpu name>.json")
    args = parser.parse_args(argv)
    device = pick_device()
    if device.type != "cuda" and not args.quick:
        raise SystemExit(f"record_gpu measures a CUDA GPU; pick_device() found {device.type}")
    start = time.perf_counter()
    if args.quick:
        data = record(device, (64, 128), tiled_max=128, detail_T=64, min_run_time=0.01)
    else:
        data = record(device, (512, 1024, 2048, 4096, 8192, 16384), tiled_max=8192, detail_T=4096,
                      min_run_time=0.2)
    info = machine_info(device)
    cuda = device.type == "cuda"
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    meta = {"gpu": info["gpu"], "memory_mib": memory and memory / 2**20, "torch": info["torch"],
            "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat(), "written by": "python -m tools.record_gpu",
            "B": B, "H": H, "head_dim": HEAD_DIM, "tile": TILE,
            "seconds": round(time.perf_counter() - start, 1)}
    slug = re.sub(r"[^a-z0-9]+", "_", info["gpu"].lower()).strip("_") or device.type
    out = args.out or ROOT / "data" / "gpu" / f"{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, **data}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} in {meta['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
