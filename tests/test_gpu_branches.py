"""GPU-only and MPS-only code runs on a CPU machine too. Notebook 05: each test execs one of the
notebook's own cells on the data such a device produces (GPU-shaped results, a device without
float64) or in the order a learner may re-run them, and fails on the cell's old version.
tools/bench.py --flex, whose GPU plan reaches T = 16384, keeps its float64 reference within a
16 GB GPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shared.benchmark import attention_flops, gflops
from shared.plotting import print_table

NB05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_attention_on_the_gpu.ipynb"


def _cell(marker: str) -> str:
    cells = json.loads(NB05.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    found = [s for s in sources if marker in s]
    assert len(found) == 1, f"expected one code cell containing {marker!r}, found {len(found)}"
    return found[0]


def test_section8_table_prints_gpu_and_cpu_rows(capsys):
    names = ["NumPy reference", "naive PyTorch", "SDPA", "tiled loop (eager)"]
    gpu_lengths = [256, 512, 1024, 2048, 4096, 8192]
    dtypes = [torch.float32, torch.float16]
    scope = {
        "ON_GPU": True,
        "device": torch.device("cuda"),
        "names": names,
        "results": {(dt, T): {n: 1.0 + i for i, n in enumerate(names)} for dt in dtypes for T in gpu_lengths},
        "cpu_results": {T: {f"{n} (CPU)": 2.0 for n in names[:3]} for T in gpu_lengths if T <= 2048},
        "torch": torch,
        "TIMED_DTYPES": dtypes,
        "LENGTHS": gpu_lengths,
        "T_last": gpu_lengths[-1],
        "B": 1, "H": 8, "HEAD_DIM": 64,
        "gflops": gflops,
        "attention_flops": attention_flops,
        "print_table": print_table,
    }
    exec(compile(_cell("if cpu_results:"), "nb05-table", "exec"), scope)  # noqa: S102 - the notebook's own cell
    out = capsys.readouterr().out.splitlines()
    table_rows = [line for line in out if line.split()[:1] in (["float32"], ["float16"]) and line.split()[1].isdigit()]
    assert len(table_rows) == len(dtypes) * len(gpu_lengths) + 4  # every GPU row, and the CPU's float32 rows up to 2048
    assert any("naive PyTorch (CPU)" in line for line in out)
    growth = [line.split() for line in out if line.startswith("x, ")]
    assert [row[1] for row in growth] == ["float32", "float16"]
    assert all(row[2:] == ["1.0"] * len(names) for row in growth)  # every implementation, naive attention included


# --------------------------------------------------------------------------------------------
# tools/bench.py --flex on a GPU: the float64 reference of the error column
# --------------------------------------------------------------------------------------------
def test_flex_bench_reference_equals_whole_sdpa_and_stays_small_under_the_math_backend():
    """No fused SDPA kernel takes float64, so on CUDA the reference runs the math backend, which
    holds the whole (B, H, T, T) score matrix: 16 GiB at the GPU plan's T = 16384, more than a T4
    has. Forced onto the math backend here, the chunked reference gives the same numbers as the
    whole call and holds a fraction of its memory."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from shared import flex
    from shared.benchmark import cpu_peak_memory, naive_score_bytes
    from tools import bench

    T, rows = 512, 32
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 8, T, 16, generator=gen, dtype=torch.float16) for _ in range(3))
    dense = flex.dense_mask(flex.sliding_window(100), T)
    whole_scores = naive_score_bytes(1, 8, T, T, torch.float64)
    with sdpa_kernel([SDPBackend.MATH]):
        whole = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            Q.double(), K.double(), V.double(), attn_mask=dense)
        chunked = lambda: bench.float64_reference(Q, K, V, dense, rows=rows)  # noqa: E731
        torch.testing.assert_close(chunked(), whole(), rtol=0, atol=1e-12)
        assert cpu_peak_memory(whole) >= whole_scores  # what the old line held
        assert cpu_peak_memory(chunked) < whole_scores / 2


def test_flex_bench_reference_chunks_fit_a_16_gb_gpu_at_the_gpu_plans_longest_length(monkeypatch):
    """At the GPU plan's longest T, every SDPA call of the reference sees at most
    REFERENCE_CHUNK_ELEMENTS scores (256 MiB in float64), and the chunks cover every query once.
    SDPA is replaced by a recorder: the shapes are what matters, not 550 GFLOP of float64."""
    from tools import bench

    T = max(bench.FLEX_PLANS["gpu"].lengths)
    calls = []

    def recorder(q, k, v, attn_mask=None):
        assert q.dtype == k.dtype == v.dtype == torch.float64
        assert attn_mask.shape == (q.shape[-2], k.shape[-2])
        calls.append(q.shape[-2])
        return torch.zeros(q.shape, dtype=torch.float64)

    monkeypatch.setattr(bench.F, "scaled_dot_product_attention", recorder)
    Q = K = V = torch.zeros(bench.B, bench.H, T, 1, dtype=torch.float16).expand(-1, -1, -1, bench.HEAD_DIM)
    mask = torch.ones(1, 1, dtype=torch.bool).expand(T, T)
    out = bench.float64_reference(Q, K, V, mask)
    assert out.shape == (bench.B, bench.H, T, bench.HEAD_DIM)
    assert sum(calls) == T
    assert max(calls) * bench.B * bench.H * T <= bench.REFERENCE_CHUNK_ELEMENTS
    assert bench.REFERENCE_CHUNK_ELEMENTS * 8 * 2 < 2**30  # scores + softmax in float64: under 1 GiB


class _NoFloat64OnDevice(torch.overrides.TorchFunctionMode):
    """Apple's MPS has no float64: like it, refuse every `.to(float64)` of a tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and torch.float64 in (*args[1:], kwargs.get("dtype")):
            raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64")
        return func(*args, **kwargs)


def test_section1_moves_data_without_float64_on_the_device(capsys):
    """Section 1's `.to` demonstration runs on MPS, which has no float64 (the old cell asked for it)."""
    scope = {"torch": torch, "device": torch.device("cpu")}
    with _NoFloat64OnDevice():
        exec(compile(_cell("X.to(device) is X"), "nb05-devices", "exec"), scope)  # noqa: S102
    out = capsys.readouterr().out
    assert "a new dtype needs a copy): False" in out


def test_roofline_figure_unchanged_after_section10_ran():
    """Re-running section 5's roofline cell must draw the same fused pass: it once shared a global
    `nbytes` with section 11's cell (since removed), and a re-run plotted FlashAttention-2's bytes as
    the fused pass's."""
    from shared.benchmark import attention_bytes, attention_flops

    drawn = []

    class _Plt:
        @staticmethod
        def show():
            pass

    scope = {"torch": torch, "math": __import__("math"), "B": 1, "H": 8, "HEAD_DIM": 64, "attention_flops": attention_flops,
             "attention_bytes": attention_bytes, "plt": _Plt, "plot_roofline": lambda roofs, kernels, title: drawn.append(kernels),
             "print_table": print_table}
    for marker in ("def unfused_kernels", "SHORT = {", "SHORT = {"):  # section 5's table and roofline cells, then the figure again
        exec(compile(_cell(marker), "nb05-roofline", "exec"), scope)  # noqa: S102
    assert len(drawn) == 2
    assert drawn[1] == drawn[0]
    assert drawn[0]["fused, one pass"] == 2048.0  # 4 T^2 d FLOPs over 4 T d float16 elements: T / 2
