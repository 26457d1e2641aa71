"""The README's notebook tables follow the notebooks: every numbered notebook is linked in the
series table and has a row in the maintainers' nbval time table, and nothing else does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUMBERED = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_notebook_is_linked_in_the_series_table():
    linked = re.findall(r"^\| \d\d \| \[[^]]+\]\((notebooks/[^)]+\.ipynb)\)", README, flags=re.M)
    assert linked == [p.relative_to(ROOT).as_posix() for p in NUMBERED]


def test_the_time_table_has_one_row_per_notebook():
    section = README.split("**Time budget.**", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (\d\d) ([A-Za-z -]+?) \| ([\d.]+) \| ([\d.]+) \|$", section, flags=re.M)
    assert [r[0] for r in rows] == [p.name[:2] for p in NUMBERED], section
    for number, words, course_s, solutions_s in rows:
        path = next(p for p in NUMBERED if p.name.startswith(number))
        assert words.lower().replace(" ", "_").replace("-", "_") in path.stem, (words, path)
        budget = 20 if number == "09" else 15
        assert float(course_s) <= budget and float(solutions_s) <= 15, (number, course_s)
