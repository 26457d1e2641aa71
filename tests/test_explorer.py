"""shared.explorer: the numbers it draws are the attention weights at the slider's temperature
(checked against PyTorch's softmax and SDPA), the controls redraw them, and its plain-text form
holds nothing volatile."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from shared.explorer import AttentionExplorer, draw_explorer, explorer_state  # noqa: E402

TOKENS = ["Your", "journey", "starts", "with", "one", "step"]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def qkv(T=6, d_k=2, d_v=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, d_k, generator=g, dtype=torch.float64),
            torch.randn(T, d_k, generator=g, dtype=torch.float64),
            torch.randn(T, d_v, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("temperature", [0.05, 1.0, math.sqrt(2), 7.5])
def test_state_is_attention_at_that_temperature(temperature):
    Q, K, V = qkv()
    state = explorer_state(Q, K, V, temperature, query=3)
    expected = torch.softmax(Q @ K.T / temperature, dim=-1)
    np.testing.assert_allclose(state["weights"], expected.numpy(), atol=1e-12)
    z = F.scaled_dot_product_attention(Q, K, V, scale=1 / temperature)[3]
    np.testing.assert_allclose(state["context"], z.numpy(), atol=1e-12)
    np.testing.assert_allclose(state["row"], expected[3].numpy(), atol=1e-12)
    p = expected[3]
    assert state["entropy"] == pytest.approx(float(-(p * p.log()).sum()), abs=1e-12)


def test_sqrt_dk_is_scaled_dot_product_attention_and_extremes_behave():
    Q, K, V = qkv(d_k=4, d_v=3)
    state = explorer_state(Q, K, V, 2.0, query=0)  # sqrt(4)
    np.testing.assert_allclose(state["context"],
                               F.scaled_dot_product_attention(Q, K, V)[0].numpy(), atol=1e-12)
    cold = explorer_state(Q, K, V, 1e-4, query=0)  # every weight on the top score
    top = int(torch.argmax(Q[0] @ K.T))
    assert cold["row"][top] == pytest.approx(1.0, abs=1e-9)
    hot = explorer_state(Q, K, V, 1e6, query=0)  # uniform: the context is the mean value
    np.testing.assert_allclose(hot["context"], V.mean(0).numpy(), atol=1e-5)
    assert hot["entropy"] == pytest.approx(math.log(6), abs=1e-6)


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=0.0), "temperature must be a positive"),
    (dict(temperature=float("nan")), "temperature must be a positive"),
    (dict(query=6), r"query must be a row index in 0..5; got 6"),
    (dict(query=True), "query must be a row index"),
])
def test_bad_settings_are_named(bad, message):
    Q, K, V = qkv()
    kwargs = {"temperature": 1.0, "query": 0, **bad}
    with pytest.raises(ValueError, match=message):
        explorer_state(Q, K, V, **kwargs)


def test_bad_shapes_are_named():
    Q, K, V = qkv()
    with pytest.raises(ValueError, match=r"same width d_k; got Q \(6, 2\) and K \(6, 3\)"):
        explorer_state(Q, torch.randn(6, 3), V, 1.0, 0)
    with pytest.raises(ValueError, match=r"one row per key; got K \(6, 2\) and V \(5, 2\)"):
        explorer_state(Q, K, V[:5], 1.0, 0)
    with pytest.raises(ValueError, match=r"must be 2-D"):
        explorer_state(Q[None], K, V, 1.0, 0)


def test_controls_redraw_the_state():
    pytest.importorskip("ipywidgets")
    Q, K, V = qkv()
    ex = AttentionExplorer(Q, K, V, TOKENS, query=1)
    assert ex.state["temperature"] == pytest.approx(math.sqrt(2))
    ex.slider.value = 0.5  # what dragging the slider does
    np.testing.assert_allclose(ex.state["weights"],
                               torch.softmax(Q @ K.T / 0.5, dim=-1).numpy(), atol=1e-12)
    assert ex.state["query"] == 1
    ex.picker.value = 4
    np.testing.assert_allclose(ex.state["context"],
                               F.scaled_dot_product_attention(Q, K, V, scale=2.0)[4].numpy(),
                               atol=1e-12)
    state = ex.set(temperature=3.0, query=2)
    assert (state["temperature"], state["query"]) == (3.0, 2)


def test_plain_text_form_is_fixed():
    pytest.importorskip("ipywidgets")
    Q, K, V = qkv()
    bundle = AttentionExplorer(Q, K, V, TOKENS)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    assert text.startswith("attention explorer") and "0x" not in text and "model" not in text


def test_widget_view_without_ipywidgets_8_repr(monkeypatch):
    """ipywidgets 7 (Colab's) widgets have no _repr_mimebundle_: the view is built by hand."""
    pytest.importorskip("ipywidgets")
    Q, K, V = qkv()
    ex = AttentionExplorer(Q, K, V, TOKENS)
    monkeypatch.setattr(type(ex.panel), "_repr_mimebundle_", None, raising=False)
    view = ex._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]
    assert view == {"version_major": 2, "version_minor": 0, "model_id": ex.panel.model_id}


def test_figure_outlines_the_query_row_and_labels_the_colour_bar():
    Q, K, V = qkv()
    fig = draw_explorer(Q, K, V, TOKENS, 0.7, query=2)
    ax_w, ax_z, cbar = fig.axes
    assert cbar.get_ylabel() == r"weight $\alpha_{ij}$"
    (outline,) = [p for p in ax_w.patches if p.get_edgecolor()[0] > 0.8]
    assert outline.get_xy() == (-0.5, 1.5) and outline.get_height() == 1
    assert [t.get_text() for t in ax_w.get_yticklabels()] == TOKENS
    assert "'starts'" in ax_z.get_title()
    texts = {t.get_text() for t in ax_w.texts}
    expected = torch.softmax(Q @ K.T / 0.7, dim=-1)
    assert f"{expected[2, 0]:.2f}" in texts


def test_figure_for_wider_values_draws_bars():
    Q, K, V = qkv(d_v=5)
    fig = draw_explorer(Q, K, V, TOKENS, 1.0, query=0)
    bars = fig.axes[1].patches
    assert len(bars) == 5
    z = explorer_state(Q, K, V, 1.0, 0)["context"]
    np.testing.assert_allclose([b.get_height() for b in bars], z, atol=1e-12)


def test_the_slider_grid_runs_through_the_default_and_round_trips_keep_the_state():
    """The browser snaps a slider's value to its grid: the default must lie on it, and a value
    that comes back from the browser unchanged (up to float rounding) must not redraw."""
    pytest.importorskip("ipywidgets")
    Q, K, V = qkv(d_k=3)
    ex = AttentionExplorer(Q, K, V, TOKENS, query=1)
    s = ex.slider
    steps = (math.log10(ex.default_temperature) - s.min) / s.step
    assert steps == pytest.approx(round(steps), abs=1e-9)
    assert 10 ** s.min <= 0.031 and 10 ** s.max >= 29.0  # the ends of TEMPERATURE_RANGE, on the grid
    before = ex.state
    s.value = ex.default_temperature * (1 + 1e-13)
    assert ex.state is before
    s.value = 0.1
    assert ex.state is not before and ex.state["temperature"] == 0.1
