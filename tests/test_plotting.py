"""shared.plotting draws what it promises: labels in order, masked cells distinct, one axes per head."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from shared.plotting import (  # noqa: E402
    label_points,
    log_ticks,
    plot_attention,
    plot_block_sweep,
    plot_bottleneck,
    plot_gpu_record,
    plot_heads,
    plot_online_softmax,
    plot_times_by_length,
    plot_word_links,
    print_table,
)

TOKENS = ["Your", "journey", "starts", "with"]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def weights_4x4() -> np.ndarray:
    w = np.tril(np.arange(1, 17, dtype=float).reshape(4, 4))
    return w / w.sum(axis=1, keepdims=True)


def labels(ticklabels) -> list[str]:
    return [t.get_text() for t in ticklabels]


def hatched(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]


def cell_texts(ax) -> dict[tuple[int, int], str]:
    """Annotations by (row, col): seaborn writes each number at the centre of its cell."""
    return {(int(t.get_position()[1]), int(t.get_position()[0])): t.get_text() for t in ax.texts}


def test_token_labels_on_both_axes_in_order():
    ax = plot_attention(weights_4x4(), TOKENS)
    assert labels(ax.get_xticklabels()) == TOKENS  # keys across
    assert labels(ax.get_yticklabels()) == TOKENS  # queries down
    assert "key" in ax.get_xlabel() and "quer" in ax.get_ylabel()


def test_colour_bar_label_only_when_asked():
    ax = plot_attention(weights_4x4(), TOKENS)
    assert ax.collections[0].colorbar.ax.get_ylabel() == ""  # the default draws no label
    ax = plot_attention(weights_4x4(), TOKENS, mask=np.tril(np.ones((4, 4), dtype=bool)),
                        cbar_label="attention weight")
    assert ax.collections[0].colorbar.ax.get_ylabel() == "attention weight"
    _, (left, right) = plt.subplots(1, 2)
    plot_attention(weights_4x4(), TOKENS, ax=left, cbar_label="score")
    assert left.collections[0].colorbar.ax.get_ylabel() == "score"
    plot_attention(weights_4x4(), TOKENS, ax=right, cbar=False, cbar_label="ignored")
    assert right.collections[0].colorbar is None


def test_rectangular_weights_use_separate_query_and_key_labels():
    w = np.full((2, 3), 1 / 3)
    ax = plot_attention(w, ["a", "b"], ["x", "y", "z"], title="cross")
    assert labels(ax.get_yticklabels()) == ["a", "b"]
    assert labels(ax.get_xticklabels()) == ["x", "y", "z"]
    assert ax.get_title() == "cross"


def test_cells_hold_their_own_weight():
    w = weights_4x4()
    texts = cell_texts(plot_attention(w, TOKENS))
    assert texts[(3, 0)] == f"{w[3, 0]:.2f}" and texts[(1, 1)] == f"{w[1, 1]:.2f}"
    assert texts[(2, 1)] == f"{w[2, 1]:.2f}"  # row = query 2, column = key 1 (not transposed)


def test_blank_diagonal_drops_only_the_diagonal_numbers():
    w = weights_4x4()
    texts = cell_texts(plot_attention(w, TOKENS, blank_diagonal=True))
    assert [texts[(i, i)] for i in range(4)] == [""] * 4
    assert all(texts[(i, j)] == f"{w[i, j]:.2f}" for i in range(4) for j in range(4) if i != j)
    assert all(t != "" for t in cell_texts(plot_attention(w, TOKENS)).values())  # default: all


def test_centred_diverging_scale_keeps_near_zero_numbers_readable():
    # vmin=-1, vmax=1 on RdBu_r: 0 is the white middle, so its number must be dark, while the
    # saturated ends (dark red / dark blue) get white text. Before vmin existed, the scale ran from 0 and
    # a later set_clim(-1, 1) left white text on the near-white cells.
    w = np.array([[0.0, 0.01, -0.95], [0.95, -0.01, 0.02], [0.0, 0.0, 0.0]])
    ax = plot_attention(w, ["a", "b", "c"], vmin=-1.0, vmax=1.0, cmap="RdBu_r")
    assert ax.collections[0].get_clim() == (-1.0, 1.0)
    colours = {(int(t.get_position()[1]), int(t.get_position()[0])): matplotlib.colors.to_rgb(t.get_color())
               for t in ax.texts}
    dark = [colours[(0, 1)], colours[(1, 1)], colours[(1, 2)]]
    assert all(max(c) < 0.5 for c in dark)  # near-white cells: dark text
    assert colours[(0, 2)] == (1.0, 1.0, 1.0) and colours[(1, 0)] == (1.0, 1.0, 1.0)  # saturated: white
    assert plot_attention(weights_4x4(), TOKENS).collections[0].get_clim() == (0.0, 1.0)  # default kept


def test_masked_cells_are_hatched_and_not_drawn():
    w = weights_4x4()
    mask = np.tril(np.ones((4, 4), dtype=bool))
    ax = plot_attention(w, TOKENS, mask=mask)
    rects = hatched(ax)
    assert len(rects) == int((~mask).sum()) == 6
    assert {(int(r.get_y()), int(r.get_x())) for r in rects} == set(zip(*np.nonzero(~mask), strict=True))
    texts = cell_texts(ax)
    assert len(texts) == int(mask.sum())  # no number in a masked cell
    assert all(mask[i, j] for i, j in texts)
    values = ax.collections[0].get_array()
    assert np.ma.getmaskarray(values).reshape(4, 4).tolist() == (~mask).tolist()


def test_no_mask_means_no_hatching():
    assert hatched(plot_attention(weights_4x4(), TOKENS)) == []


def test_accepts_torch_tensors():
    w = torch.tensor(weights_4x4(), requires_grad=True)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    ax = plot_attention(w, TOKENS, mask=mask)
    assert len(hatched(ax)) == 6


@pytest.mark.parametrize("H, ncols, grid", [(1, 4, 1), (2, 4, 2), (5, 4, 8), (6, 3, 6)])
def test_plot_heads_one_axes_per_head(H, ncols, grid):
    w = np.broadcast_to(weights_4x4(), (H, 4, 4))
    fig = plot_heads(w, TOKENS, ncols=ncols)
    assert len(fig.axes) == grid
    visible = [ax for ax in fig.axes if ax.axison]
    assert len(visible) == H
    assert [ax.get_title() for ax in visible] == [f"head {h}" for h in range(H)]
    assert all(labels(ax.get_xticklabels()) == TOKENS for ax in visible)


def test_plot_heads_passes_each_head_its_own_mask_and_title():
    w = np.stack([weights_4x4(), np.full((4, 4), 0.25)])
    mask = np.ones((2, 4, 4), dtype=bool)
    mask[1] = np.tril(mask[1])
    fig = plot_heads(w, TOKENS, mask=mask, titles=["full", "causal"])
    a, b = fig.axes
    assert (a.get_title(), b.get_title()) == ("full", "causal")
    assert len(hatched(a)) == 0 and len(hatched(b)) == 6


def test_plot_heads_shared_colorbar_only_when_asked():
    w = np.broadcast_to(weights_4x4(), (2, 4, 4))
    assert len(plot_heads(w, TOKENS).axes) == 2
    fig = plot_heads(w, TOKENS, cbar=True)
    assert len(fig.axes) == 3  # two panels + one colour bar
    assert fig.axes[-1].get_ylabel() == "attention weight"


def test_plot_heads_vmax_none_puts_every_panel_on_one_scale():
    w = np.stack([weights_4x4(), 0.5 * weights_4x4()])
    fig = plot_heads(w, TOKENS, vmax=None, cbar=True)
    limits = {ax.collections[0].get_clim() for ax in fig.axes[:2]}
    assert limits == {(0.0, float(w.max()))}


def test_plot_bottleneck_draws_both_diagrams_with_the_given_weights():
    words = ["Your", "journey", "starts"]
    fig = plot_bottleneck(words, [0.2, 0.5, 0.3], decoder_steps=2)
    left, right = fig.axes
    assert "bottleneck" in left.get_title() and "every state" in right.get_title()
    assert "$c = h_{3}$" in {t.get_text() for t in left.texts}  # the decoder's c is h_T, T = 3
    for ax in (left, right):
        assert [w for w in words if w in {t.get_text() for t in ax.texts}] == words
    printed = [t.get_text() for t in right.texts if t.get_text().startswith("0.")]
    assert printed == ["0.20", "0.50", "0.30"]
    widths = [a.arrow_patch.get_linewidth() for a in right.texts if hasattr(a, "arrow_patch")
              and a.arrow_patch is not None]
    assert widths[1] > widths[2] > widths[0]  # the thickest arrow carries the largest weight


def test_plot_word_links_bolds_the_words_and_draws_one_arrow_each():
    words = ["it", "was", "the", "animal"]
    ax = plot_word_links(words, query=0, strong=3, weak=2, title="t")
    texts = {t.get_text(): t for t in ax.texts}
    assert texts["it"].get_fontweight() == "bold" and texts["animal"].get_fontweight() == "bold"
    assert texts["the"].get_fontweight() == "normal"
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert len(arrows) == 2
    no_weak = plot_word_links(words, query=0, strong=3)
    assert len([t for t in no_weak.texts if getattr(t, "arrow_patch", None) is not None]) == 1


@pytest.mark.parametrize("query, strong, weak", [(7, 1, 5), (1, 7, 5), (4, 0, 8)])
def test_plot_word_links_labels_touch_no_arrow(query, strong, weak):
    """The notebook's case ("it" -> "animal", "street"), the mirror image and a weak arc longer
    than the strong one: neither label's box crosses either arc."""
    words = ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too"]
    ax = plot_word_links(words, query=query, strong=strong, weak=weak, strong_label="strong: who?")
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    arrows = [t.arrow_patch for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    labels = [t for t in ax.texts if t.get_text() in ("strong: who?", "weak")]
    assert len(arrows) == 2 and len(labels) == 2
    for label in labels:
        box = label.get_window_extent(renderer)
        for arrow in arrows:
            path = arrow.get_transform().transform_path(arrow.get_path())
            assert not path.intersects_bbox(box, filled=False), (label.get_text(), box)
    plt.close("all")


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: plot_attention(np.zeros((2, 3, 3))), ValueError, r"2-D \(T_q, T_k\); got shape \(2, 3, 3\).*plot_heads"),
        (lambda: plot_attention(np.zeros(3)), ValueError, r"got shape \(3,\)"),
        (lambda: plot_attention(np.zeros((3, 3)), ["a", "b"]), ValueError, "query_tokens has 2 labels but the weights have 3"),
        (lambda: plot_attention(np.zeros((2, 3)), ["a", "b"], ["x"]), ValueError, "key_tokens has 1 labels but the weights have 3"),
        (lambda: plot_attention(np.zeros((3, 3)), mask=np.ones((3, 3))), TypeError, "mask must be boolean"),
        (lambda: plot_attention(np.zeros((3, 3)), mask=np.ones((2, 3), dtype=bool)), ValueError, r"mask of shape \(2, 3\) does not broadcast"),
        (lambda: plot_attention(np.array([["a"]])), TypeError, "numeric"),
        (lambda: plot_heads(np.zeros((3, 3))), ValueError, r"3-D \(num_heads, T_q, T_k\); got shape \(3, 3\)"),
        (lambda: plot_heads(np.zeros((1, 2, 3, 3))), ValueError, r"drop the batch dimension"),
        (lambda: plot_heads(np.zeros((2, 3, 3)), titles=["one"]), ValueError, "titles has 1 entries but there are 2 heads"),
        (lambda: plot_bottleneck(["a", "b"], [0.5]), ValueError, r"one entry per word: 2 words, got weights of shape \(1,\)"),
        (lambda: plot_bottleneck(["a", "b"], [0.5, -0.1]), ValueError, "non-negative"),
        (lambda: plot_word_links(["a", "b"], query=0, strong=2), ValueError, r"strong must be a word index in 0..1; got 2"),
        (lambda: plot_word_links(["a", "b"], query=-1, strong=1), ValueError, "query must be a word index"),
    ],
)
def test_bad_input_raises_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_convex_hull_of_a_square_and_its_centre_is_the_square():
    from shared.plotting import _convex_hull

    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])
    hull = _convex_hull(square)
    corners = {tuple(p) for p in np.round(hull, 12)}
    assert corners == {(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)}


