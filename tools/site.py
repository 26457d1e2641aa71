"""Build the course's book site with Jupyter Book 1.x (``make html``): a sidebar of contents (the
core, beyond the core, solutions), full-text search, Colab/Binder launch buttons and an .ipynb
download on every page, the stored outputs and figures (nothing is executed), and math typeset by a
MathJax 3 copy that ships with the site (``sphinx-mathjax-offline``), so it reads offline.

The book is staged in a temporary folder that mirrors the repository (``notebooks/...``), so launch
buttons point at the right files on GitHub. Staging also

* writes ``_config.yml`` and ``_toc.yml`` from this module (the GitHub location comes from
  ``[tool.course]`` in ``pyproject.toml``, like the notebooks' badges);
* turns each figure's alt text (stamped into its output metadata by ``tools/course.py``) into the
  image's ``alt`` attribute;
* points links to course files outside ``notebooks/`` (``../shared/flash.py``) at GitHub.

Its packages are pinned in ``requirements-site.txt`` and live in their own ``.venv-site``, so the
learner's environment stays lean and the kernel's pins are untouched.

    .venv-site/bin/python -m tools.site --out site        # what `make html` runs
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tools import course

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SITE_TITLE = "Attention, executable"
SITE_VENV = ROOT / ".venv-site"
MARKER = ".built-by-tools-site"  # build() only ever replaces a folder holding this file
CORE = ("01", "02", "03", "04", "05")

INTRO = """\
# {title}

An executable course on the attention mechanism: numbered Jupyter notebooks that take you from
dot products between six toy word vectors, through trainable, causal and multi-head attention,
to attention on the GPU, the backward pass, and what trained models do with it.

Every number on these pages was printed by the notebook itself, every implementation is checked
against PyTorch's own, and the whole course runs offline on a laptop CPU in about a minute.

**Read here, or run it.** Each page has a launch button (the rocket, top right) that opens the
notebook in Colab or Binder, and a download button for the `.ipynb` file. To run it on your own
machine:

```bash
git clone https://github.com/{github}.git
cd {name}
make lab     # creates .venv with the pinned packages, then opens JupyterLab
```

Start with [01 · Simplified self-attention](notebooks/{first}). The five core notebooks (01–05)
build attention from scratch; the notebooks beyond the core use it. Each ends with exercises that
check themselves; worked solutions are listed last.
"""


def course_notebooks(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """The numbered notebooks in order, then the solutions (if any) in order."""
    numbered = sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    solutions = sorted((notebooks_dir / "solutions").glob("*.ipynb"))
    return numbered + solutions


def github_url(repo_path: str) -> str:
    cfg = course.config()
    return f"https://github.com/{cfg['github']}/blob/{cfg['branch']}/{repo_path}"


def toc(notebooks: list[Path], notebooks_dir: Path) -> str:
    """``_toc.yml``: the intro page, then one part each for the core, beyond it, the solutions."""

    def entry(p: Path) -> str:
        rel = p.relative_to(notebooks_dir.parent).with_suffix("").as_posix()
        return f"      - file: {rel}\n"

    numbered = [p for p in notebooks if p.parent == notebooks_dir]
    parts = [
        ("The core", [p for p in numbered if p.name[:2] in CORE]),
        ("Beyond the core", [p for p in numbered if p.name[:2] not in CORE]),
        ("Solutions", [p for p in notebooks if p.parent != notebooks_dir]),
    ]
    text = "format: jb-book\nroot: intro\nparts:\n"
    for caption, pages in parts:
        if pages:
            text += f"  - caption: {caption}\n    chapters:\n" + "".join(map(entry, pages))
    return text


def config_yml() -> str:
    """``_config.yml``: no execution, launch buttons, search, offline MathJax."""
    cfg = course.config()
    return f"""\
title: "{SITE_TITLE}"
author: The course's authors
copyright: "2026"
only_build_toc_files: true
execute:
  execute_notebooks: "off"
repository:
  url: https://github.com/{cfg["github"]}
  branch: {cfg["branch"]}
launch_buttons:
  notebook_interface: jupyterlab
  binderhub_url: https://mybinder.org
  colab_url: https://colab.research.google.com
html:
  use_repository_button: true
  use_download_button: true
  home_page_in_navbar: true
parse:
  myst_enable_extensions: [dollarmath, amsmath, colon_fence]
sphinx:
  extra_extensions: [sphinx-mathjax-offline]
  config:
    html_show_sphinx: false
    nb_ipywidgets_js: {{}}
    suppress_warnings: [myst.header, mystnb.unknown_mime_type]
