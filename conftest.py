"""The notebooks' time budget, reported by every test run that executes notebooks.

nbval runs each notebook cell as a test item; this adds up each notebook's items (set-up, call and
tear-down, which includes starting its kernel) and, at the end of the run, prints one table: seconds
per notebook, and any notebook over its budget. The same table is written to
`.artifacts/nbval-times.md` (`make durations` prints it). It reports; it does not fail a run, since
a slow or busy machine is not a broken course, but the README's maintainer section quotes it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BUDGET_S = 15.0  # per notebook under nbval on the 2-core machine (the series' rule)
BUDGET_OVERRIDES = {"09_": 20.0}  # the pretrained model's load is allowed a little more
_seconds: dict[str, float] = defaultdict(float)


def budget(name: str) -> float:
    if "solutions" in name:
        return BUDGET_S
    return BUDGET_OVERRIDES.get(Path(name).name[:3], BUDGET_S)


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration


def table() -> str:
    rows = ["| notebook | nbval seconds | budget |", "|---|---:|---:|"]
    for path in sorted(_seconds):
        flag = " **over**" if _seconds[path] > budget(path) else ""
        rows.append(f"| `{path}` | {_seconds[path]:.1f}{flag} | {budget(path):.0f} |")
    rows.append(f"| all notebooks | {sum(_seconds.values()):.1f} | |")
    return "\n".join(rows)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    text = table()
    terminalreporter.write_sep("-", "nbval time per notebook (seconds, summed over its cells)")
    terminalreporter.write_line(text)
    over = [p for p in _seconds if _seconds[p] > budget(p)]
    if over:
        terminalreporter.write_line(f"over budget on this machine: {', '.join(sorted(over))}")
    out = ROOT / ".artifacts" / "nbval-times.md"
    try:
        out.parent.mkdir(exist_ok=True)
        out.write_text(text + "\n")
    except OSError as e:  # e.g. a test running as another user in a checkout it cannot write
        terminalreporter.write_line(f"(not written to {out.name}: {e.strerror})")



# Longest first. `make test` runs three xdist workers that each take whole modules (a notebook's
# cells stay together) in collection order (`--no-loadscope-reorder`; xdist's default order is by
# number of tests). The browser module alone takes about a minute: started last, it would run long
# after the other workers ran dry; started first, everything else runs beside it. Then the other
# slow modules, then the notebooks, then the many short unit-test modules that fill the gaps.
SLOW_FIRST = ("tests/test_ui.py", "tests/test_machine_independence.py", "tests/test_site.py",
              "tests/test_setup.py", "tests/test_colab.py", "tests/test_lab.py")


def pytest_collection_modifyitems(items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in SLOW_FIRST:
            return SLOW_FIRST.index(path)
        return len(SLOW_FIRST) + (0 if path.endswith(".ipynb") else 1)

    items.sort(key=rank)  # stable: the order within a module (and a notebook's cells) is kept