def test_context_vectors_plot_takes_tensors_and_names_bad_input():
    from shared.plotting import plot_context_vectors

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5, 3))
    W = np.exp(X @ X.T)
    Z = (W / W.sum(axis=1, keepdims=True)) @ X  # convex combinations of the rows of X
    ax = plot_context_vectors(torch.tensor(X), torch.tensor(Z), tokens=list("abcde"))
    assert ax.get_title()
    # each token has its own colour, shared by x_i, its arrow, z_i and its label
    inputs, contexts = (c.get_facecolors()[:, :3] for c in ax.collections[:2])  # circles, diamonds
    assert inputs.shape == contexts.shape == (5, 3) and np.array_equal(inputs, contexts)
    assert len({tuple(c) for c in inputs}) == 5
    arrows = [t.arrow_patch for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert [tuple(a.get_edgecolor()[:3]) for a in arrows] == [tuple(c) for c in inputs]
    labels = {t.get_text(): t.get_color() for t in ax.texts if t.get_text() in "abcde"}
    assert [tuple(labels[k][:3]) for k in "abcde"] == [tuple(c) for c in inputs]
    plt.close("all")
    with pytest.raises(ValueError, match=r"X must be \(T, d\) with T >= 3"):
        plot_context_vectors(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="Z must have the shape of X"):
        plot_context_vectors(X, Z[:4])
    with pytest.raises(ValueError, match="labels but X has 5 rows"):
        plot_context_vectors(X, Z, tokens=["a", "b"])


def test_log_ticks_labels_plain_numbers_at_1_2_5():
    fig, ax = plt.subplots()
    ax.loglog([0.1, 1000], [0.5, 50])
    ax.set(xlim=(0.1, 1000), ylim=(0.5, 50))
    log_ticks(ax)
    log_ticks(ax, "x")
    fig.canvas.draw()
    ylabels = [t.get_text() for t in ax.get_yticklabels() if 0.5 <= t.get_position()[1] <= 50]
    assert ylabels == ["0.5", "1", "2", "5", "10", "20", "50"]
    xlabels = [t.get_text() for t in ax.get_xticklabels() if 0.1 <= t.get_position()[0] <= 1000]
    assert xlabels[:4] == ["0.1", "0.2", "0.5", "1"] and xlabels[-1] == "1000"
    with pytest.raises(ValueError, match="axis must be 'x' or 'y'"):
        log_ticks(ax, "z")


def test_log_ticks_with_more_subs_labels_an_axis_under_a_decade():
    fig, ax = plt.subplots()
    ax.semilogy([0, 1], [1.6, 6.5])
    ax.set_ylim(1.6, 6.5)
    log_ticks(ax)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_yticklabels() if 1.6 <= t.get_position()[1] <= 6.5] == ["2", "5"]
    log_ticks(ax, subs=(1, 1.5, 2, 3, 5, 7))
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_yticklabels() if 1.6 <= t.get_position()[1] <= 6.5] == ["2", "3", "5"]
    plt.close(fig)


