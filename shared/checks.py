"""One way to check a result in a notebook: print the max-abs-difference, fail loudly.

Notebook 01 teaches this helper inline; the later notebooks import it from here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check"]


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
