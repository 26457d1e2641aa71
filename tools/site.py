"""Render the course into a static HTML site for readers without Jupyter (``make html``).

Every numbered notebook (``notebooks/NN_*.ipynb``, in order), then the solutions
(``notebooks/solutions/*.ipynb``) if there are any, is rendered with its *stored* outputs by
nbconvert (nothing is executed). Figures are written as PNG files next to each page
(``<page>_files/``). Each page gets index / previous / next links. Links between notebooks
(``02_x.ipynb``) become links between pages (``02_x.html``); links to course files outside
``notebooks/`` point at the file on GitHub (the location configured in ``[tool.course]``).

    python -m tools.site --out site        # what `make html` runs
"""

from __future__ import annotations

import argparse
import html
import logging
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
from nbconvert import HTMLExporter

from tools import course

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SITE_TITLE = "Attention, executable"
MARKER = "<!-- built by tools/site.py -->"  # build() only ever replaces a folder holding this

NAV_CSS = """
<style>
nav.course-nav { display: flex; gap: 1.5em; align-items: baseline; flex-wrap: wrap;
  font-family: system-ui, sans-serif; font-size: 15px; padding: 0.6em 1em;
  border-bottom: 1px solid #ddd; background: #fafafa; }
nav.course-nav.bottom { border-top: 1px solid #ddd; border-bottom: none; margin-top: 2em; }
nav.course-nav a { text-decoration: none; }
nav.course-nav .spacer { flex: 1; }
</style>
"""


@dataclass(frozen=True)
class Page:
    source: Path  # the notebook
    rel: str  # page path inside the site, e.g. "01_x.html" or "solutions/01_x_solutions.html"
    title: str


def course_notebooks(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    """The numbered notebooks in order, then the solutions (if any) in order."""
    numbered = sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    solutions = sorted((notebooks_dir / "solutions").glob("*.ipynb"))
    return numbered + solutions


def notebook_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+?)\s*$", cell.source, flags=re.M)
            if m:
                return re.sub(r"[*_`]", "", m.group(1))
    return fallback


def relative(from_page: str, to_path: str) -> str:
    """URL of site path `to_path` as seen from the page at site path `from_page`."""
    depth = from_page.count("/")
    return "../" * depth + to_path


def github_url(repo_path: str) -> str:
    cfg = course.config()
    return f"https://github.com/{cfg['github']}/blob/{cfg['branch']}/{repo_path}"


def rewrite_links(body: str, page: Page, notebooks_dir: Path, out: Path) -> str:
    """Make the notebooks' relative links work on the site (see the module docstring)."""
    src_dir = page.source.parent
    course_root = notebooks_dir.resolve().parent

    def fix(m: re.Match) -> str:
        attr, quote, url = m.group(1), m.group(2), html.unescape(m.group(3))
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith(("#", "/", "data:")) or not parts.path:
            return m.group(0)
        target = (src_dir / unquote(parts.path)).resolve()
        frag = f"#{parts.fragment}" if parts.fragment else ""
        try:
            inside = target.relative_to(notebooks_dir.resolve()).as_posix()
        except ValueError:
            inside = None
        if inside is not None and target.suffix == ".ipynb":
            new = relative(page.rel, inside[: -len(".ipynb")] + ".html") + frag
        elif inside is not None and target.is_file():
            (out / inside).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target, out / inside)  # e.g. an image a markdown cell shows
            new = relative(page.rel, inside) + frag
        elif inside is None and target.is_relative_to(course_root) and target.exists():
            new = github_url(target.relative_to(course_root).as_posix()) + frag
        else:
            return m.group(0)  # leave it; the site test reports it as broken
        return f"{attr}={quote}{html.escape(new, quote=True)}{quote}"

    return re.sub(r"\b(href|src)=([\"'])([^\"']*)\2", fix, body)


def nav(pages: list[Page], i: int, where: str) -> str:
    page = pages[i]
    links = [f'<a href="{relative(page.rel, "index.html")}">&#8962; All notebooks</a>']
    links.append('<span class="spacer"></span>')
    if i > 0:
        prev = pages[i - 1]
        title = html.escape(prev.title)
        links.append(f'<a rel="prev" href="{relative(page.rel, prev.rel)}">&larr; {title}</a>')
    if i + 1 < len(pages):
        nxt = pages[i + 1]
        title = html.escape(nxt.title)
        links.append(f'<a rel="next" href="{relative(page.rel, nxt.rel)}">{title} &rarr;</a>')
    return f'<nav class="course-nav {where}">' + "\n".join(links) + "</nav>"