def test_label_points_keeps_labels_of_a_shared_x_apart():
    fig, ax = plt.subplots()
    texts = label_points(ax, [1, 5, 5, 9], [10, 2, 3, 3], ["alone", "low", "high", "right"], ["C0"] * 4)
    alone, low, high, right = texts
    assert [t.get_text() for t in texts] == ["alone", "low", "high", "right"]
    assert alone.get_ha() == right.get_ha() == "left"  # a dot alone at its x: label on the right
    assert high.get_ha() == "right" and low.get_ha() == "left"  # shared x: on opposite sides
    assert all(t.get_va() == "top" and t.xyann[1] < 0 for t in texts)  # each hangs below its dot
    assert high.xyann[0] < 0 < low.xyann[0]
    assert len(ax.get_lines()) == 4  # one dot per point
    with pytest.raises(ValueError, match="one entry per point"):
        label_points(ax, [1, 2], [1], ["a", "b"], ["C0", "C1"])


def test_label_points_breaks_a_tie_in_height_by_order():
    fig, ax = plt.subplots()
    first, second = label_points(ax, [2, 2], [4, 4], ["a", "b"], ["C0", "C1"])
    assert {first.get_ha(), second.get_ha()} == {"left", "right"}  # never both on the same side


def test_label_points_stacks_labels_of_a_shared_x_in_one_column():
    fig, ax = plt.subplots()
    texts = label_points(ax, [1, 5, 5, 5], [10, 2, 3, 2.5], ["alone", "low", "high\n(two lines)", "mid"],
                         ["C0"] * 4, shared_x="stack")
    alone, low, high, mid = texts
    assert alone.get_ha() == "left" and alone.xyann[0] > 0  # a dot alone: unchanged, to the right
    assert all(t.get_ha() == "right" and t.xyann[0] < 0 for t in (low, high, mid))  # one column, left
    assert high.xy == mid.xy == low.xy == (5, 3)  # all hang from the highest dot of the group
    assert high.xyann[0] <= -15 and high.xyann[1] <= -5  # clear of a 13 pt ring round a dot at that height
    # highest first; each label starts one line (1.25 x 8 pt) below the lines above it: 2, then 3
    assert high.xyann[1] - mid.xyann[1] == pytest.approx(2 * 10) and mid.xyann[1] - low.xyann[1] == pytest.approx(10)
    rings = [line for line in ax.get_lines() if line.get_markerfacecolor() == "none"]
    assert len(ax.get_lines()) == 4 and len(rings) == 2  # the two lower dots of the group are rings
    assert alone.get_bbox_patch() is None and all(t.get_bbox_patch() for t in (low, high, mid))  # boxed
    with pytest.raises(ValueError, match="shared_x must be 'split' or 'stack'"):
        label_points(ax, [1], [1], ["a"], ["C0"], shared_x="left")


