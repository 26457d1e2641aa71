"""Checks for notebooks: ``check`` prints the max-abs-difference and fails loudly (notebook 01
teaches it inline; the later notebooks import it from here); ``count_matmuls`` counts the matrix
products one call runs (notebook 04).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["check", "count_matmuls"]

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def check(label: str, got, expected, tol: float = 1e-12) -> None:
    """Print ``max |got - expected|`` and whether it is below ``tol``; raise an
    ``AssertionError`` if it is not. Returns nothing (so a notebook cell shows only the line).

    Shapes: ``got`` and ``expected`` are nested lists, NumPy arrays or PyTorch tensors of the
    same shape (compared in float64; tensors are detached and moved to the CPU).

    The difference is printed in scientific notation with one decimal (``2.2e-16``), never rounded
    to ``0.0000``: whether two results agree to 1e-16 (the same float64 arithmetic) or to 1e-7
    (float32 rounding) is part of what a learner should see. Exactly equal prints ``0``.
    """
    got, expected = (
        np.asarray(a.detach().cpu().double().numpy() if hasattr(a, "detach") else a,
                   dtype=np.float64)
        for a in (got, expected)
    )
    if got.shape != expected.shape:
        raise ValueError(f"{label}: shapes differ, got {got.shape} and expected {expected.shape}")
    diff = float(np.max(np.abs(got - expected))) if got.size else 0.0
    shown = "0" if diff == 0 else f"{diff:.1e}"
    print(f"{label}: max abs diff = {shown} (< {tol:g}: {diff < tol})")
    assert diff < tol, f"{label}: difference {diff:.3g} is not below {tol:g}"


def count_matmuls(fn, *args) -> dict[str, int]:
    """Run ``fn(*args)`` once under ``torch.profiler`` (CPU, no gradients) and return how many
    times it called each matrix-product operator: ``{"mm": n, "addmm": n, "bmm": n}`` (``addmm``
    is a product plus a bias, ``bmm`` a batched product; an operator never called counts 0).

    E.g. ``count_matmuls(layer, x)`` for one forward pass of ``layer`` on ``x`` (B, T, d); the
    result of the call is discarded. The profiler's own start-up messages are silenced
    (``KINETO_LOG_LEVEL``) unless the caller has set that variable.
    """
    if not callable(fn):
        raise TypeError(f"count_matmuls expects a function (or module) and its arguments, e.g. "
                        f"count_matmuls(layer, x); got a {type(fn).__name__} first")
    import torch
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read when the profiler first starts
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    calls = {event.key: event.count for event in prof.key_averages()}
    return {name.removeprefix("aten::"): calls.get(name, 0) for name in MATMULS}
