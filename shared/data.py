"""Load the course's reference inputs from ``data/`` (never re-type them in a notebook).

All loaders return plain Python / NumPy objects and find ``data/`` relative to this file, so
they work from any working directory (JupyterLab, CI, Colab).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

__all__ = [
    "DATA_DIR",
    "load_json",
    "load_embeddings",
    "load_hand_example",
    "load_sentences",
    "walkthrough_parameters",
]


def load_json(name: str) -> dict:
    """Read ``data/<name>`` (a JSON file shipped with the course)."""
    path = DATA_DIR / name
    if not path.is_file():
        available = sorted(p.name for p in DATA_DIR.glob("*.json"))
        raise FileNotFoundError(f"no data file {name!r} in data/; available: {available}")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def load_embeddings() -> tuple[list[str], np.ndarray]:
    """The six tokens of "Your journey starts with one step" and their 3-d embeddings.

    Returns:
        ``(tokens, X)``: a list of 6 strings and a float64 array ``X`` of shape ``(6, 3)``,
        one row per token.
    """
    d = load_json("your_journey_embeddings.json")
    return list(d["tokens"]), np.array(d["embeddings"], dtype=np.float64)


def load_hand_example() -> dict:
    """The hand-sized example: "the cat sat", ``X`` of shape ``(3, 4)``, identity projections.

    Returns a dict with ``tokens`` (list of 3 str), ``X`` ``(3, 4)``, ``W_q``/``W_k``/``W_v``
    ``(4, 4)`` float64 arrays, ``d_k`` (int, 4) and ``causal`` (bool, True).
    """
    d = load_json("hand_example.json")
    out = {k: d[k] for k in ("tokens", "d_k", "causal")}
    for k in ("X", "W_q", "W_k", "W_v"):
        out[k] = np.array(d[k], dtype=np.float64)
    return out


def load_sentences() -> dict[str, str]:
    """Example sentences, by key: ``animal`` ("The animal didn't cross the street because it was
    too tired."), ``cat`` ("The cat sat on the mat"), ``love`` ("I love you today")."""
    d = load_json("sentences.json")
    return {k: v for k, v in d.items() if k != "description"}


def walkthrough_parameters() -> dict:
    """Parameters of the pure-Python walk-through, as nested Python lists (no NumPy).

    ``random.seed(seed)`` then ``random.gauss(0, std)`` draws, in this order: the token table
    ``(6, 16)``, the position table ``(5, 16)``, then ``W_Q[0], W_Q[1], W_K[0], W_K[1], W_V[0],
    W_V[1]``, each ``(16, 8)`` and filled row by row. A private ``random.Random`` is used, so the
    global random state is left alone.

    Returns a dict with ``vocabulary``, ``input_tokens``, ``input_ids`` and ``token_embedding``
    (6 x 16), ``position_embedding`` (5 x 16), ``W_Q``, ``W_K``, ``W_V`` (lists of 2 matrices,
    16 x 8 each) and ``X`` (5 x 16: token embedding + position embedding of the input).
    """
    cfg = load_json("walkthrough.json")
    rng = random.Random(cfg["seed"])
    std, d_model, head_dim = cfg["std"], cfg["d_model"], cfg["head_dim"]

    def matrix(rows: int, cols: int) -> list[list[float]]:
        return [[rng.gauss(0, std) for _ in range(cols)] for _ in range(rows)]

    token_embedding = matrix(len(cfg["vocabulary"]), d_model)
    position_embedding = matrix(cfg["max_len"], d_model)
    heads = range(cfg["num_heads"])
    W_Q = [matrix(d_model, head_dim) for _ in heads]
    W_K = [matrix(d_model, head_dim) for _ in heads]
    W_V = [matrix(d_model, head_dim) for _ in heads]
    X = [
        [t + p for t, p in zip(token_embedding[tok], position_embedding[pos], strict=True)]
        for pos, tok in enumerate(cfg["input_ids"])
    ]
    return {
        "vocabulary": cfg["vocabulary"],
        "input_tokens": cfg["input_tokens"],
        "input_ids": cfg["input_ids"],
        "token_embedding": token_embedding,
        "position_embedding": position_embedding,
        "W_Q": W_Q,
        "W_K": W_K,
        "W_V": W_V,
        "X": X,
    }