"""


def _link_outside(url: str, src_dir: Path, notebooks_dir: Path) -> str | None:
    """The GitHub URL for a relative link to a course file outside ``notebooks/``, else None."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("#", "/", "data:")) or not parts.path:
        return None
    target = (src_dir / unquote(parts.path)).resolve()
    course_root = notebooks_dir.resolve().parent
    if target.is_relative_to(notebooks_dir.resolve()) or not target.is_relative_to(course_root):
        return None
    if not target.exists():
        return None
    frag = f"#{parts.fragment}" if parts.fragment else ""
    return github_url(target.relative_to(course_root).as_posix()) + frag


def stage_notebook(src: Path, dest: Path, notebooks_dir: Path) -> None:
    """Copy one notebook into the book: alt text onto its figures, outside links to GitHub."""
    nb = json.loads(src.read_text(encoding="utf-8"))
    md_link = re.compile(r"(\]\()([^)\s]+)(\))")
    # The page's launch button replaces the Colab badge (an image from the network); the setup cell
    # is folded away (sphinx-togglebutton) instead of collapsed, so its note goes too.
    nb["cells"] = [c for c in nb["cells"]
                   if course.SETUP_NOTE_TAG not in c.get("metadata", {}).get("tags", [])]
    setup = next((c for c in nb["cells"] if c["cell_type"] == "code"), None)
    if setup is not None:
        setup["metadata"]["tags"] = [*setup["metadata"].get("tags", []), "hide-input"]
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            source = course.BADGE_RE.sub("", source).lstrip("\n")

            def fix(m: re.Match) -> str:
                new = _link_outside(m.group(2), src.parent, notebooks_dir)
                return m.group(1) + new + m.group(3) if new else m.group(0)

            cell["source"] = md_link.sub(fix, source)
        elif cell["cell_type"] == "code":
            alts = [o.get("metadata", {}).get("image/png", {}).get("alt")
                    for o in course.image_outputs(cell)]
            alts = list(dict.fromkeys(a for a in alts if a))  # in order, once each
            if alts:
                cell["metadata"].setdefault("mystnb", {})["image"] = {"alt": " ".join(alts)}
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")


def title_of(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            m = re.search(r"^#\s+(.+?)\s*$", "".join(cell["source"]), flags=re.M)
            if m:
                return re.sub(r"[*_`]", "", m.group(1))
    return path.stem


def stage(book: Path, notebooks: list[Path], notebooks_dir: Path = NOTEBOOKS) -> None:
    """Write the book's source (notebooks, intro page, config, table of contents) to ``book``."""
    cfg = course.config()
    for nb in notebooks:
        stage_notebook(nb, book / nb.relative_to(notebooks_dir.parent), notebooks_dir)
    first = next((p for p in notebooks if p.parent == notebooks_dir), notebooks[0])
    (book / "intro.md").write_text(INTRO.format(
        title=SITE_TITLE, github=cfg["github"], name=cfg["github"].split("/")[1],
        first=first.relative_to(notebooks_dir).as_posix()), encoding="utf-8")
    (book / "_config.yml").write_text(config_yml(), encoding="utf-8")
    (book / "_toc.yml").write_text(toc(notebooks, notebooks_dir), encoding="utf-8")


def build(out: Path, notebooks: list[Path] | None = None,
          notebooks_dir: Path = NOTEBOOKS) -> Path:
    """Stage the book, build it with Jupyter Book (warnings are errors), and copy the HTML to
    ``out``. Returns ``out``."""
    notebooks = course_notebooks(notebooks_dir) if notebooks is None else notebooks
    if not notebooks:
        raise ValueError(f"no notebooks found under {notebooks_dir}")
    if out.exists():
        if not (out / MARKER).exists():
            raise FileExistsError(f"{out} exists and was not built by tools/site.py; "
                                  "not replacing it")
        shutil.rmtree(out)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    if not jupyter_book.exists():
        jupyter_book = SITE_VENV / "bin" / "jupyter-book"
    if not jupyter_book.exists():
        raise FileNotFoundError("Jupyter Book is not installed: run `make site-venv` "
                                "(or `make html`)")
    with tempfile.TemporaryDirectory(prefix="book-") as tmp:
        book = Path(tmp) / "book"
        stage(book, notebooks, notebooks_dir)
        done = subprocess.run([str(jupyter_book), "build", str(book), "--builder", "html",
                               "--warningiserror", "--keep-going", "--quiet"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"jupyter-book build failed:\n{done.stdout[-4000:]}\n"
                               f"{done.stderr[-4000:]}")
        shutil.copytree(book / "_build" / "html", out)
    (out / MARKER).write_text("built by tools/site.py (make html)\n", encoding="utf-8")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS,
                        help="the notebooks folder (default: the course's)")
    args = parser.parse_args(argv)
    notebooks = course_notebooks(args.notebooks)
    build(args.out, notebooks, args.notebooks)
    print(f"site written to {args.out}/index.html ({len(notebooks)} notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
