"""Every committed notebook is clean: executed top to bottom, with outputs, stamped, small, private."""

from __future__ import annotations

import getpass
import json
import re
from pathlib import Path

import pytest

from tools.course import (
    BADGE_RE,
    SETUP_NOTE,
    alt_texts,
    badge_markdown,
    image_outputs,
    notebook_paths,
    setup_cell_source,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = notebook_paths()
NUMBERED = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]
IDS = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def src(cell: dict) -> str:
    return "".join(cell["source"])


def is_output_ignored(cell: dict) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return "NBVAL_IGNORE_OUTPUT" in src(cell) or "nbval-ignore-output" in tags


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_volatile_cells_are_tagged_not_commented(path):
    """A learner reads the code, not nbval's plumbing: volatile cells carry the `nbval-ignore-output` tag."""
    commented = [i for i, c in enumerate(code_cells(load(path))) if "NBVAL_IGNORE_OUTPUT" in src(c)]
    assert not commented, f"code cells {commented} use the `# NBVAL_IGNORE_OUTPUT` comment: use the cell tag instead"


def output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/"):
                parts.append("".join(value))
    return "\n".join(parts)


def test_the_core_series_is_there():
    names = [p.name[:3] for p in NUMBERED]
    assert names[:5] == ["01_", "02_", "03_", "04_", "05_"], names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_executed_in_order_with_outputs_and_no_errors(path):
    cells = code_cells(load(path))
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"execution counts are {counts}: re-run it top to bottom in a fresh kernel (make execute)"
    )
    assert sum(bool(c["outputs"]) for c in cells) >= len(cells) // 3, "stored outputs are missing"
    errors = [i for i, c in enumerate(cells) if any(o["output_type"] == "error" for o in c["outputs"])]
    assert not errors, f"stored error output in code cells {errors}"


def test_one_kernelspec_for_all():
    specs = {json.dumps(load(p)["metadata"].get("kernelspec"), sort_keys=True) for p in NOTEBOOKS}
    assert len(specs) == 1, specs
    assert json.loads(specs.pop())["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_code_cell_is_the_setup_cell(path):
    first = code_cells(load(path))[0]
    assert src(first) == setup_cell_source(), "setup cell differs from the template: run `make stamp`"
    assert not first["outputs"], "the setup cell should print nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_setup_cell_is_collapsed_under_a_visible_note(path):
    """Collapsed in JupyterLab (source_hidden) and on Colab (a form titled by its first line), with
    a one-line markdown note right above it saying what it does."""
    cells = load(path)["cells"]
    first = code_cells(load(path))[0]
    assert first["metadata"].get("jupyter", {}).get("source_hidden") is True, "run `make stamp`"
    assert first["metadata"].get("cellView") == "form", "run `make stamp`"
    assert src(first).startswith("#@title "), "Colab titles a form with its first line"
    at = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    note = cells[at - 1]
    assert note["cell_type"] == "markdown" and src(note) == SETUP_NOTE, "run `make stamp`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_figure_has_alt_text(path):
    """Each figure carries one sentence saying what it shows: a `# alt:` comment in its cell,
    stamped into the output's metadata (where the site and nbconvert read it)."""
    missing = []
    for i, cell in enumerate(load(path)["cells"]):
        for out in image_outputs(cell):
            alt = out.get("metadata", {}).get("image/png", {}).get("alt", "")
            if len(alt.split()) < 5 or alt not in alt_texts(src(cell)):
                missing.append(i)
    assert not missing, (f"figures without alt text in cells {missing}: add a `# alt: <one "
                         "sentence>` comment to the plotting cell, then run `make stamp`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_title_and_colab_badge_point_at_this_notebook(path):
    first_md = next(c for c in load(path)["cells"] if c["cell_type"] == "markdown")
    text = src(first_md)
    assert re.search(r"^# \S", text, flags=re.M), "the first markdown cell should hold a '# Title'"
    badges = BADGE_RE.findall(text)
    assert badges == [badge_markdown(path)], f"badge {badges} does not point at {path.name}"


@pytest.mark.parametrize("path", NUMBERED, ids=[p.name for p in NUMBERED])
def test_course_notebook_has_exercises_and_summary(path):
    headings = [
        line.strip()
        for c in load(path)["cells"]
        if c["cell_type"] == "markdown"
        for line in src(c).splitlines()
        if line.startswith("## ")
    ]
    assert any(h.lower().startswith("## exercises") for h in headings), headings
    assert any(h.lower().startswith("## summary") for h in headings), headings


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_at_most_ten_percent_of_code_cells_output_ignored(path):
    cells = code_cells(load(path))
    ignored = [i for i, c in enumerate(cells) if is_output_ignored(c)]
    assert len(ignored) <= 0.10 * len(cells), f"{len(ignored)} of {len(cells)} cells ignored: {ignored}"
    skipped = [i for i, c in enumerate(cells) if "NBVAL_SKIP" in src(c)]
    assert not skipped, f"cells {skipped} are skipped by nbval: run them instead"


PRIVATE = [
    re.compile(r"(?<![\w.])/(?:root|home|work|tmp|Users|opt|usr)/"),
    re.compile(r"[A-Za-z]:\\\\?Users"),
    re.compile(r"\bat 0x[0-9a-fA-F]{6,}"),
]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_absolute_paths_user_names_or_addresses_in_outputs(path):
    user = getpass.getuser()
    for i, cell in enumerate(code_cells(load(path))):
        text = output_text(cell)
        for pattern in PRIVATE:
            m = pattern.search(text)
            assert not m, f"code cell {i} output contains {m.group(0)!r}"
        if user not in ("root", "runner") and len(user) > 2:
            assert user not in text, f"code cell {i} output contains the user name"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_figures_are_png_not_svg(path):
    for i, cell in enumerate(code_cells(load(path))):
        for out in cell["outputs"]:
            assert "image/svg+xml" not in out.get("data", {}), f"code cell {i} stores an SVG"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_under_one_megabyte(path):
    size = path.stat().st_size
    assert size < 1_000_000, f"{path.name} is {size / 1e6:.2f} MB"
