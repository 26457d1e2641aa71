"""The checker paths of notebook 03 added in its third edition (tests/test_exercises.py keeps the
older ones): each typical wrong answer gets the hint for its mistake. The answers here are written
independently of the checkers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from shared import exercises as ex
from shared.attention import softmax as course_softmax
from shared.exercises import nb03


def stub(*args, **kwargs):
    # TODO: your code here
    return None


def np_softmax(x, axis=-1):  # the textbook formula, no guard: an all -inf row gives NaN
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# 3.1 ------------------------------------------------------------------------------------------
class Window(torch.nn.Module):
    """A correct sliding-window module; subclasses change one thing."""

    def __init__(self, d_in, d_out, context_length, window):
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=False)
        i = torch.arange(context_length)
        band = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
        self.register_buffer("mask", band)

    def scores(self, x):
        return self.W_query(x) @ self.W_key(x).transpose(1, 2) / self.W_key.out_features ** 0.5

    def forward(self, x):
        T = x.shape[1]
        s = self.scores(x).masked_fill(~self.mask[:T, :T], float("-inf"))
        return torch.softmax(s, dim=-1) @ self.W_value(x)


class WindowFillWithoutTilde(Window):
    def forward(self, x):
        T = x.shape[1]
        s = self.scores(x).masked_fill(self.mask[:T, :T], float("-inf"))
        return torch.softmax(s, dim=-1) @ self.W_value(x)


class WindowInvertedBufferAndFill(WindowFillWithoutTilde):  # two wrongs: the output is right
    def __init__(self, d_in, d_out, context_length, window):
        super().__init__(d_in, d_out, context_length, window)
        self.mask = ~self.mask


class WindowSoftmaxQueries(Window):
    def forward(self, x):
        T = x.shape[1]
        s = self.scores(x).masked_fill(~self.mask[:T, :T], float("-inf"))
        return torch.softmax(s, dim=1) @ self.W_value(x)


class WindowSoftmaxBatch(Window):
    def forward(self, x):
        T = x.shape[1]
        s = self.scores(x).masked_fill(~self.mask[:T, :T], float("-inf"))
        return torch.softmax(s, dim=0) @ self.W_value(x)


class WindowScaleDin(Window):
    def scores(self, x):
        return self.W_query(x) @ self.W_key(x).transpose(1, 2) / x.shape[-1] ** 0.5


class WindowScaleNoRoot(Window):
    def scores(self, x):
        return self.W_query(x) @ self.W_key(x).transpose(1, 2) / self.W_key.out_features


@pytest.mark.parametrize("answer,hint", [
    (WindowFillWithoutTilde, "masked_fill hides the keys the buffer ALLOWS"),
    (WindowInvertedBufferAndFill, "True must mean 'may attend'; your buffer marks the forbidden"),
    (WindowSoftmaxQueries, "softmax over the wrong dim"),
    (WindowSoftmaxBatch, "such as the batch (dim=0)"),
    (WindowScaleDin, "you scaled by sqrt(d_in) = sqrt(3)"),
    (WindowScaleNoRoot, "you divided by d_out = 2; divide by its square root"),
])
def test_sliding_window_hints(capsys, answer, hint):
    assert ex.check_sliding_window_attention(Window).passed is True
    result = ex.check_sliding_window_attention(answer)
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out


# 3.1 (a) as the notebook poses it: the learner writes band_mask, a given subclass of section 6's
# module registers it as its buffer ------------------------------------------------------------
class NotebookCausal(torch.nn.Module):  # section 6's MyCausalAttention, written out again here
    def __init__(self, d_in, d_out, context_length):
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=False)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).tril(),
                             persistent=False)

    def forward(self, x):
        T = x.shape[1]
        s = self.W_query(x) @ self.W_key(x).transpose(1, 2) / self.W_key.out_features ** 0.5
        return torch.softmax(s.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1) @ self.W_value(x)


def window_module(band_mask):
    class SlidingWindowAttention(NotebookCausal):
        def __init__(self, d_in, d_out, context_length, window):
            super().__init__(d_in, d_out, context_length)
            self.register_buffer("mask", band_mask(context_length, window), persistent=False)
    return SlidingWindowAttention


def ones(n):
    return torch.ones(n, n, dtype=torch.bool)


def band_by_indices(n, w):  # independent of tril: the condition i - w < j <= i itself
    i = torch.arange(n)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)


def band_by_loops(n, w):  # the slow way the exercise asks to avoid: still a correct band
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(max(0, i - w + 1), i + 1):
            mask[i, j] = True
    return mask


WRONG_BANDS = [
    (lambda n, w: ones(n).tril() & ~ones(n).tril(-w + 1), "one key too narrow"),
    (lambda n, w: ones(n).tril() & ~ones(n).tril(-w - 1), "one key too wide"),
    (lambda n, w: ones(n).tril(), "plain causal mask"),
    (lambda n, w: ~band_by_indices(n, w), "flip it"),
    (lambda n, w: ones(n).triu() & ~ones(n).triu(w), "looks into the future"),
    (lambda n, w: ones(n).triu(), "the keys at or after each query"),
    (lambda n, w: ~ones(n).tril(), "upper triangle above the diagonal"),
    (lambda n, w: ones(n).tril(-w), "the keys the window hides"),
    (lambda n, w: ones(n).tril() & ~ones(n).tril(-w - 2), "should be True exactly when i - window < j <= i"),
    (lambda n, w: band_by_indices(n, w).int(), "make the mask boolean"),
]
RECIPE = ("tril(", "triu(", "torch.ones")  # 3.1 (a) asks the learner to find the construction


@pytest.mark.parametrize("band", [band_by_indices, band_by_loops, lambda n, w: ones(n).tril() & ~ones(n).tril(-w)])
def test_band_mask_accepted(capsys, band):
    assert ex.check_sliding_window_attention(window_module(band)).passed is True


def test_band_mask_stub_is_not_attempted(capsys):
    result = ex.check_sliding_window_attention(window_module(stub))
    out = capsys.readouterr().out
    assert result.passed is None and "band_mask" in out, out


@pytest.mark.parametrize("band,hint", WRONG_BANDS, ids=[h for _, h in WRONG_BANDS])
def test_band_mask_hints(capsys, band, hint):
    result = ex.check_sliding_window_attention(window_module(band))
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out
    assert not any(word in out for word in RECIPE), out  # a hint names the mistake, not the construction


# 3.1 (b) --------------------------------------------------------------------------------------
def pairs_by_mask(T, window):  # build the band and count its True entries
    i = torch.arange(T)
    return int(((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)).sum())


def pairs_by_counting(T, window):  # query i sees keys max(0, i - window + 1) .. i
    return sum(i - max(0, i - window + 1) + 1 for i in range(T))


def pairs_closed_form(T, window):  # the first w - 1 queries see 1, 2, .., w - 1 keys
    w = min(window, T)
    return T * w - w * (w - 1) / 2


WRONG_PAIRS = [
    (lambda T, w: T * w, "that is T * window"),
    (lambda T, w: T * (T + 1) // 2, "plain causal count"),
    (lambda T, w: T * w - w * (w - 1) // 2, "clamp the window to T"),  # no min(window, T)
    (lambda T, w: pairs_closed_form(T, w + 1), "one key more"),
    (lambda T, w: pairs_closed_form(T, w) - T, "each query also sees itself"),
    (lambda T, w: T * T - pairs_closed_form(T, w), "the pairs the mask HIDES"),
    (lambda T, w: T * T, "attention without any mask"),
    (lambda T, w: T if w == 1 else pairs_closed_form(T, w) + 1, "for T = 6, window = 3 you"),
    (lambda T, w: 1 if w == 1 else pairs_closed_form(T, w), "each query sees only itself"),
    (lambda T, w: T * w - w * (w - 1) // 2 + 2 * (w > T), "(window >= T)"),
    (lambda T, w: str(pairs_closed_form(T, w)), "without quotes"),
]


@pytest.mark.parametrize("answer", [pairs_by_counting, pairs_closed_form])
def test_window_pairs_accepts(capsys, answer):
    assert ex.check_window_pairs(answer).passed is True
    assert capsys.readouterr().out.startswith("correct!")


@pytest.mark.parametrize("answer,hint", WRONG_PAIRS, ids=[h for _, h in WRONG_PAIRS])
def test_window_pairs_hints(capsys, answer, hint):
    result = ex.check_window_pairs(answer)
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out


def test_window_pairs_building_the_mask_is_told_to_count_instead(capsys):
    result = ex.check_window_pairs(pairs_by_mask)  # right on small T, 10^12 entries at T = 10^6
    out = capsys.readouterr().out
    assert result.passed is False and "does not fit in memory" in out, out


def test_window_pairs_mistakes_are_told_apart_on_the_hidden_cases():
    right = [pairs_by_counting(T, w) for T, w in nb03._PAIRS_CASES]
    columns = list(zip(*(nb03._pairs_candidates(T, w) for T, w in nb03._PAIRS_CASES), strict=True))
    values = [[v for _, v in column] for column in columns]
    for a, va in enumerate(values):
        assert va != right
        for vb in values[a + 1:]:
            assert va != vb


def test_window_pairs_counts_the_module_mask():  # the reference against the notebook's buffer
    for T, w in ((6, 3), (4, 6), (9, 1)):
        assert nb03._pairs(T, w) == int(Window(3, 2, T, w).mask.sum()) == pairs_by_mask(T, w)


# 3.1 (c) --------------------------------------------------------------------------------------
def reach_measured(window, layers, T=12, d=3):  # stack the test's own Window module, move tokens
    torch.manual_seed(window * 10 + layers)
    stack = torch.nn.Sequential(*(Window(d, d, T, window) for _ in range(layers)))
    x = torch.randn(1, T, d, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        base = stack(x)[0]
        reach = 0
        for j in range(T):
            x_j = x.clone()
            x_j[0, j] += 1.0
            moved = (stack(x_j)[0] - base).abs().amax(dim=-1)
            reach = max(reach, max(i - j for i in range(T) if moved[i] > 0))
    return reach


def reach_by_walking(window, layers):  # follow the band back one layer at a time
    back = 0
    for _ in range(layers):
        back += window - 1
    return back


WRONG_REACH = [
    (lambda w, L: L * w, "yours counts w per layer"),
    (lambda w, L: w - 1, "that is the reach of one layer"),
    (lambda w, L: (w - 1) ** L, "they do not multiply"),
    (lambda w, L: w ** L, "they do not multiply"),
    (lambda w, L: L * (w - 1) + 1, "itself included"),
    (lambda w, L: 0 if w == 1 else L * (w - 1) + 2, "follow that dependence back"),
    (lambda w, L: 1 if w == 1 else L * (w - 1), "with a window of one key"),
    (lambda w, L: str(L * (w - 1)), "without quotes"),
]


@pytest.mark.parametrize("window,layers", [(3, 2), (2, 3), (4, 1), (1, 2)])
def test_stacked_reach_reference_matches_a_measurement(window, layers):
    assert nb03._reach(window, layers) == reach_measured(window, layers)


def test_stacked_reach_accepts(capsys):
    assert ex.check_stacked_reach(reach_by_walking).passed is True
    assert capsys.readouterr().out.startswith("correct!")
    assert ex.check_stacked_reach(stub).passed is None
    assert capsys.readouterr().out.startswith("not attempted yet")


@pytest.mark.parametrize("answer,hint", WRONG_REACH, ids=[h for _, h in WRONG_REACH])
def test_stacked_reach_hints(capsys, answer, hint):
    result = ex.check_stacked_reach(answer)
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out


def test_stacked_reach_mistakes_are_told_apart_on_the_hidden_cases():
    right = [reach_by_walking(w, L) for w, L in nb03._REACH_CASES]
    columns = list(zip(*(nb03._reach_candidates(w, L) for w, L in nb03._REACH_CASES), strict=True))
    values = [[v for _, v in column] for column in columns]
    for a, va in enumerate(values):
        assert va != right
        for vb in values[a + 1:]:
            assert va != vb


# 3.2 ------------------------------------------------------------------------------------------
def empty_rows_loop(T, p):
    return sum(p ** (i + 1) for i in range(T))  # query i sees i + 1 keys


def empty_rows_closed_form(T, p):
    return torch.tensor(p * (1 - p ** T) / (1 - p))  # a geometric series, as a tensor


def empty_rows_simulated(T, p):
    rng = np.random.default_rng(0)
    keep = rng.random((20_000, T, T)) >= p
    allowed = np.tril(np.ones((T, T), dtype=bool))
    return float(((keep & allowed).sum(-1) == 0).sum(-1).mean())


WRONG_EMPTY_ROWS = [
    (lambda T, p: sum(p ** i for i in range(T)), "yours gives query 0 probability 1"),
    (lambda T, p: sum(p ** (i + 2) for i in range(T)), "one key too many"),
    (lambda T, p: T * p ** T, "attention without a mask"),
    (lambda T, p: sum((1 - p) ** (i + 1) for i in range(T)), "probability that a weight is KEPT"),
    (lambda T, p: p ** (T * (T + 1) // 2), "probability that EVERY row is empty"),
    (lambda T, p: 1 - math.prod(1 - p ** (i + 1) for i in range(T)), "at least one row is empty"),
    (lambda T, p: T * p, "not when one is"),
    (lambda T, p: empty_rows_loop(T, p) / T, "expected FRACTION"),
    (lambda T, p: p ** T, "counts only the last query"),
    (empty_rows_simulated, "did you simulate it?"),
    (lambda T, p: empty_rows_loop(T, p) + 0.1, "too large"),
    (lambda T, p: [empty_rows_loop(T, p)] * 2, "should be one number"),
    (lambda T, p: f"{empty_rows_loop(T, p)}", "without quotes"),
]


@pytest.mark.parametrize("answer", [empty_rows_loop, empty_rows_closed_form])
def test_expected_empty_rows_accepts(capsys, answer):
    assert ex.check_expected_empty_rows(answer).passed is True
    assert capsys.readouterr().out.startswith("correct!")


def test_expected_empty_rows_stub(capsys):
    assert ex.check_expected_empty_rows(stub).passed is None
    assert capsys.readouterr().out.startswith("not attempted yet")


@pytest.mark.parametrize("answer,hint", WRONG_EMPTY_ROWS, ids=[h for _, h in WRONG_EMPTY_ROWS])
def test_expected_empty_rows_hints(capsys, answer, hint):
    result = ex.check_expected_empty_rows(answer)
    out = capsys.readouterr().out
    assert result.passed is False and hint in out, out


def test_expected_empty_rows_mistakes_are_told_apart_on_the_hidden_cases():
    right = [empty_rows_loop(T, p) for T, p in nb03._EMPTY_CASES]
    columns = list(zip(*(nb03._empty_rows_candidates(T, p) for T, p in nb03._EMPTY_CASES),
                       strict=True))
    values = [np.array([v for _, v in column]) for column in columns]
    for a, va in enumerate(values):
        assert not np.allclose(va, right, rtol=1e-6, atol=1e-9)
        for vb in values[a + 1:]:
            assert not np.allclose(va, vb, rtol=1e-6, atol=1e-9)


def test_expected_empty_rows_matches_a_measurement():  # the formula against nn.Dropout itself
    torch.manual_seed(0)
    T, p, n = 6, 0.5, 40_000
    weights = torch.softmax(torch.randn(T, T).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    dropped = torch.nn.functional.dropout(weights.expand(n, T, T), p=p, training=True)
    measured = (dropped == 0).all(dim=-1).sum(dim=-1).double().mean().item()
    assert abs(measured - empty_rows_loop(T, p)) < 0.03  # sd of the mean is about 0.004


# 3.3 ------------------------------------------------------------------------------------------
def leaky_causal_attention(Q, K, V):  # the buggy code shown in notebook 03, typed again
    T, d_k = Q.shape
    allowed = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(allowed, Q @ K.T / np.sqrt(d_k), -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=0, keepdims=True)) @ V  # a sum over the queries: the leak


def outputs_moved_by_last_token(fn, T=6):  # measured, the way the notebook's section 7 does it
    rng = np.random.default_rng(7)
    Q, K, V = rng.normal(size=(T, 3)), rng.normal(size=(T, 3)), rng.normal(size=(T, 2))
    Q2, K2, V2 = Q.copy(), K.copy(), V.copy()
    for a in (Q2, K2, V2):
        a[-1] += 1.0  # the whole last token changes: its query, key and value
    moved = np.abs(fn(Q2, K2, V2) - fn(Q, K, V)).max(axis=-1)
    return [i for i in range(T) if moved[i] > 1e-9]


MOVED = outputs_moved_by_last_token(leaky_causal_attention)


def test_the_prediction_is_what_the_buggy_code_does():
    assert MOVED == [0, 1, 2, 3, 4, 5]
    assert outputs_moved_by_last_token(causal_hiding(lambda i, j: j > i)) == [5]


def test_the_buggy_code_has_a_correct_mask_and_rows_that_do_not_sum_to_one():
    rng = np.random.default_rng(4)
    Q, K = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    weights = leaky_causal_attention(Q, K, np.eye(5))  # V = I: the output is the weights
    assert np.array_equal(weights != 0, np.tril(np.ones((5, 5), dtype=bool)))  # mask looks right
    assert np.allclose(weights.sum(axis=0), 1.0) and not np.allclose(weights.sum(axis=1), 1.0)


def test_the_notebook_shows_the_bug_the_checker_knows():
    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks"
                     / "03_causal_attention.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                and "def leaky_causal_attention" in "".join(c["source"]))
    scope = {"np": np}  # the notebook imports NumPy in an earlier cell
    exec(cell, scope)  # noqa: S102 - the notebook's own cell
    rng = np.random.default_rng(3)
    Q, K, V = rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    assert np.allclose(scope["leaky_causal_attention"](Q, K, V),
                       nb03._leaky_causal_attention(Q, K, V))
    assert np.allclose(scope["leaky_causal_attention"](Q, K, V), leaky_causal_attention(Q, K, V))
    assert outputs_moved_by_last_token(scope["leaky_causal_attention"]) == MOVED


def causal_hiding(hidden, softmax=course_softmax, scale=None):
    def causal_attention(Q, K, V):
        T, d_k = Q.shape
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        scores = Q @ K.T / (np.sqrt(d_k) if scale is None else scale(Q, V))
        return softmax(np.where(hidden(i, j), -np.inf, scores), axis=-1) @ V
    return causal_attention


def causal_changes_K(Q, K, V):
    K *= 1.0  # harmless value, but an in-place write all the same
    K[0, 0] += 0.0
    K -= K.mean()
    return causal_hiding(lambda i, j: j > i)(Q, K, V)


def causal_triu(k):
    def causal_attention(Q, K, V):
        T, d_k = Q.shape
        future = np.triu(np.ones((T, T), dtype=bool), k=k)
        return course_softmax(np.where(future, -np.inf, Q @ K.T / np.sqrt(d_k)), axis=-1) @ V
    return causal_attention


@pytest.mark.parametrize("answer,hint", [
    (causal_hiding(lambda i, j: j > i), "correct!"),
    (causal_triu(1), "correct!"),
    (leaky_causal_attention, "still the original bug"),
    (causal_triu(2), "your mask hides j >= i + 2 only"),
    (causal_triu(3), "your mask hides j >= i + 3 only"),
    (causal_hiding(lambda i, j: j < i), "your mask hides the past"),  # tril(k=-1) as the hidden set
    (causal_hiding(lambda i, j: j >= i), "np.triu(..., k=0) marks j >= i"),  # triu(k=0)
    (causal_hiding(lambda i, j: j >= i, softmax=np_softmax), "np.triu(..., k=0) marks j >= i"),
    (causal_hiding(lambda i, j: j <= i), "inverted mask"),  # tril(k=0) used as the hidden set
    (causal_hiding(lambda i, j: j <= i, softmax=np_softmax), "inverted mask"),
    (causal_hiding(lambda i, j: j > i + 3), "future leaked: the output of token 1 changed"),
    (causal_hiding(lambda i, j: j > i, scale=lambda Q, V: np.sqrt(V.shape[1])),
     "you scaled by sqrt(d_v) = sqrt(3)"),
    (causal_hiding(lambda i, j: j > i, scale=lambda Q, V: Q.shape[1]),
     "you divided by d_k = 4; divide by its square root"),
    (causal_hiding(lambda i, j: j >= i, softmax=np_softmax, scale=lambda Q, V: 1.0),
     "Query i must at least see itself (keep the diagonal)"),  # two mistakes: the NaN one is told
    (causal_changes_K, "changed K in place"),
    (causal_hiding(lambda i, j: j > i, softmax=lambda x, axis: course_softmax(x, axis=0)),
     "softmax over the wrong axis"),  # a proper column softmax: a different leak, its own hint
])
def test_causal_bug_fix_hints(capsys, answer, hint):
    result = ex.check_causal_bug_fix(MOVED, answer)
    out = capsys.readouterr().out
    assert hint in out, out
    assert result.passed is (hint == "correct!")


@pytest.mark.parametrize("prediction,hint", [
    ([0, 1, 2, 3, 4, 5], "correct!"),
    ((5, 4, 3, 2, 1, 0), "correct!"),
    (np.arange(6), "correct!"),
    (torch.arange(6), "correct!"),
    (set(range(6)), "correct!"),
    (outputs_moved_by_last_token(causal_hiding(lambda i, j: j > i)), "what a correct causal"),
    (5, "what a correct causal attention does"),
    ([4, 5], "a mask one step off"),
    ([0, 1, 2, 3, 4], "output 5 moves too"),
    ([1, 2, 3, 4, 5, 6], "indices are 0-based"),
    ([3, 4, 5], "trace each weight back"),
    ([0, 1], "trace each weight back"),
    ([-1, 4, 5], "numbered 0 .. 5"),
    ([True] * 6, "not one True/False per output"),
    ([4.5, 5], "whole numbers"),
    ("0, 1, 2, 3, 4, 5", "not the text"),
])
def test_moved_outputs_prediction(capsys, prediction, hint):
    result = ex.check_causal_bug_fix(prediction, causal_triu(1))
    out = capsys.readouterr().out
    assert hint in out, out
    assert result.passed is (hint == "correct!")


def test_no_prediction_hint_gives_the_answer_away(capsys):
    for wrong in ([5], [4, 5], [0, 1, 2, 3, 4], [3, 4, 5], [0, 1]):
        ex.check_causal_bug_fix(wrong, causal_triu(1))
        hint = capsys.readouterr().out.split(":", 2)[-1]  # after "moved_outputs = [...]:"
        assert "0 .. 5" not in hint.replace("numbered 0 .. 5", "") and "every output" not in hint
        assert "all six" not in hint and "[0, 1, 2, 3, 4, 5]" not in hint, hint


def test_causal_bug_fix_called_the_old_way(capsys):  # only the function: the order is named
    assert ex.check_causal_bug_fix(causal_triu(1)).passed is False
    assert "pass your prediction first" in capsys.readouterr().out


def test_causal_bug_fix_not_attempted(capsys):
    assert ex.check_causal_bug_fix(None, stub).passed is None
    assert "moved_outputs is still None" in capsys.readouterr().out
    assert ex.check_causal_bug_fix(MOVED, stub).passed is None  # the prediction alone
    assert "stub still returns None" in capsys.readouterr().out


def test_an_exception_names_the_input_that_caused_it(capsys):
    ex.check_expected_empty_rows(lambda T, p: 1 / (T - 1))
    assert "called with T = 1, p = 0.3" in capsys.readouterr().out

    def broken_forward(d_in, d_out, context_length, window):
        module = Window(d_in, d_out, context_length, window)
        module.forward = lambda x: x @ torch.ones(5, 5)
        return module

    ex.check_sliding_window_attention(broken_forward)
    assert "on x of shape (2, 6, 3), context_length = 8, window = 3" in capsys.readouterr().out

    def causal_needs_square(Q, K, V):
        return np.linalg.inv(V) @ V

    ex.check_causal_bug_fix(MOVED, causal_needs_square)
    assert "on Q, K of shape (5, 4) and V of shape (5, 3)" in capsys.readouterr().out


# 3.4 ------------------------------------------------------------------------------------------
PAD_ROWS = [(0, 0), (0, 1)]  # sequence 0 of the shown batch is left-padded by 2
PAD_CHANGE = {"left": True, "right": False}  # does dropping the padding mask move a real output?


def padded_ok(key_is_real):  # a loop, independent of the checker's broadcast reference
    B, T = key_is_real.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                out[b, i, j] = bool(key_is_real[b, j])
    return out


def _tri(key_is_real):
    T = key_is_real.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("answer, phrase", [
    (lambda r: padded_ok(r).numpy(), "correct!"),
    (lambda r: padded_ok(r).int(), "boolean mask"),
    (lambda r: ~padded_ok(r), "marks the forbidden pairs"),
    (lambda r: _tri(r) & ~r[:, None, :], "inverted padding"),
    (lambda r: _tri(r).expand(r.shape[0], -1, -1), "padding is ignored"),
    (lambda r: _tri(r) & r[:, :, None] & r[:, None, :], "padding queries as well"),
    (lambda r: _tri(r) | r[:, None, :], "combined with `or`"),
    (lambda r: _tri(r).T & r[:, None, :], "triangle is the future"),
    (lambda r: _tri(r), "one (T, T) mask per sequence"),
])
def test_padded_mask_hints(capsys, answer, phrase):
    ex.check_padded_causal_mask(PAD_ROWS, PAD_CHANGE, answer)
    out = capsys.readouterr().out
    assert phrase in out, out


@pytest.mark.parametrize("rows, change, phrase", [
    ([(0, 0), (0, 1), (1, 3), (1, 4)], PAD_CHANGE, "padding position"),
    ([], PAD_CHANGE, "no row is empty"),
    ([(0, 0)], PAD_CHANGE, "off by one"),
    ([(0, 0), (0, 1), (0, 2)], PAD_CHANGE, "off by one"),
    ([(1, 0)], PAD_CHANGE, "keep the query only if"),
    ("0, 1", PAD_CHANGE, "pairs"),
    (PAD_ROWS, None, "now predict real_outputs_change"),
    (PAD_ROWS, {"left": None, "right": None}, "now predict real_outputs_change"),
    (PAD_ROWS, {"left": True, "right": None}, "['right'] is still None"),
    (PAD_ROWS, {"left": False, "right": False}, "in the left-padded sequence"),
    (PAD_ROWS, {"left": True, "right": True}, "already hides needs no second mask"),
    (PAD_ROWS, {"left": False, "right": True}, "['left'] = False"),
    (PAD_ROWS, {"left": "yes", "right": False}, "should be True or False"),
    (PAD_ROWS, {"-inf": "nan", "-1e9": "uniform", "sdpa": "zeros"}, "a dict with the keys"),
    (PAD_ROWS, {"left": True}, "a dict with the keys"),
])
def test_padding_prediction_is_graded_before_the_function(capsys, rows, change, phrase):
    """A wrong prediction is reported even with a correct function, and no hint lists the rows."""
    result = ex.check_padded_causal_mask(rows, change, padded_ok)
    out = capsys.readouterr().out
    assert phrase in out, out
    assert result.passed is not True
    assert "(0, 0), (0, 1)]" not in out.split(":", 2)[-1] or rows == PAD_ROWS, out


def test_padding_prediction_matches_pytorch():
    """The graded predictions, measured independently with PyTorch's attention."""
    real = torch.tensor(nb03._PAD_REAL)
    mask = padded_ok(real)
    empty = {(b, i) for b in range(2) for i in range(5) if not mask[b, i].any()}
    assert empty == set(PAD_ROWS)
    q, k, v = torch.randn(3, 2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal_only, padded = sdpa(q, k, v, is_causal=True), sdpa(q, k, v, attn_mask=mask)
    for b, side in enumerate(nb03._SIDES):
        change = (causal_only[b, real[b]] - padded[b, real[b]]).abs().max().item()
        assert (change > 1e-3) == PAD_CHANGE[side], (side, change)
    assert sdpa(q, k, v, attn_mask=mask)[0, :2].eq(0).all()  # the fully masked rows: zeros


def test_padding_prediction_correct_passes(capsys):
    assert ex.check_padded_causal_mask(PAD_ROWS, PAD_CHANGE, padded_ok).passed is True
    assert capsys.readouterr().out.startswith("correct!")
