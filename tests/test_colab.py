"""Colab, simulated: a fake `google.colab`, the setup cell clones the course from a git URL into
"/content", and notebook 01 runs there to the end, importing `shared` from that clone.

The git URL is a local repository made from this working tree (tracked and untracked-but-not-ignored
files, i.e. what would be pushed) on the branch named in ``[tool.course]``, so the test does not care
which branch is checked out here; on a clean CI clone it is exactly the committed HEAD. The setup cell
honours ``COURSE_GIT_URL`` for this purpose (on Colab it defaults to the GitHub URL).

Colab already ships numpy, torch, matplotlib and seaborn: the setup cell must install nothing. That is
checked in its source and while it runs (`pip`, `conda`, `uv`, `python -m pip` are booby-trapped).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tools import course

ROOT = Path(__file__).resolve().parent.parent
NUMBERED = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ALL = course.notebook_paths()
FIRST = next((p for p in NUMBERED if p.name.startswith("01_")), None)

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
INSTALL = re.compile(
    r"(%|!)\s*(pip|conda|mamba|uv)\b|\b(pip|pip3|conda|mamba|micromamba|uv)\b[^\n]*\binstall\b"
    r"|-m\s*[\"']?\s*,?\s*[\"']?pip\b|\bensurepip\b|\binstall_packages?\b"
)


def git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, **GIT_ENV)
    out = subprocess.run(
        ["git", "-c", "user.name=course-test", "-c", "user.email=course-test@example.invalid",
         "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", *args],
        cwd=cwd, env=env, check=True, capture_output=True, text=True,
    )
    return out.stdout


def publish_snapshot(dest: Path, branch: str) -> str:
    """A git repository holding this working tree (what `git push` would publish) on `branch`."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    dest.mkdir(parents=True)
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # deleted-but-tracked files are not published
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git("init", "-q", cwd=dest)
    git("checkout", "-q", "-b", branch, cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "course snapshot", cwd=dest)
    return dest.as_uri()  # file://... so that `git clone --depth 1` really is shallow


