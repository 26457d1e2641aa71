"""What every checker test needs: the two verdict prefixes, a stub as a learner receives it, and
``run``, which calls a checker and insists that it printed exactly one line."""

from __future__ import annotations

NA, OK = "not attempted yet", "correct!"


def run(capsys, checker, *answer):
    """``(result, printed line)`` of ``checker(*answer)``; fails unless exactly one line was printed."""
    result = checker(*answer)
    out = capsys.readouterr().out
    assert out.count("\n") == 1, f"expected exactly one line, got: {out!r}"
    return result, out


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def stub_raises(*args, **kwargs):
    raise NotImplementedError


def _label(answer) -> str:
    """One answer as a test-id part, the same in every process (sets print in hash order)."""
    if isinstance(answer, (set, frozenset)):
        return "{" + ", ".join(sorted(map(repr, answer))) + "}"
    return getattr(answer, "__name__", repr(answer))


def case_id(case) -> str:
    """``checker-answer+answer`` for a ``(checker, answers, expected, phrase)`` test case."""
    checker, answers, _, _ = case
    return f"{checker.__name__}-{'+'.join(_label(a) for a in answers)}"