def test_zoom_context_vectors_enlarges_every_context_vector_and_the_centroid():
    from shared.plotting import plot_context_vectors, zoom_context_vectors

    rng = np.random.default_rng(1)
    X = rng.normal(size=(5, 3))
    W = np.exp(0.1 * X @ X.T)  # nearly uniform weights: the z_i crowd near the centroid
    Z = (W / W.sum(axis=1, keepdims=True)) @ X
    ax = plot_context_vectors(X, Z, tokens=list("abcde"))
    zoom = zoom_context_vectors(ax, torch.tensor(X), torch.tensor(Z), tokens=list("abcde"),
                                label_offsets={"a": (-10, 5)})
    assert zoom in ax.child_axes
    # the same points as the diamonds of the main panel, in the same colours
    main_diamonds, inset_diamonds = ax.collections[1], zoom.collections[0]
    assert np.allclose(main_diamonds.get_offsets(), inset_diamonds.get_offsets())
    assert np.array_equal(main_diamonds.get_facecolors()[:, :3], inset_diamonds.get_facecolors()[:, :3])
    # the inset's box holds every diamond and the centroid, and is much smaller than the panel's
    (x0, x1), (y0, y1) = zoom.get_xlim(), zoom.get_ylim()
    pts = np.vstack([inset_diamonds.get_offsets(), [[0.0, 0.0]]])
    assert (pts[:, 0] > x0).all() and (pts[:, 0] < x1).all()
    assert (pts[:, 1] > y0).all() and (pts[:, 1] < y1).all()
    assert (x1 - x0) < 0.5 * np.ptp(ax.get_xlim())
    texts = {t.get_text(): t for t in zoom.texts}
    assert set(texts) == set("abcde")
    assert tuple(texts["a"].xyann) == (-10, 5)  # a given offset is used as given
    with pytest.raises(ValueError, match="Z must have the shape of X"):
        zoom_context_vectors(ax, X, Z[:4])
    with pytest.raises(ValueError, match="labels but X has 5 rows|tokens"):
        zoom_context_vectors(ax, X, Z, tokens=["a", "b"])


