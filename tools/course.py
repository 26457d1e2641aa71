"""One template for every notebook's setup cell (collapsed, with a visible one-line note above it),
its "Open in Colab" badge, and its figures' alt text (from ``# alt:`` comments in the plotting cells).

The GitHub location lives in one place, ``[tool.course]`` in ``pyproject.toml``. A fork changes that
line and runs ``make stamp`` (``python -m tools.course``) to re-stamp every notebook; the hygiene
tests check that every notebook carries exactly what this module renders.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

BADGE_RE = re.compile(
    r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]"
    r"\(https://colab\.research\.google\.com/github/[^)]*\)"
)


def config() -> dict[str, str]:
    """``{"github": "owner/name", "branch": ...}`` from ``[tool.course]`` in pyproject.toml.

    Parsed with a regular expression so it also runs on Python 3.10 (no ``tomllib``)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[tool.course]", 1)[1].split("\n[", 1)[0]
    values = dict(re.findall(r'^(\w+)\s*=\s*"([^"]*)"', section, flags=re.M))
    return {"github": values["github"], "branch": values["branch"]}


def setup_cell_source() -> str:
    """The first code cell of every notebook: makes the repo's ``shared/`` package importable."""
    cfg = config()
    name = cfg["github"].split("/")[1]
    return f'''\
#@title Setup (identical in every notebook): makes the course's `shared/` package importable
# On Colab it first fetches the course; it installs nothing (Colab ships numpy, torch, matplotlib, seaborn).
import logging
import os
import sys
from pathlib import Path

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # a CUDA-toolkit notice, not ours

COURSE_GIT_URL = os.environ.get("COURSE_GIT_URL", "https://github.com/{cfg["github"]}.git")
try:
    import google.colab  # noqa: F401  (importable only on Colab)

    ROOT = Path("{name}")
    if not (ROOT / "shared").is_dir():
        import subprocess

        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", "{cfg["branch"]}", COURSE_GIT_URL, str(ROOT)], check=True)
except ImportError:  # JupyterLab or CI: the course root is the nearest folder above holding shared/
    ROOT = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "shared" / "attention.py").is_file()), None)
    if ROOT is None:
        raise RuntimeError("Run this notebook from inside the course folder (shared/ was not found above it).") from None
if str(ROOT.resolve()) not in sys.path:
    sys.path.insert(0, str(ROOT.resolve()))'''


SETUP_NOTE_TAG = "setup-note"
SETUP_NOTE = (
    "**Setup.** Run the next cell first. It makes the course's `shared/` helpers importable and, on "
    "Colab, fetches the course first; it installs nothing. Its code is hidden: click the dots in "
    "JupyterLab, or *Show code* on Colab, to read it."
)
# The setup cell is collapsed where learners open it: JupyterLab hides its source, Colab shows it as
# a form whose title is the cell's `#@title` line.
SETUP_METADATA = {"jupyter": {"source_hidden": True}, "cellView": "form"}
ALT_RE = re.compile(r"^\s*# alt: (.+?)\s*$", flags=re.M)


def alt_texts(source: str) -> list[str]:
    """The ``# alt: ...`` comment lines of a code cell, in order: one sentence per figure."""
    return ALT_RE.findall(source)


def image_outputs(cell: dict) -> list[dict]:
    return [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]


def stamp_alt_text(cell: dict) -> bool:
    """Copy a cell's ``# alt:`` sentences into its figures' output metadata (the k-th sentence to
    the k-th figure; a single sentence to every figure), where the site and nbconvert read them.
    Output metadata is not compared by nbval, so stamping needs no re-execution."""
    alts, images = alt_texts("".join(cell["source"])), image_outputs(cell)
    if not alts or not images:
        return False
    changed = False
    for k, out in enumerate(images):
        alt = alts[k] if k < len(alts) else alts[-1]
        meta = out.setdefault("metadata", {}).setdefault("image/png", {})
        if meta.get("alt") != alt:
            meta["alt"] = alt
            changed = True
    return changed


def colab_url(notebook: Path) -> str:
    cfg = config()
    rel = notebook.resolve().relative_to(ROOT).as_posix()
    return f"https://colab.research.google.com/github/{cfg['github']}/blob/{cfg['branch']}/{rel}"


def badge_markdown(notebook: Path) -> str:
    return (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(notebook)})"
    )


def notebook_paths() -> list[Path]:
    """Every course notebook, solutions included, in a stable order."""
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def stamp(path: Path) -> bool:
    """Rewrite the badge and the setup cell of one notebook; return True if it changed."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = nb["cells"]
    changed = False
    first_md = next(c for c in cells if c["cell_type"] == "markdown")
    md = "".join(first_md["source"])
    new_md = BADGE_RE.sub(badge_markdown(path), md) if BADGE_RE.search(md) else (
        badge_markdown(path) + "\n\n" + md
    )
    if new_md != md:
        first_md["source"] = new_md.splitlines(keepends=True)
        changed = True
    first_code = next(c for c in cells if c["cell_type"] == "code")
    if "".join(first_code["source"]) != setup_cell_source():
        first_code["source"] = setup_cell_source().splitlines(keepends=True)
        changed = True
    for key, value in SETUP_METADATA.items():
        if first_code["metadata"].get(key) != value:
            first_code["metadata"][key] = value
            changed = True
    at = cells.index(first_code)
    before = cells[at - 1] if at > 0 else None
    is_note = (before is not None and before["cell_type"] == "markdown"
               and SETUP_NOTE_TAG in before.get("metadata", {}).get("tags", []))
    if not is_note:
        cells.insert(at, {"cell_type": "markdown", "id": SETUP_NOTE_TAG,
                          "metadata": {"tags": [SETUP_NOTE_TAG]}, "source": [SETUP_NOTE]})
        changed = True
    elif "".join(before["source"]) != SETUP_NOTE:
        before["source"] = [SETUP_NOTE]
        changed = True
    for cell in cells:
        if cell["cell_type"] == "code":
            changed |= stamp_alt_text(cell)
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or notebook_paths()
    for p in paths:
        if stamp(p):
            print(f"stamped {p.resolve().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
