"""`make html`: the book site (Jupyter Book) has every notebook in the sidebar in series order,
search that finds them, launch buttons and an .ipynb download on every page, the stored figures
with their alt text, math from a local MathJax copy (nothing from the network), and no broken link.

The site is built once per state of the course (tests/site_build.py), with the site's own
environment (.venv-site, which `make test` creates first). What a reader sees in a browser (search results, typeset math,
decoded figures, with the network blocked) is checked in tests/test_ui.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from tests.site_build import built_site
from tools import course, site

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = site.course_notebooks()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Every (tag, attrs) of a page, and the text of its sidebar links."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if a.get("id"):
            self.ids.add(a["id"])

    def refs(self) -> list[tuple[str, str, str]]:
        return [(t, k, a[k]) for t, a in self.tags for k in ("href", "src") if k in a]


def parse(page: Path) -> Page:
    p = Page()
    p.feed(page.read_text(encoding="utf-8"))
    return p


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return not (parts.scheme or parts.netloc or url.startswith(("#", "data:", "mailto:")) or not url)


def broken_links(out: Path) -> list[str]:
    """`page: url` for every relative href/src in the site that does not resolve to a file in it."""
    broken = []
    pages = [p for p in sorted(out.rglob("*.html")) if "_static" not in p.relative_to(out).parts]
    for page in pages:  # (the theme's _static/ holds templates, not pages)
        for _tag, _attr, url in parse(page).refs():
            if not is_local(url):
                continue
            target = (page.parent / unquote(urlsplit(url).path)).resolve()
            if not (target.is_file() and target.is_relative_to(out.resolve())):
                broken.append(f"{page.relative_to(out)}: {url}")
    return broken


def page_of(out: Path, notebook: Path) -> Path:
    return out / notebook.relative_to(ROOT).with_suffix(".html")


@pytest.fixture(scope="module")
def built() -> Path:
    return built_site()


def test_the_sidebar_lists_every_notebook_in_series_order_in_three_parts(built):
    html = (built / "intro.html").read_text(encoding="utf-8")
    captions = re.findall(r'<p aria-level="2" class="caption" role="heading">'
                          r'<span class="caption-text">([^<]+)</span>', html)
    assert captions == ["The core", "Beyond the core", "Solutions"], captions
    nav = html.split('class="bd-sidebar-primary', 1)[1].split("</nav>", 1)[0]
    linked = re.findall(r'<a class="reference internal" href="([^"#]+)"', nav)
    expected = [nb.relative_to(ROOT).with_suffix(".html").as_posix() for nb in NOTEBOOKS]
    assert linked == expected


def test_every_page_has_colab_and_binder_launch_buttons_and_an_ipynb_download(built):
    cfg = course.config()
    for nb in NOTEBOOKS:
        rel = nb.relative_to(ROOT).as_posix()
        refs = [url for _, _, url in parse(page_of(built, nb)).refs()]
        colab = f"https://colab.research.google.com/github/{cfg['github']}/blob/{cfg['branch']}/{rel}"
        assert colab in refs, f"{rel}: no Colab launch button"
        binder = [u for u in refs if u.startswith(f"https://mybinder.org/v2/gh/{cfg['github']}/")]
        assert binder and binder[0].endswith(rel), f"{rel}: no Binder launch button"
        download = [u for u in refs if u.endswith("_sources/" + rel)]
        assert download, f"{rel}: no .ipynb download"
        source = (page_of(built, nb).parent / download[0]).resolve()
        assert json.loads(source.read_text(encoding="utf-8"))["cells"], f"{rel}: empty download"


def test_search_finds_softmax_in_notebook_01(built):
    text = (built / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1: text.rindex(")")])
    docs = index["docnames"]
    hits = []  # Sphinx's search looks words up in the text and in the headings
    for table in ("terms", "titleterms"):
        found = index[table].get("softmax", [])
        hits += found if isinstance(found, list) else [found]
    assert "notebooks/01_simplified_self_attention" in [docs[i] for i in hits]
    assert "notebooks/01_simplified_self_attention" in docs and "intro" in docs


def test_math_comes_from_the_site_itself(built):
    page = parse(page_of(built, NOTEBOOKS[0]))
    scripts = [a["src"] for t, a in page.tags if t == "script" and a.get("src")]
    mathjax = [s for s in scripts if "mathjax" in s.lower()]
    assert mathjax and all(is_local(s) for s in mathjax), mathjax
    assert (page_of(built, NOTEBOOKS[0]).parent / mathjax[0]).resolve().is_file()
    external = [s for s in scripts if not is_local(s)]
    styles = [a["href"] for t, a in page.tags if t == "link" and a.get("rel") == "stylesheet"]
    assert not external and all(is_local(s) for s in styles), (external, styles)


def test_every_figure_is_there_as_a_png_with_its_alt_text(built):
    for nb in NOTEBOOKS:
        stored = nbformat.read(nb, as_version=4)
        alts = [o.get("metadata", {}).get("image/png", {}).get("alt")
                for c in stored.cells if c.cell_type == "code" for o in course.image_outputs(c)]
        page = page_of(built, nb)
        images = [a for t, a in parse(page).tags
                  if t == "img" and "_images/" in a.get("src", "")]
        assert len(images) == len(alts), f"{nb.name}: one <img> per stored figure"
        for img, alt in zip(images, alts, strict=True):
            assert (page.parent / img["src"]).resolve().read_bytes()[:8] == PNG_MAGIC
            assert alt and alt in img.get("alt", ""), f"{nb.name}: alt text {img.get('alt')!r}"


def test_links_between_notebooks_become_links_between_pages(built):
    solutions = [nb for nb in NOTEBOOKS if nb.parent.name == "solutions"]
    checked = 0
    for nb in solutions:
        text = nbformat.read(nb, as_version=4)
        linked = {m for c in text.cells if c.cell_type == "markdown"
                  for m in re.findall(r"\]\(\.\./([0-9][0-9]_\w+)\.ipynb", c.source)}
        refs = {url.split("#")[0] for _, _, url in parse(page_of(built, nb)).refs()}
        assert {f"../{name}.html" for name in linked} <= refs, (nb.name, linked)
        checked += bool(linked)
    assert checked >= len(solutions) // 2, "most solutions link back to their notebook"


def test_no_broken_links_and_the_checker_catches_one(built, tmp_path):
    assert broken_links(built) == []
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    next((copy / "_images").glob("*.png")).unlink()
    page = page_of(copy, NOTEBOOKS[1])
    page.write_text(page.read_text(encoding="utf-8").replace(
        NOTEBOOKS[0].with_suffix(".html").name, "00_missing.html", 1), encoding="utf-8")
    broken = broken_links(copy)
    assert any("00_missing.html" in b for b in broken), broken
    assert any(b.endswith(".png") for b in broken), broken


def test_build_refuses_to_replace_a_folder_that_it_did_not_build(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="was not built by tools/site.py"):
        site.build(tmp_path, NOTEBOOKS)
    assert (tmp_path / "precious.txt").exists()


def test_site_folders_are_git_ignored():
    for path in ("site/index.html", ".venv-site/bin/python"):
        result = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, capture_output=True)
        assert result.returncode == 0, f"{path} must be ignored by git"
