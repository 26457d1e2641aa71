"""One build of the book site per state of the course, shared by tests/test_site.py and the
browser test (tests/test_ui.py), which may run at the same time in different test workers.

The site is built once into ``.artifacts/site-test/<key>/site``, where the key hashes everything
the build reads (the notebooks, the builder, the site's pins); a lock makes the second worker wait
for the first worker's build instead of starting its own.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
SITE_PYTHON = ROOT / ".venv-site" / "bin" / "python"
CACHE = ROOT / ".artifacts" / "site-test"


def _key() -> str:
    inputs = sorted((ROOT / "notebooks").rglob("*.ipynb")) + [
        ROOT / "tools" / "site.py", ROOT / "tools" / "course.py", ROOT / "pyproject.toml",
        ROOT / "requirements-site.txt"]
    digest = hashlib.sha256()
    for path in inputs:
        if ".ipynb_checkpoints" in path.parts:
            continue
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def built_site() -> Path:
    """The site built from the course as it is now (built on first use, then reused)."""
    if not SITE_PYTHON.exists():
        pytest.fail("the site's environment is missing: `make test` creates it (`make site-venv`)")
    CACHE.mkdir(parents=True, exist_ok=True)
    key = _key()
    out = CACHE / key / "site"
    with FileLock(str(CACHE / "build.lock"), timeout=900):
        if not (out / "index.html").exists():
            for old in CACHE.iterdir():  # only the newest build is kept
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
            out.parent.mkdir(parents=True)
            done = subprocess.run([str(SITE_PYTHON), "-m", "tools.site", "--out", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out
