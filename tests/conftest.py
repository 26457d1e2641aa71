"""Make the repo root importable (``shared``, ``tools``) and keep plots off-screen in tests."""

import sys
from pathlib import Path

import matplotlib

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

matplotlib.use("Agg")
