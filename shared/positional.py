"""Positional encodings: telling attention where each token sits.

Attention itself is blind to order (permute the tokens and the outputs permute the same way), so
position information is added to the token embeddings before the first attention layer.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sinusoidal_positional_encoding"]


def sinusoidal_positional_encoding(T: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The fixed sine/cosine encoding of "Attention Is All You Need" (Vaswani et al., 2017).

    ``PE[pos, 2i] = sin(pos / base**(2i / d_model))`` and
    ``PE[pos, 2i + 1] = cos(pos / base**(2i / d_model))`` for ``i = 0 .. d_model/2 - 1``:
    each pair of columns is a clock turning at its own speed, fast on the left, slow on the right.

    Shapes: returns a float64 array ``(T, d_model)``, one row per position ``0 .. T-1``.
    ``d_model`` must be even (the columns come in sin/cos pairs).
    """
    for name, value in (("T", T), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos column pairs); got d_model = {d_model}")
    if not base > 1:
        raise ValueError(f"base must be a number greater than 1; got {base!r}")
    pos = np.arange(T, dtype=np.float64)[:, None]  # (T, 1)
    i2 = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, d_model/2): the even indices 2i
    angles = pos / base ** (i2 / d_model)  # (T, d_model/2)
    pe = np.empty((T, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe
