"""`make html`: the static site has every notebook in order, prev/next links, and no broken links.

The site is built into a temporary folder from the notebooks that exist (numbered ones, then
solutions), and once from two throwaway notebooks so the checks are exercised even while the
series is being written.
"""

from __future__ import annotations

import base64
import io
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import matplotlib.pyplot as plt
import nbformat
import pytest

from tools import site

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = site.course_notebooks()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Links(HTMLParser):
    """Every href/src of a page, the <nav> links by rel, and the ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, url)
        self.rel: dict[str, list[str]] = {}
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for attr in ("href", "src"):
            if a.get(attr) is not None:
                self.refs.append((tag, attr, a[attr]))
        if tag == "a" and a.get("rel") and a.get("href"):
            self.rel.setdefault(a["rel"], []).append(a["href"])


def parse(page: Path) -> Links:
    p = Links()
    p.feed(page.read_text(encoding="utf-8"))
    return p


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return not (parts.scheme or parts.netloc or url.startswith(("#", "data:", "mailto:")) or not url)


def broken_links(out: Path) -> list[str]:
    """`page: url` for every relative href/src in the site that does not resolve to a file in it."""
    broken = []
    for page in sorted(out.rglob("*.html")):
        for _tag, _attr, url in parse(page).refs:
            if not is_local(url):
                continue
            target = (page.parent / unquote(urlsplit(url).path)).resolve()
            if not (target.is_file() and target.is_relative_to(out.resolve())):
                broken.append(f"{page.relative_to(out)}: {url}")
    return broken


def local_images(page: Path) -> list[Path]:
    return [
        (page.parent / unquote(urlsplit(url).path)).resolve()
        for tag, attr, url in parse(page).refs
        if tag == "img" and attr == "src" and is_local(url)
    ]


def stored_pngs(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum(
        "image/png" in out.get("data", {})
        for c in nb.cells if c.cell_type == "code" for out in c.outputs
    )


def check_site(out: Path, notebooks: list[Path], pages: list[site.Page]) -> None:
    assert [p.source for p in pages] == notebooks
    index = parse(out / "index.html")
    listed = [url for tag, attr, url in index.refs if tag == "a" and is_local(url)]
    assert listed == [p.rel for p in pages], "the index lists the notebooks in series order"

    for i, page in enumerate(pages):
        path = out / page.rel
        links = parse(path)
        up = "../" * page.rel.count("/")
        prev = [f"{up}{pages[i - 1].rel}"] * 2 if i > 0 else []
        nxt = [f"{up}{pages[i + 1].rel}"] * 2 if i + 1 < len(pages) else []
        assert links.rel.get("prev", []) == prev, f"{page.rel}: previous links (top and bottom)"
        assert links.rel.get("next", []) == nxt, f"{page.rel}: next links (top and bottom)"
        assert f"{up}index.html" in [u for _, _, u in links.refs]

        images = local_images(path)
        assert len(images) == stored_pngs(page.source), f"{page.rel}: one <img> per stored figure"
        for img in images:
            assert img.read_bytes()[:8] == PNG_MAGIC, f"{img.name} is not a PNG"
        assert not [u for t, _, u in links.refs if t == "a" and u.endswith(".ipynb") and is_local(u)]

    assert broken_links(out) == []


def png_output() -> dict:
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.imshow([[0.2, 0.8], [0.6, 0.4]])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return nbformat.v4.new_output("display_data", data={"image/png": data, "text/plain": "<Figure>"})


def throwaway_course(root: Path) -> list[Path]:
    """notebooks/01_a, 02_b and solutions/01_a_solutions, linked like the real ones."""
    nbs = {
        "01_first.ipynb": ("# First steps", "Next: [the second notebook](02_second.ipynb#Summary)."),
        "02_second.ipynb": ("# Second *steps*", "Back to [the first](01_first.ipynb); "
                            "code in [shared/attention.py](../shared/attention.py)."),
        "solutions/01_first_solutions.ipynb": ("# Solutions to 01", "[Exercises](../01_first.ipynb)"),
    }
    (root / "shared").mkdir()
    (root / "shared" / "attention.py").write_text('"""Course code."""\n')
    paths = []
    for rel, (title, text) in nbs.items():
        nb = nbformat.v4.new_notebook()
        code = nbformat.v4.new_code_cell("plot()", execution_count=1)
        code.outputs = [png_output()]
        nb.cells = [nbformat.v4.new_markdown_cell(f"{title}\n\n{text}"), code,
                    nbformat.v4.new_markdown_cell("## Summary\n\nDone.")]
        path = root / "notebooks" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        paths.append(path)
    return paths


def test_site_of_throwaway_notebooks(tmp_path):
    notebooks = throwaway_course(tmp_path)
    assert site.course_notebooks(tmp_path / "notebooks") == notebooks
    out = tmp_path / "site"
    pages = site.build(notebooks, out, tmp_path / "notebooks")
    assert [p.title for p in pages] == ["First steps", "Second steps", "Solutions to 01"]
    check_site(out, notebooks, pages)
    first = (out / "01_first.html").read_text(encoding="utf-8")
    assert 'href="02_second.html#Summary"' in first
    second = (out / "02_second.html").read_text(encoding="utf-8")
    assert "github.com/" in second and "/shared/attention.py" in second
    solutions = (out / "solutions" / "01_first_solutions.html").read_text(encoding="utf-8")
    assert 'href="../01_first.html"' in solutions


def test_broken_links_are_reported(tmp_path):
    notebooks = throwaway_course(tmp_path)
    out = tmp_path / "site"
    site.build(notebooks, out, tmp_path / "notebooks")
    next(out.rglob("*.png")).unlink()
    page = out / "02_second.html"
    page.write_text(page.read_text().replace("01_first.html", "01_missing.html", 1))
    broken = broken_links(out)
    assert any(b.startswith("02_second.html: ") and "01_missing.html" in b for b in broken), broken
    assert any(b.endswith(".png") for b in broken), broken


def test_build_refuses_to_replace_a_folder_that_is_not_a_site(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not a course site"):
        site.build([], tmp_path)
    assert (tmp_path / "precious.txt").exists()


@pytest.mark.skipif(not NOTEBOOKS, reason="no course notebooks yet")
def test_site_of_the_course(tmp_path):
    out = tmp_path / "site"
    pages = site.build(NOTEBOOKS, out)
    check_site(out, NOTEBOOKS, pages)


def test_site_folder_is_git_ignored():
    result = subprocess.run(
        ["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT, capture_output=True
    )
    assert result.returncode == 0, "site/ must be in .gitignore"
