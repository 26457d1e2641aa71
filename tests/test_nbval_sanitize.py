"""The nbval sanitizers mask only volatile text: memory addresses and check()'s rounding noise
(differences below 1e-5)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

CFG = Path(__file__).resolve().parent / "nbval_sanitize.cfg"


def sanitize(text: str) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(CFG)
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


@pytest.mark.parametrize("a, b", [
    ("x: max abs diff = 0 (< 1e-12: True)", "x: max abs diff = 4.4e-16 (< 1e-12: True)"),
    ("x: max abs diff = 2.2e-16 (< 1e-12: True)", "x: max abs diff = 1.1e-15 (< 1e-12: True)"),
    ("x: max abs diff = 5.9e-08 (< 1e-06: True)", "x: max abs diff = 1.2e-07 (< 1e-06: True)"),
    ("x: max abs diff = 3.8e-06 (< 1e-04: True)", "x: max abs diff = 5.2e-06 (< 1e-04: True)"),
    ("<object at 0x7f3a2c>", "<object at 0x55aa01>"),
])
def test_machine_noise_compares_equal(a, b):
    assert sanitize(a) == sanitize(b)


@pytest.mark.parametrize("a, b", [
    # the verdict is always compared
    ("x: max abs diff = 2.2e-16 (< 1e-12: True)", "x: max abs diff = 2.2e-16 (< 1e-16: False)"),
    # differences of 1e-5 and more are real and compared as printed
    ("x: max abs diff = 4.1e-05 (< 5e-05: True)", "x: max abs diff = 4.2e-05 (< 5e-05: True)"),
    ("x: max abs diff = 1.0e-05 (< 1e-04: True)", "x: max abs diff = 9.9e-06 (< 1e-04: True)"),
    ("x: max abs diff = 8.0e-04 (< 0.01: True)", "x: max abs diff = 4.0e-03 (< 0.01: True)"),
    ("x: max abs diff = 5.0e-01 (< 0.001: False)", "x: max abs diff = 5.0e-07 (< 0.001: False)"),
    # numbers printed any other way are not touched
    ("weights: 0.1234 2.2e-16", "weights: 0.1234 4.4e-16"),
])
def test_everything_else_is_compared(a, b):
    assert sanitize(a) != sanitize(b)
