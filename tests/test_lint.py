"""`make lint` stays clean: ruff over shared/, tests/, tools/ and the notebooks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise",
         "shared", "tests", "tools", "notebooks"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_ci_workflows_are_valid_github_actions():
    """The host's CI files against GitHub's workflow schema (vendored by check-jsonschema: offline)."""
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows, "no workflow in .github/workflows"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema",
         "vendor.github-workflows", *map(str, workflows)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_workflow_is_caught(tmp_path):
    """The check can fail: a job without `runs-on` is not a valid workflow."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  test:\n    steps:\n      - run: make test\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema",
         "vendor.github-workflows", str(bad)], capture_output=True, text=True,
    )
    assert result.returncode == 1, result.stdout + result.stderr
