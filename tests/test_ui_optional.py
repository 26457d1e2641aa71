"""The browser test is optional for learners and required in CI (issue: `make test` wherever
Python and make run). Simulated here by pointing CHROMIUM at nothing, so this runs on any machine,
with or without a browser."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_ui_test(ci: str, target: str = "tests/test_ui.py") -> subprocess.CompletedProcess:
    """The browser test beside a small module of unit tests, as in `make test` (pytest exits 5,
    "no tests ran", when the only module given is skipped). No plugins (nbval, xdist, hypothesis):
    they play no part here, and loading them would triple the time."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    env.update(CHROMIUM="/nonexistent/chromium", CI=ci, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-ra", target, "tests/test_readme.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_no_browser_is_one_skipped_line_saying_how_to_enable_it():
    out = run_ui_test(ci="")
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert len(lines) == 1, out.stdout[-3000:]
    assert "no Chromium/Chrome found; to enable it, run `make browser`" in lines[0]
    assert "CHROMIUM=" in lines[0] and "CHROMEDRIVER=" in lines[0]
    assert "1 skipped" in out.stdout


def test_no_browser_in_ci_is_a_failure():
    out = run_ui_test(ci="true", target="tests/test_ui.py::test_nothing_was_saved")  # one is enough
    assert out.returncode == 1, out.stdout[-3000:]
    assert "CI=true needs the browser test, but no Chromium/Chrome was found" in out.stdout
    assert "skipped" not in out.stdout.splitlines()[-1]