def fake_colab_site(dest: Path, marker: Path) -> tuple[Path, Path]:
    """PYTHONPATH dir with `google.colab` (a namespace `google`, like the real one) and a `pip`
    that records being run; plus a bin dir of installers that do the same. Returns (site, bin)."""
    site = dest / "site"
    (site / "google" / "colab").mkdir(parents=True)
    (site / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s module."""\n')
    (site / "pip").mkdir()
    trap = f"import sys\nopen({str(marker)!r}, 'a').write(' '.join(sys.argv) + '\\n')\nsys.exit(1)\n"
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(trap)
    bin_dir = dest / "bin"
    bin_dir.mkdir()
    for name in ["pip", "pip3", "conda", "mamba", "uv"]:
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{marker}'\nexit 1\n")
        script.chmod(0o755)
    return site, bin_dir


def test_setup_cell_installs_nothing():
    source = course.setup_cell_source()
    assert not INSTALL.search(source), INSTALL.search(source).group(0)
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())  # comments may name them
    for pkg in ["numpy", "torch", "matplotlib", "seaborn"]:
        # it may name a logger ("torch.utils.cpp_extension") but never imports the package
        assert not re.search(rf"^\s*(import|from)\s+{pkg}\b", code, flags=re.M), f"the setup cell imports {pkg}"


def test_install_pattern_can_fail():
    for bad in ["!pip install torch", "%pip install -q seaborn", "subprocess.run(['pip', 'install', 'numpy'])",
                "subprocess.run([sys.executable, '-m', 'pip', 'install', 'x'])", "!uv pip install numpy"]:
        assert INSTALL.search(bad), bad


@pytest.mark.parametrize("path", ALL, ids=[p.relative_to(ROOT).as_posix() for p in ALL])
def test_setup_cell_and_badge_are_the_rendered_template(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "".join(first_code["source"]) == course.setup_cell_source(), "run `make stamp`"
    first_md = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    assert course.BADGE_RE.findall("".join(first_md["source"])) == [course.badge_markdown(path)]


def test_a_fork_changes_one_line_and_restamps(tmp_path, monkeypatch):
    """Edit [tool.course] and run the stamper: badge URL, clone URL, branch and folder all follow."""
    if FIRST is None:
        pytest.skip("notebook 01 not written yet")
    fork = tmp_path / "fork"
    (fork / "notebooks").mkdir(parents=True)
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    cfg = course.config()
    text = text.replace(f'github = "{cfg["github"]}"', 'github = "someone/my-fork"')
    text = text.replace(f'branch = "{cfg["branch"]}"', 'branch = "teaching"')
    (fork / "pyproject.toml").write_text(text, encoding="utf-8")
    shutil.copy(FIRST, fork / "notebooks" / FIRST.name)
    monkeypatch.setattr(course, "ROOT", fork)
    monkeypatch.setattr(course, "NOTEBOOKS", fork / "notebooks")
    assert course.main([]) == 0
    nb = json.loads((fork / "notebooks" / FIRST.name).read_text(encoding="utf-8"))
    md = "".join(next(c for c in nb["cells"] if c["cell_type"] == "markdown")["source"])
    setup = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert f"colab.research.google.com/github/someone/my-fork/blob/teaching/notebooks/{FIRST.name}" in md
    assert "https://github.com/someone/my-fork.git" in setup
    assert '"--branch", "teaching"' in setup and 'Path("my-fork")' in setup
    assert cfg["github"] not in md + setup


@pytest.mark.skipif(FIRST is None, reason="notebook 01 not written yet")
@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to clone")
def test_notebook_01_runs_on_simulated_colab(tmp_path):
    cfg = course.config()
    folder = cfg["github"].split("/")[1]
    url = publish_snapshot(tmp_path / "published", cfg["branch"])
    marker = tmp_path / "installers-run.txt"
    site, bin_dir = fake_colab_site(tmp_path / "colab", marker)
    content = tmp_path / "content"  # Colab's working directory; no course above it
    content.mkdir()

    nb = nbformat.read(FIRST, as_version=4)
    for cell in nb.cells:  # start from a clean notebook, as Colab shows it after "Run all"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(
        "import shared as _s\n"
        "print(Path(_s.__file__).resolve().relative_to(Path.cwd().resolve()).as_posix())\n"
        "print('numpy' in sys.modules, 'torch' in sys.modules)"
    ))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_GIT_URL")}
    env.update(
        GIT_ENV,
        PYTHONPATH=str(site),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        COURSE_GIT_URL=url,
        PYTHONHASHSEED="0",
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(content)}}
    )
    client.execute(env=env)  # raises CellExecutionError on the first failing cell

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert last.splitlines()[0] == f"{folder}/shared/__init__.py", (
        f"`shared` was not imported from the Colab clone: {last!r}"
    )
    clone = content / folder
    assert (clone / ".git").is_dir() and (clone / "shared" / "attention.py").is_file()
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=clone).strip() == cfg["branch"]
    assert git("rev-parse", "--is-shallow-repository", cwd=clone).strip() == "true"
    assert not marker.exists(), f"the notebook ran an installer on Colab:\n{marker.read_text()}"
    # The badge links to the notebook at this path on that branch: it is in what was published.
    rel = course.colab_url(FIRST).split(f"/blob/{cfg['branch']}/", 1)[1]
    assert (clone / rel).is_file()


def test_the_booby_traps_work(tmp_path):
    """The install traps used above do catch `pip` and `python -m pip` (so the check can fail)."""
    marker = tmp_path / "ran.txt"
    site, bin_dir = fake_colab_site(tmp_path / "colab", marker)
    env = dict(os.environ, PYTHONPATH=str(site), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert subprocess.run(["pip", "install", "numpy"], env=env).returncode == 1
    assert subprocess.run([sys.executable, "-m", "pip", "install", "torch"], env=env).returncode == 1
    assert marker.read_text().count("install") == 2
    probe = "import google.colab, google; print(google.colab.__name__)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "google.colab"
