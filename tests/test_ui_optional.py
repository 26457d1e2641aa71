"""The browser test is optional for learners and required in CI (issue: `make test` wherever
Python and make run). Each case points CHROMIUM and CHROMEDRIVER at a missing path or at a stand-in
executable, so this runs the same on any machine, with or without a real browser."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MISSING = "/nonexistent/browser-binary"

# (what CHROMIUM is, what CHROMEDRIVER is) -> the words the skip line must use
CASES = {
    "no Chromium": (("missing", "present"), "no Chromium/Chrome found"),
    "no chromedriver": (("present", "missing"), "no chromedriver found"),
    "neither": (("missing", "missing"), "no Chromium/Chrome and chromedriver found"),
}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> str:
    """An executable file: enough for the module's search to count a browser as present."""
    path = tmp_path_factory.mktemp("browser") / "stand-in"
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def run_ui_test(ci: str, chromium: str, chromedriver: str,
                target: str = "tests/test_ui.py") -> subprocess.CompletedProcess:
    """The browser test beside a small module of unit tests, as in `make test` (pytest exits 5,
    "no tests ran", when the only module given is skipped). No plugins (nbval, xdist, hypothesis):
    they play no part here, and loading them would triple the time."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    env.update(CHROMIUM=chromium, CHROMEDRIVER=chromedriver, CI=ci,
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-ra", target, "tests/test_readme.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", CASES)
def test_no_browser_is_one_skipped_line_naming_what_is_missing(case, stand_in):
    (chromium, driver), words = CASES[case]
    pick = {"missing": MISSING, "present": stand_in}
    out = run_ui_test(ci="", chromium=pick[chromium], chromedriver=pick[driver])
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert len(lines) == 1, out.stdout[-3000:]
    assert f"{words}; to enable it, run `make browser`" in lines[0], lines[0]
    assert "CHROMIUM=" in lines[0] and "CHROMEDRIVER=" in lines[0]
    assert "1 skipped" in out.stdout


@pytest.mark.parametrize("case", ["neither"])
def test_no_browser_in_ci_is_a_failure(case, stand_in):
    (chromium, driver), words = CASES[case]
    pick = {"missing": MISSING, "present": stand_in}
    out = run_ui_test(ci="true", chromium=pick[chromium], chromedriver=pick[driver],
                      target="tests/test_ui.py::test_nothing_was_saved")  # one test is enough
    assert out.returncode == 1, out.stdout[-3000:]
    needed = words.replace("no ", "", 1).replace(" found", "")
    assert f"CI=true needs the browser test, but no {needed} was found" in out.stdout
    assert "skipped" not in out.stdout.splitlines()[-1]
