"""The machinery every checker shares: one printed line per check, learner exceptions become
messages, and small helpers to convert, compare and diagnose answers.

A checker is a function decorated with ``@checker`` whose body raises ``Wrong(hint)`` or
``NotAttempted(detail)``, or returns a short success note.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

NOT_ATTEMPTED = "not attempted yet"
CORRECT = "correct!"
NOT_QUITE = "not quite:"


# --------------------------------------------------------------------------------------------
# Machinery: one message per check, learner exceptions become messages
# --------------------------------------------------------------------------------------------
class CheckResult:
    """What a checker returns: ``passed`` is True (correct), False (not quite) or None (not
    attempted yet); ``message`` is the line it printed. Truthy only when correct. It shows nothing
    when it is the last expression of a notebook cell (the printed line says it all)."""

    __slots__ = ("passed", "message")

    def __init__(self, passed: bool | None, message: str):
        self.passed = passed
        self.message = message

    def __bool__(self) -> bool:
        return self.passed is True

    def __eq__(self, other) -> bool:
        if isinstance(other, CheckResult):
            return self.passed is other.passed
        return self.passed is other if other is None or isinstance(other, bool) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"CheckResult(passed={self.passed!r})"

    def _ipython_display_(self) -> None:  # the checker already printed its one line
        return None


class _NotAttempted(Exception):
    """The stub has not been filled in yet."""


class _Wrong(Exception):
    """The answer is wrong; ``args[0]`` is the hint."""


def _checker(body):
    """Turn ``body`` (raises ``_Wrong``/``_NotAttempted`` or returns a success note) into a
    checker that prints one line, returns a ``CheckResult`` and never raises."""

    @functools.wraps(body)
    def run(*args, **kwargs) -> CheckResult:
        np_state = np.random.get_state()  # noqa: NPY002 - restore the notebook's global stream
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings(), \
                    torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")
                note = body(*args, **kwargs)
        except _NotAttempted as e:
            detail = f": {e.args[0]}" if e.args and e.args[0] else ""
            passed, message = None, f"{NOT_ATTEMPTED}{detail}"
        except _Wrong as e:
            passed, message = False, f"{NOT_QUITE} {e.args[0]}"
        except Exception as e:  # noqa: BLE001 - a checker must never crash
            passed = False
            message = f"{NOT_QUITE} the checker could not use your answer ({type(e).__name__}: {e})"
        else:
            passed, message = True, CORRECT + (f" {note}" if note else "")
        finally:
            np.random.set_state(np_state)  # noqa: NPY002
        print(message)
        return CheckResult(passed, message)

    return run


def _call(fn, *args, name: str = "your function", on_error: str = "", none_ok: bool = False,
          **kwargs):
    """Call learner code: NotImplementedError or a ``None`` result -> not attempted; any other
    exception -> a hint naming it (plus ``on_error`` advice)."""
    if not callable(fn):
        raise _Wrong(f"expected a function, got {type(fn).__name__}; pass the function itself "
                     "(no parentheses)")
    label = getattr(fn, "__name__", "")
    if isinstance(label, str) and label.isidentifier():
        name = label  # the learner's own name for it
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotAttempted(f"{name} still raises NotImplementedError: fill in the TODO") from None
    except Exception as e:  # noqa: BLE001 - learner code may raise anything
        extra = f" ({on_error})" if on_error else ""
        raise _Wrong(f"{name} raised {type(e).__name__}: {e}{extra}") from None
    if out is None and not none_ok:
        raise _NotAttempted(f"{name} still returns None: replace the TODO with your code and "
                            "run the cell again")
    return out


def _arr(x, what: str = "your result") -> np.ndarray:
    """A learner's array or tensor as float64 NumPy (booleans kept as bool)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.bool else x.double().numpy()
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001
        raise _Wrong(f"{what} should be an array or tensor; got {type(x).__name__}") from None
    if a.dtype == np.bool_:
        return a
    if a.dtype == object or not np.issubdtype(a.dtype, np.number):
        raise _Wrong(f"{what} should be a numeric array or tensor; got {type(x).__name__} "
                     f"with dtype {a.dtype}")
    return a.astype(np.float64)


def _shape(a: np.ndarray, expected: tuple, what: str = "your result", meaning: str = "") -> None:
    if a.shape != tuple(expected):
        extra = f" {meaning}" if meaning else ""
        raise _Wrong(f"{what}: wrong shape {a.shape}; expected {tuple(expected)}{extra}")


def _close(a, b, atol: float = 1e-6) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=1e-5, equal_nan=False))


def _diagnose(got: np.ndarray, candidates, atol: float = 1e-6) -> None:
    """Raise ``_Wrong(hint)`` for the first ``(hint, value)`` candidate that ``got`` matches."""
    for hint, value in candidates:
        if value is not None and _close(got, value, atol):
            raise _Wrong(hint)


def _maxdiff(a: np.ndarray, b: np.ndarray) -> str:
    return f"{float(np.nanmax(np.abs(a - b))):.4f}"


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def _entropy(w: np.ndarray, axis: int = -1) -> np.ndarray:
    """Entropy in nats along ``axis``; 0 * log 0 counts as 0."""
    logw = np.log(np.where(w > 0, w, 1.0))
    return -(w * logw).sum(axis=axis)


def _t(x: np.ndarray) -> torch.Tensor:
    """A NumPy array as a (contiguous) PyTorch tensor, for checkers whose notebooks use torch."""
    return torch.from_numpy(np.ascontiguousarray(x))


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


