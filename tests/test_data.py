"""The reference inputs in data/ load with the right shapes and the published values."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shared.data import (
    load_embeddings,
    load_hand_example,
    load_json,
    load_sentences,
    walkthrough_parameters,
)


def test_embeddings_are_the_published_six_tokens():
    tokens, X = load_embeddings()
    assert tokens == "Your journey starts with one step".split()
    assert X.shape == (6, 3) and X.dtype == np.float64
    # first and last rows as published in the curriculum's reference data
    np.testing.assert_array_equal(X[0], [0.43, 0.15, 0.89])
    np.testing.assert_array_equal(X[5], [0.05, 0.80, 0.55])


def test_hand_example():
    ex = load_hand_example()
    assert ex["tokens"] == ["the", "cat", "sat"]
    np.testing.assert_array_equal(ex["X"], [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])
    for name in ("W_q", "W_k", "W_v"):
        np.testing.assert_array_equal(ex[name], np.eye(4))
    assert ex["d_k"] == 4 and ex["causal"] is True


def test_sentences():
    s = load_sentences()
    assert s["animal"] == "The animal didn't cross the street because it was too tired."
    assert s["cat"] == "The cat sat on the mat"
    assert s["love"] == "I love you today"


def test_walkthrough_follows_the_published_draw_order():
    """Re-draw independently with the global generator: tokens 6x16, positions 5x16, then
    W_Q[0], W_Q[1], W_K[0], W_K[1], W_V[0], W_V[1] (16x8, row by row)."""
    state = random.getstate()
    try:
        random.seed(42)
        draw = [random.gauss(0, 0.1) for _ in range(6 * 16 + 5 * 16 + 6 * 16 * 8)]
    finally:
        random.setstate(state)
    p = walkthrough_parameters()
    flat = [v for row in p["token_embedding"] + p["position_embedding"] for v in row]
    for group in ("W_Q", "W_K", "W_V"):
        for h in range(2):
            flat += [v for row in p[group][h] for v in row]
    assert flat == draw
    assert p["input_ids"] == [1, 3, 4, 5, 2]
    assert [p["vocabulary"][i] for i in p["input_ids"]] == ["<BOS>", "I", "like", "transformers", "<EOS>"]
    X = np.array(p["X"])
    assert X.shape == (5, 16)
    np.testing.assert_allclose(
        X[2], np.array(p["token_embedding"][4]) + np.array(p["position_embedding"][2])
    )


def test_walkthrough_leaves_global_random_state_alone():
    random.seed(0)
    expected = random.random()
    random.seed(0)
    walkthrough_parameters()
    assert random.random() == expected


def test_missing_data_file_names_what_exists():
    with pytest.raises(FileNotFoundError, match=r"no data file 'nope.json' in data/; available: \["):
        load_json("nope.json")