def index_html(pages: list[Page]) -> str:
    def items(group: list[Page]) -> str:
        return "\n".join(f'<li><a href="{p.rel}">{html.escape(p.title)}</a></li>' for p in group)

    core = [p for p in pages if "/" not in p.rel]
    solutions = [p for p in pages if p.rel.startswith("solutions/")]
    cfg = course.config()
    parts = [
        "<!DOCTYPE html>",
        MARKER,
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(SITE_TITLE)}</title>",
        "<style>body { font-family: system-ui, sans-serif; max-width: 46em; margin: 2em auto;"
        " padding: 0 1em; line-height: 1.5; } li { margin: 0.3em 0; }</style>",
        "</head><body>",
        f"<h1>{html.escape(SITE_TITLE)}</h1>",
        "<p>The course notebooks with their stored outputs, to read without Jupyter. "
        "To run them, open them in JupyterLab, Colab or Binder: see "
        f'<a href="https://github.com/{cfg["github"]}">the repository</a>.</p>',
        '<h2>The series</h2>\n<ol class="series">',
        items(core),
        "</ol>",
    ]
    if solutions:
        parts += ['<h2>Solutions</h2>\n<ul class="solutions">', items(solutions), "</ul>"]
    parts.append("</body></html>\n")
    return "\n".join(parts)


class _QuietAltText(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Alternative text is missing" not in str(record.msg)


def build(notebooks: list[Path], out: Path, notebooks_dir: Path = NOTEBOOKS) -> list[Page]:
    """Render `notebooks` (in this order) into the folder `out`; return the pages written."""
    if out.exists() and any(out.iterdir()):
        if not (out / "index.html").is_file() or MARKER not in (out / "index.html").read_text():
            raise SystemExit(f"{out} is not empty and not a course site: refusing to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = [nbformat.read(p, as_version=4) for p in notebooks]
    pages = [
        Page(p, p.resolve().relative_to(notebooks_dir.resolve()).with_suffix(".html").as_posix(),
             notebook_title(nb, p.stem))
        for p, nb in zip(notebooks, loaded, strict=True)
    ]
    exporter = HTMLExporter(template_name="lab")
    if not any(isinstance(f, _QuietAltText) for f in exporter.log.filters):
        exporter.log.addFilter(_QuietAltText())  # we fill the alt text in ourselves below
    exporter.register_preprocessor(
        "nbconvert.preprocessors.ExtractOutputPreprocessor", enabled=True
    )
    for i, (page, nb) in enumerate(zip(pages, loaded, strict=True)):
        page_path = out / page.rel
        page_path.parent.mkdir(parents=True, exist_ok=True)
        stem = page_path.stem
        resources = {
            "metadata": {"name": page.title},
            "output_files_dir": f"{stem}_files",
            "unique_key": stem,
        }
        body, res = exporter.from_notebook_node(nb, resources=resources)
        for name, data in res.get("outputs", {}).items():
            (page_path.parent / name).parent.mkdir(parents=True, exist_ok=True)
            (page_path.parent / name).write_bytes(data)
        body = rewrite_links(body, page, notebooks_dir, out)
        body = body.replace(  # nbconvert's placeholder for outputs without alt text
            'alt="No description has been provided for this image"',
            f'alt="{html.escape(f"Figure from {page.title!r}", quote=True)}"',
        )
        body = body.replace("</head>", NAV_CSS + "</head>", 1)
        top, bottom = nav(pages, i, "top"), nav(pages, i, "bottom")
        body = re.sub(r"(<body[^>]*>)", lambda m, top=top: m.group(1) + top, body, count=1)
        body = body.replace("</body>", bottom + "</body>", 1)
        page_path.write_text(body, encoding="utf-8")
    (out / "index.html").write_text(index_html(pages), encoding="utf-8")
    return pages


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="output folder (replaced)")
    args = parser.parse_args(argv)
    notebooks = course_notebooks()
    if not notebooks:
        print("no notebooks found under notebooks/", file=sys.stderr)
        return 1
    pages = build(notebooks, args.out)
    print(f"wrote {len(pages)} pages and index.html to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
