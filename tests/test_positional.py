"""shared.positional against hand-derived values of the sinusoidal encoding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.positional import sinusoidal_positional_encoding


def test_sinusoidal_positional_encoding_values():
    pe = sinusoidal_positional_encoding(50, 8)
    assert pe.shape == (50, 8) and pe.dtype == np.float64
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-12)  # sin 0, cos 0
    # hand-derived: column pair i turns at frequency 1 / 10000**(2i/8)
    for pos in (1, 7, 49):
        for i in range(4):
            f = 10000 ** (-2 * i / 8)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(pos * f), abs=1e-12)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(pos * f), abs=1e-12)
    np.testing.assert_allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, 1.0, atol=1e-12)
    assert len({tuple(np.round(r, 6)) for r in pe}) == 50  # every position is distinct


def test_sinusoidal_positional_encoding_bad_input():
    with pytest.raises(ValueError, match="d_model must be even .*; got d_model = 5"):
        sinusoidal_positional_encoding(4, 5)
    with pytest.raises(ValueError, match="T must be a positive integer; got 0"):
        sinusoidal_positional_encoding(0, 4)
