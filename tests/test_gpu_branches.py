"""Notebook 05's GPU-only printing runs on a CPU machine too: the table cell of section 8, fed the
shapes of results a GPU run produces (lengths up to 8192 on the GPU, CPU references up to 2048),
must print every row without reaching for a length the CPU table does not have."""

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