def test_print_table_aligns_and_formats(capsys):
    print_table({"a": [0.123456, "5 of 9"], "longer": [12.0, "x"]}, ["w", "count"], fmt=[".3f", ".2f"], corner="run")
    assert capsys.readouterr().out.splitlines() == [
        "run          w   count",
        "a        0.123  5 of 9",
        "longer  12.000       x",
    ]


def test_print_table_rejects_a_short_row():
    with pytest.raises(ValueError, match="row 'a' has 1 values; expected one per column \\(2\\)"):
        print_table({"a": [1.0]}, ["x", "y"])
    with pytest.raises(ValueError, match="one per column \\(2\\); got 3"):
        print_table({"a": [1.0, 2.0]}, ["x", "y"], fmt=[".1f"] * 3)


# notebook 05's figures ---------------------------------------------------------------------------
def test_plot_online_softmax_draws_each_chunks_sums_and_max():
    scores = np.array([1.0, 3.0, 0.5, 8.0, 2.0])
    trace = [(0, 2, 3.0, 0.0, 0.0, 0.0, 1.2), (3, 4, 8.0, 0.0067, 1.2, 0.008, 1.0)]
    fig = plot_online_softmax(scores, trace)
    ax_m, ax_l = fig.axes
    maxima = sorted(float(seg[0, 1]) for coll in ax_m.collections for seg in coll.get_segments())
    assert maxima == [3.0, 8.0]  # one running-max segment per chunk, at its height
    heights = [round(p.get_height(), 4) for p in ax_l.patches]
    assert heights == [0.0, 1.2, 0.0, 0.008, 1.2, 1.0]  # old l, alpha * old l, the chunk's sum
    assert labels(ax_l.get_xticklabels()) == ["keys 0-2", "keys 3-4"]
    assert any("0.0067" in t.get_text() for t in ax_l.texts)


