"""Notebook 05's GPU-only and MPS-only paths run on a CPU machine too: each test execs one of the
notebook's own cells on the data such a device produces (GPU-shaped results, a device without
float64) or in the order a learner may re-run them, and fails on the cell's old version."""

from __future__ import annotations

import json
from pathlib import Path

import torch

NB05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_attention_on_the_gpu.ipynb"


def _cell(marker: str) -> str:
    cells = json.loads(NB05.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    found = [s for s in sources if marker in s]
    assert len(found) == 1, f"expected one code cell containing {marker!r}, found {len(found)}"
    return found[0]


def test_section8_table_prints_gpu_and_cpu_rows(capsys):
    names = ["NumPy reference", "naive PyTorch", "SDPA", "tiled (flash)"]
    gpu_lengths = [256, 512, 1024, 2048, 4096, 8192]
    dtypes = [torch.float32, torch.float16]
    scope = {
        "ON_GPU": True,
        "device": torch.device("cuda"),
        "names": names,
        "results": {(dt, T): {n: 1.0 + i for i, n in enumerate(names)} for dt in dtypes for T in gpu_lengths},
        "cpu_results": {T: {f"{n} (CPU)": 2.0 for n in names[:3]} for T in gpu_lengths if T <= 2048},
        "torch": torch,
    }
    exec(compile(_cell("if cpu_results:"), "nb05-table", "exec"), scope)  # noqa: S102 - the notebook's own cell
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith(("float32", "float16")) for line in out) == len(dtypes) * len(gpu_lengths) + 4
    assert any("naive PyTorch (CPU)" in line for line in out)


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
    """Re-running section 5's roofline cell after section 10's must draw the same fused pass: the two
    cells once shared a global `nbytes`, and the re-run plotted FlashAttention-2's bytes as the fused pass's."""
    from shared.benchmark import attention_bytes, attention_flops

    drawn = []

    class _Plt:
        @staticmethod
        def show():
            pass

    scope = {"torch": torch, "math": __import__("math"), "B": 1, "H": 8, "HEAD_DIM": 64, "attention_flops": attention_flops,
             "attention_bytes": attention_bytes, "plt": _Plt, "plot_roofline": lambda roofs, kernels, title: drawn.append(kernels)}
    for marker in ("def unfused_kernels", "def flash_bytes", "fa2_intensity =", "def flash_bytes"):  # 5, roofline, 10, roofline again
        exec(compile(_cell(marker), "nb05-roofline", "exec"), scope)  # noqa: S102
    assert len(drawn) == 2
    assert drawn[1] == drawn[0]
    assert drawn[0]["fused, one pass"] == 2048.0  # 4 T^2 d FLOPs over 4 T d float16 elements: T / 2
