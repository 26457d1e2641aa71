"""The GPU measurements committed for learners without a GPU (data/gpu/*.json, drawn by notebook 05)
and the script that records them (tools/record_gpu.py), checked against formulas, not against
themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import record_gpu

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "data" / "gpu").glob("*.json"))
MIB = 2**20


def test_there_is_a_record():
    assert RECORDS, "data/gpu/ holds no recorded GPU; notebook 05 draws one"


def test_the_script_runs_and_writes_every_field(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    out = tmp_path / "cpu.json"
    assert record_gpu.main(["--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert set(data) == {"meta", "forward_ms", "forward_peak_mib", "train_peak_mib", "timing_ways_ms",
                         "fixed_cost_us", "backends", "operations"}
    assert set(data["forward_ms"]) == {"float32", "float16", "bfloat16"}
    for rows in data["forward_ms"].values():
        assert set(rows) == {"64", "128"}
        for times in rows.values():
            assert set(times) == {"naive PyTorch", "SDPA", "tiled loop (eager)"}
            assert all(ms > 0 for ms in times.values())
    for dtype in ("float32", "float16", "bfloat16"):
        ops = data["operations"][dtype]
        assert ops["SDPA"] == 1 and ops["tiled loop (eager)"] > ops["naive PyTorch"] > 1
    # half precision: each tile also converts its K and V blocks to float32 (shared/flash.py)
    tiles = (128 // record_gpu.TILE + (128 % record_gpu.TILE > 0)) ** 2
    assert data["operations"]["float16"]["tiled loop (eager)"] - data["operations"]["float32"][
        "tiled loop (eager)"] >= 2 * tiles


def test_the_script_refuses_a_cpu_without_quick(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    with pytest.raises(SystemExit, match="measures a CUDA GPU; pick_device\\(\\) found cpu"):
        record_gpu.main([])


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_a_record_agrees_with_the_formulas(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data["meta"]
    B, H = meta["B"], meta["H"]
    lengths = [int(T) for T in data["forward_ms"]["float32"]]
    assert lengths == sorted(lengths) and len(lengths) >= 4
    for dtype, rows in data["forward_ms"].items():
        assert [int(T) for T in rows] == lengths, dtype
        for T, times in rows.items():
            assert {"naive PyTorch", "SDPA"} <= set(times) and all(ms > 0 for ms in times.values())
            assert ("tiled loop (eager)" in times) == (int(T) <= 8192), (dtype, T)
    for T, peaks in data["forward_peak_mib"].items():
        score_mib = B * H * int(T) ** 2 * 2 / MIB  # one float16 score matrix
        # naive attention's forward peak: three score-sized buffers (notebook 05, section 5)
        assert peaks["naive PyTorch"] == pytest.approx(3 * score_mib, rel=0.01), T
        # SDPA holds its output, B * H * T * d float16, and no score matrix
        assert peaks["SDPA"] == pytest.approx(B * H * int(T) * meta["head_dim"] * 2 / MIB, rel=0.01), T
    ways = data["timing_ways_ms"]
    assert ways["bare clock"] < ways["time_fn"] / 10  # the unsynchronised clock sees only launches
    assert 1 < data["fixed_cost_us"] < 1000
    for dtype, backend in data["backends"].items():
        assert backend["default ran"] in backend["forced_ms"], dtype
    assert all(ops["SDPA"] == 1 for key, ops in data["operations"].items() if key != "T")
    assert meta["memory_mib"] > max(peaks["naive PyTorch"] for peaks in data["forward_peak_mib"].values())


def test_the_second_h200_run_matches_the_notebook_that_printed_it():
    # data/gpu/other_runs/ holds numbers copied from an executed notebook's printed output: parse
    # that output again and compare, so a typo or an edit to either side fails here
    import re

    run = json.loads((ROOT / "data" / "gpu" / "other_runs" / "nvidia_h200_second_run.json").read_text(encoding="utf-8"))
    nb = json.loads((ROOT / run["meta"]["source"]).read_text(encoding="utf-8"))
    printed = "\n".join("".join(out.get("text", "")) for cell in nb["cells"] if cell["cell_type"] == "code"
                        for out in cell.get("outputs", []))
    fixed = re.search(r"fixed cost per call: \(4-D loop - one batched call\) / 255 = ([\d.]+) µs", printed)
    assert fixed and float(fixed.group(1)) == run["fixed_cost_us"]
    rows = re.findall(r"^(float32|float16|bfloat16)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", printed, re.MULTILINE)
    table = {}
    for dtype, T, naive, sdpa, tiled in rows:
        table.setdefault(dtype, {}).setdefault(T, {"naive PyTorch": float(naive), "SDPA": float(sdpa),
                                                   "tiled loop (eager)": float(tiled)})
    assert run["forward_ms"] == table
    assert [int(T) for T in run["forward_ms"]["float16"]] == [512, 1024, 2048, 4096, 8192]