def test_plot_online_softmax_rejects_a_trace_that_misses_scores():
    with pytest.raises(ValueError, match="last chunk must end at the last score"):
        plot_online_softmax(np.zeros(5), [(0, 2, 0.0, 0.0, 0.0, 0.0, 1.0)])


def test_plot_block_sweep_writes_no_ratio_and_puts_memory_right():
    ax, ax_mem = plot_block_sweep([32, 64], [2.0, 1.0], [1.0, 1.5], 0.5, [0.1, 0.3], T=64)
    assert len(ax.texts) == 0  # no causal / full ratio on the panel: near 1 it would read as a finding
    assert list(ax.get_lines()[1].get_ydata()) == [1.0, 1.5]  # the causal times, as a line
    assert list(ax_mem.get_lines()[0].get_ydata()) == [0.1, 0.3]
    # memory in its own panel below the times, on the same x axis (no twin axis to overlap them)
    assert ax_mem.get_shared_x_axes().joined(ax, ax_mem)
    assert ax_mem.get_position().y1 <= ax.get_position().y0
    assert all(line.get_color() != "tab:purple" for line in ax.get_lines())
    assert labels(ax_mem.get_xticklabels())[-1].startswith("64\n(one tile")
    assert ax_mem.get_legend() is None  # one series: the y label names it
    assert "SDPA (0.50 ms)" in labels(ax.get_legend().get_texts())  # SDPA's time read without the axis
    with pytest.raises(ValueError, match="one entry each"):
        plot_block_sweep([32, 64], [2.0], [1.0, 1.5], 0.5, [0.1, 0.3], T=64)


def test_plot_times_by_length_one_panel_per_dtype_and_a_slope_two_line():
    panels = {"float32": {"SDPA": [1.0, 3.0], "naive PyTorch": [2.0, 9.0]},
              "float16": {"SDPA": [0.5, 2.0], "naive PyTorch": [1.0, 5.0]}}
    axes = plot_times_by_length([64, 128], panels, {"float32": {"SDPA (CPU)": ([64], [4.0])}})
    assert len(axes) == 2
    first = {line.get_label(): list(line.get_ydata()) for line in axes[0].get_lines()}
    assert first["SDPA (CPU)"] == [4.0]
    assert first[r"$\propto T^2$ (slope 2)"] == [1.5, 6.0]  # through twice SDPA's last time, slope 2
    colours = {line.get_label(): line.get_color() for line in axes[0].get_lines()}
    assert colours["SDPA (CPU)"] == colours["SDPA"]
    # the tiled loop's hollow marker is larger than the NumPy reference's: both show where they coincide
    one = plot_times_by_length([64], {"float32": {"SDPA": [1.0], "NumPy reference": [2.0], "tiled loop (eager)": [2.0]}})
    size = {line.get_label(): line.get_markersize() for line in one[0].get_lines()}
    assert size["tiled loop (eager)"] >= 1.5 * size["NumPy reference"]
    with pytest.raises(ValueError, match="3 times for 2 lengths"):
        plot_times_by_length([64, 128], {"float32": {"SDPA": [1.0, 2.0, 3.0]}})


def test_plot_memory_hierarchy_keeps_q_on_chip_and_streams_every_kv_tile():
    from matplotlib.patches import FancyArrowPatch

    from shared.plotting import plot_memory_hierarchy

    ax = plot_memory_hierarchy(n_tiles=5, hbm=("40 GB", "1.5 TB/s"), sram=("192 KB", "19 TB/s"))
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "40 GB, 1.5 TB/s" in texts
    # the SRAM is per SM, not one 20 MB pool: one SM's capacity, the total only as a sum over 108 SMs
    assert "one SM's on-chip SRAM (shared memory/L1): 192 KB\n108 SMs: about 20 MB, 19 TB/s in all" in texts
    assert ax.get_title().startswith("GPU memory, and the loop FlashAttention-2 runs in it")  # FA-1 loops the other way
    assert "one SM's SRAM" in ax.get_title()
    boxes = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    assert sum(gid.startswith("K") and gid[1:].isdigit() for gid in boxes) == 5
    sram = boxes["SRAM"].get_bbox()
    for gid in ("on-chip Q_i (kept)", "on-chip K_j", "on-chip V_j", "on-chip O_i (kept)"):
        centre = boxes[gid].get_bbox()
        assert sram.x0 < (centre.x0 + centre.x1) / 2 < sram.x1 and sram.y0 < (centre.y0 + centre.y1) / 2 < sram.y1
    labels = sorted(t.get_text() for t in ax.texts if t.get_text() in ("once", "every j"))
    assert labels == ["every j", "every j", "once", "once"]
    assert sum(isinstance(p, FancyArrowPatch) for p in ax.patches) == 4
    plt.close("all")


def test_plot_memory_hierarchy_rejects_a_single_tile():
    from shared.plotting import plot_memory_hierarchy

    with pytest.raises(ValueError, match="n_tiles must be an int >= 2, got 1"):
        plot_memory_hierarchy(n_tiles=1)


def test_plot_roofline_puts_each_kernel_on_the_first_roof_and_names_balance_points():
    from shared.plotting import plot_roofline

    ax = plot_roofline({"A": (100.0, 10.0), "B": (40.0, 1.0)}, {"x": 2.0, "y": 2.0, "z": 50.0})
    lines = [line for line in ax.get_lines() if line.get_gid() is None]
    roof = dict(zip(lines[0].get_xdata(), lines[0].get_ydata(), strict=True))
    assert all(abs(y - min(100.0, 10.0 * x)) < 1e-9 * y for x, y in roof.items())  # min(P, W * I)
    dots = {line.get_gid(): (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.get_lines() if line.get_gid()}
    assert dots == {"x, y": (2.0, 20.0), "z": (50.0, 100.0)}  # memory-bound below balance 10, flat above
    assert sorted(t.get_text() for t in ax.texts) == ["x, y: 2 kernels", "z"]  # one label per dot
    plt.close("all")
    ax = plot_roofline({"A": (100.0, 10.0)}, {"p": 1.0, "q": 2.0, "r": 100.0})  # p, q within x4
    side = {t.get_text(): (t.get_position()[0] > 0, t.get_position()[1] > 0) for t in ax.texts}
    assert side == {"p": (False, True), "q": (True, False), "r": (False, True)}  # q's label moves below-right
    dots = {line.get_gid(): (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.get_lines() if line.get_gid()}
    assert all(t.arrow_patch is not None and tuple(t.xy) == dots[t.get_text()] for t in ax.texts)  # each joined to its dot
    plt.close("all")
    ax = plot_roofline({"A": (100.0, 10.0), "B": (40.0, 1.0)}, {"x": 2.0, "y": 2.0, "z": 50.0})
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["A: balance 10 FLOP/byte", "B: balance 40 FLOP/byte", "kernel, on the A roof"]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="intensities must be > 0"):
        plot_roofline({"A": (1.0, 1.0)}, {"x": 0.0})
    plt.close("all")


def test_plot_roofline_draws_measured_points_below_their_roof_with_the_factor():
    """A measured point is a hollow circle at (intensity, achieved FLOP/s), joined to the first
    roof above it, annotated with roof / achieved; without ``measured`` nothing of it is drawn."""
    from shared.plotting import IMPLEMENTATION_COLOURS, plot_roofline

    ax = plot_roofline({"A": (100.0, 10.0), "B": (40.0, 1.0)}, {"chain": 2.0, "fused": 50.0},
                       measured={"naive PyTorch": (2.0, 10.0), "SDPA": (50.0, 40.0)})
    circles = {line.get_gid(): line for line in ax.get_lines() if (line.get_gid() or "").startswith("measured")}
    assert set(circles) == {"measured: naive PyTorch", "measured: SDPA"}
    naive, sdpa = circles["measured: naive PyTorch"], circles["measured: SDPA"]
    assert (naive.get_xdata()[0], naive.get_ydata()[0]) == (2.0, 10.0) and naive.get_markerfacecolor() == "none"
    assert naive.get_color() == IMPLEMENTATION_COLOURS["naive PyTorch"] and sdpa.get_color() == IMPLEMENTATION_COLOURS["SDPA"]
    factors = sorted(t.get_text() for t in ax.texts if "below the roof" in t.get_text())
    assert factors == ["x2.0 below the roof", "x2.5 below the roof"]  # 20 / 10 on the slope, 100 / 40 on the flat
    joins = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert sorted((tuple(j.get_xdata()), tuple(j.get_ydata())) for j in joins) == [((2.0, 2.0), (10.0, 20.0)), ((50.0, 50.0), (40.0, 100.0))]
    plt.close("all")
    plain = plot_roofline({"A": (100.0, 10.0)}, {"chain": 2.0})
    assert not [t for t in plain.texts if "below the roof" in t.get_text()]
    with pytest.raises(ValueError, match="measured 'SDPA' must be"):
        plot_roofline({"A": (100.0, 10.0)}, {"chain": 2.0}, measured={"SDPA": (50.0, 0.0)})
    plt.close("all")


def test_plot_gpu_record_dots_the_formula_shares_colours_and_draws_the_card():
    times = {"SDPA, float32": ([64, 128], [1.0, 3.0]), "SDPA, float16": ([64, 128], [0.5, 1.0])}
    peaks = {"naive PyTorch": ([64, 128], [3.0, 12.0]), "naive PyTorch (formula)": ([64, 256], [3.0, 48.0])}
    ax_t, ax_m = plot_gpu_record(times, peaks, capacity_mib=100.0, gpu="G")
    styles = {line.get_label(): (line.get_linestyle(), line.get_color()) for line in ax_m.get_lines()}
    assert styles["naive PyTorch (formula)"] == (":", styles["naive PyTorch"][1])  # dotted, same colour
    colours = {line.get_label(): line.get_color() for line in ax_t.get_lines()}
    assert colours["SDPA, float32"] == colours["SDPA, float16"]  # one colour per implementation
    assert any(list(line.get_ydata()) == [100.0, 100.0] for line in ax_m.get_lines())  # the card's line
    assert ax_m.get_title() == "G: forward peak memory"
    ax_m.figure.canvas.draw()
    ticks = [t for t in ax_m.get_yticks() if ax_m.get_ylim()[0] <= t <= ax_m.get_ylim()[1]]
    assert ticks and all(np.log10(t) == round(np.log10(t)) for t in ticks)  # decades only
    plt.close("all")


def test_plot_gpu_record_names_a_series_whose_lengths_do_not_match():
    with pytest.raises(ValueError, match=r"peaks\['SDPA'\]: 2 lengths for 1 values"):
        plot_gpu_record({"SDPA, float16": ([64], [1.0])}, {"SDPA": ([64, 128], [1.0])})


def test_plot_mask_error_vs_gap_puts_nan_in_rows_errors_at_the_floor_and_cut_offs_on_top():
    from shared.plotting import plot_mask_error_vs_gap

    gaps = np.array([1.0, 2.0, 3.0, 4.0])
    gradual = np.array([0.0, 1e-3, 0.27, np.nan])
    flushed = np.array([1e-9, 0.27, np.nan, np.nan])
    ax = plot_mask_error_vs_gap(gaps, gradual, flushed, np.zeros(4), 3.2, 1.5, flushed_label="red")
    lines = {line.get_label(): line for line in ax.get_lines()}
    # finite errors as log10, 0 and errors below 1e-7 at the floor; each curve's NaN gaps on a row
    assert list(lines["red"].get_ydata()) == [-7.0, pytest.approx(np.log10(0.27))]
    assert list(lines["(b) renormalise after, gradual underflow"].get_ydata()) == [
        -7.0, pytest.approx(-3.0), pytest.approx(np.log10(0.27))]
    nan_rows = [line for line in ax.get_lines() if line.get_marker() == "|"]
    assert [(list(r.get_xdata()), list(r.get_ydata()), r.get_color()) for r in nan_rows] == [
        ([3.0, 4.0], [1.0, 1.0], "C3"), ([4.0], [2.0], "C0")]
    assert list(lines["(a) -inf before the softmax"].get_ydata()) == [-7.0] * 4
    # the cut-offs c and c + 1 of each mode, labelled on the top axis in the curve's colour
    top = ax.child_axes[0] if ax.child_axes else next(a for a in ax.figure.axes if a is not ax)
    ticks = [(t.get_text(), t.get_color()) for t in top.get_xticklabels()]
    assert ticks == [("1.50", "C3"), ("2.50", "C3"), ("3.20", "C0"), ("4.20", "C0")]
    assert labels(ax.get_yticklabels())[-2:] == ["NaN, flushed", "NaN, gradual"]
    with pytest.raises(ValueError, match="one entry each"):
        plot_mask_error_vs_gap(gaps, gradual[:3], flushed, np.zeros(4), 2.5, 1.5)
    with pytest.raises(ValueError, match="increasing"):
        plot_mask_error_vs_gap(gaps[::-1], gradual, flushed, np.zeros(4), 2.5, 1.5)
    with pytest.raises(ValueError, match="negative"):
        plot_mask_error_vs_gap(gaps, -gradual, flushed, np.zeros(4), 2.5, 1.5)
    with pytest.raises(ValueError, match="floor"):
        plot_mask_error_vs_gap(gaps, gradual, flushed, np.zeros(4), 2.5, 1.5, floor=-5.0)
