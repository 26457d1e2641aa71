"""Pictures of attention: one heatmap, or a grid of heads. Every notebook draws with these.

Conventions: queries run down the rows, keys across the columns; masked cells (where the boolean
mask is False, i.e. "may not attend") are drawn as grey hatching, distinct from a small weight.
Both functions accept NumPy arrays or PyTorch tensors (moved to the CPU and detached).

Three pictures for notebook 01 live here too, so the notebook shows one call instead of
fifty lines of box drawing: ``plot_bottleneck`` (encoder-decoder RNN vs attention),
``plot_word_links`` (which words a query word should look at), ``plot_context_vectors``
(context vectors inside the convex hull of the inputs) and ``zoom_context_vectors`` (an inset
that enlarges context vectors crowded near the centroid).

Two small helpers for the measured plots of notebook 05: ``log_ticks`` (a log axis labelled with
plain numbers) and ``label_points`` (name labels for dots, kept apart where dots share an x); and
its figures, so that its cells show attention code, not matplotlib: ``plot_online_softmax``,
``plot_memory_hierarchy``, ``plot_roofline``, ``plot_block_sweep``, ``plot_times_by_length`` and
``plot_gpu_record``.

One figure for notebook 03's float32 masks: ``plot_mask_error_vs_gap`` (masking after the
softmax against the gap of a future score, with its NaN rows and the cut-offs from the format).

One text helper for the measured tables of notebook 07: ``print_table`` (rows of numbers under
column headers, so that a cell shows the measurement and not the f-strings).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = ["plot_attention", "plot_heads", "plot_bottleneck", "plot_word_links",
           "plot_context_vectors", "zoom_context_vectors", "log_ticks", "label_points",
           "print_table", "plot_online_softmax", "plot_memory_hierarchy",
           "plot_roofline", "plot_block_sweep", "plot_times_by_length", "plot_gpu_record",
           "plot_mask_error_vs_gap"]

MASKED_COLOR = "#d9d9d9"


def _to_numpy(name: str, x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU and requiring grad
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must be a numeric array; got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _check_tokens(name: str, tokens, n: int, axis: str) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} labels but the weights have {n} {axis}")
    return tokens


def _prepare_mask(mask, shape: tuple) -> np.ndarray | None:
    if mask is None:
        return None
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True = may attend); got dtype {mask.dtype}")
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(
            f"mask of shape {mask.shape} does not broadcast to the weights' shape {shape}"
        ) from None


def plot_attention(
    weights,
    query_tokens=None,
    key_tokens=None,
    mask=None,
    ax=None,
    title: str = "Attention weights",
    annotate: bool | None = None,
    cbar: bool = True,
    vmax: float | None = 1.0,
    cmap: str = "viridis",
    cbar_label: str | None = None,
    blank_diagonal: bool = False,
    vmin: float | None = None,
):
    """Draw one attention matrix as a labelled heatmap and return its ``Axes``.

    Shapes:
        weights: ``(T_q, T_k)`` (rows = queries, columns = keys).
        query_tokens: ``T_q`` labels (default 0..T_q-1); key_tokens: ``T_k`` labels (default:
        the query labels when ``T_q == T_k``).
        mask: boolean, broadcastable to ``(T_q, T_k)``, True = may attend; False cells are drawn
        as grey hatching with no number.

    ``annotate`` writes each weight with 2 decimals (default: when the matrix is at most 12 x 12).
    ``vmax=None`` scales the colours to the data instead of to [0, 1] (use it for raw scores).
    ``vmin`` sets the bottom of the scale (default: 0 when ``vmax`` is given), e.g. ``vmin=-lim,
    vmax=lim`` with ``cmap="RdBu_r"`` for a diverging scale centred on 0; the numbers are then
    written in black or white to contrast with their cell.
    ``cbar_label`` labels the colour bar (default: no label), e.g. ``"attention weight"``.
    ``blank_diagonal=True`` leaves the numbers of the diagonal cells out (their colour stays), e.g.
    for ``S - S^T``, whose diagonal is 0 by construction.
    """
    w = _to_numpy("weights", weights)
    if w.ndim != 2:
        raise ValueError(
            f"weights must be 2-D (T_q, T_k); got shape {w.shape} "
            "(use plot_heads for several heads)"
        )
    T_q, T_k = w.shape
    q_labels = _check_tokens("query_tokens", query_tokens, T_q, "rows (queries)")
    if key_tokens is None and T_q == T_k:
        key_tokens = q_labels
    k_labels = _check_tokens("key_tokens", key_tokens, T_k, "columns (keys)")
    allowed = _prepare_mask(mask, w.shape)
    if annotate is None:
        annotate = max(T_q, T_k) <= 12
    if ax is None:
        size = (1.0 + 0.55 * T_k + (1.2 if cbar else 0.0), 0.8 + 0.5 * T_q)
        _, ax = plt.subplots(figsize=(max(size[0], 3.5), max(size[1], 2.8)))

    ax.set_facecolor(MASKED_COLOR)
    sns.heatmap(
        w,
        ax=ax,
        mask=None if allowed is None else ~allowed,  # seaborn hides True cells
        vmin=vmin if vmin is not None else (0.0 if vmax is not None else None),
        vmax=vmax,
        cmap=cmap,
        annot=annotate,
        fmt=".2f",
        annot_kws={"fontsize": 8},
        cbar=cbar,
        square=False,
        linewidths=0.5,
        linecolor="white",
        xticklabels=k_labels,
        yticklabels=q_labels,
    )
    mesh = ax.collections[-1]  # the heatmap just drawn (its colour bar hangs on it)
    if allowed is not None and not allowed.all():
        for i, j in zip(*np.nonzero(~allowed), strict=True):
            ax.add_patch(
                plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#9a9a9a", lw=0)
            )
    if cbar and cbar_label is not None:
        mesh.colorbar.set_label(cbar_label)
    if blank_diagonal:  # seaborn writes one text per cell, centred on (column + 0.5, row + 0.5)
        for text in ax.texts:
            x, y = text.get_position()
            if round(x - 0.5) == round(y - 0.5):
                text.set_text("")
    ax.set_xlabel("keys (attended to)")
    ax.set_ylabel("queries (attending)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=45)
    ax.tick_params(axis="y", labelrotation=0)
    return ax


def plot_heads(
    weights,
    query_tokens=None,
    key_tokens=None,
    mask=None,
    ncols: int = 4,
    titles=None,
    suptitle: str = "Attention weights per head",
    vmax: float | None = 1.0,
    cbar: bool = False,
):
    """Draw one heatmap per head in a grid and return the ``Figure``.

    Shapes:
        weights: ``(num_heads, T_q, T_k)``; mask broadcastable to it (True = may attend).
        titles: ``num_heads`` strings (default "head 0", "head 1", ...).

    ``cbar=True`` adds one colour bar shared by every panel (all panels use the same scale:
    [0, ``vmax``], or the data's overall range when ``vmax=None``).
    """
    w = _to_numpy("weights", weights)
    if w.ndim != 3:
        raise ValueError(
            f"weights must be 3-D (num_heads, T_q, T_k); got shape {w.shape} "
            "(drop the batch dimension first, e.g. weights[0])"
        )
    H, T_q, T_k = w.shape
    allowed = _prepare_mask(mask, w.shape)
    if titles is None:
        titles = [f"head {h}" for h in range(H)]
    if len(titles) != H:
        raise ValueError(f"titles has {len(titles)} entries but there are {H} heads")
    ncols = max(1, min(ncols, H))
    nrows = -(-H // ncols)
    fig, axes = plt.subplots(
        nrows, ncols,
        figsize=(0.5 * T_k * ncols + 1.5 * ncols + (1.0 if cbar else 0.0),
                 0.45 * T_q * nrows + 1.2 * nrows),
        squeeze=False, constrained_layout=True,
    )
    if vmax is None:  # one scale for every panel, so a shared colour bar means the same everywhere
        shown = w if allowed is None else w[allowed]
        vmax = float(shown.max()) if shown.size else 1.0
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        plot_attention(
            w[h], query_tokens, key_tokens, None if allowed is None else allowed[h], ax=ax,
            title=titles[h], annotate=max(T_q, T_k) <= 6, cbar=False, vmax=vmax,
        )
        if h % ncols:
            ax.set_ylabel("")
        if h < H - ncols:
            ax.set_xlabel("")
    if cbar:
        mappable = axes.flat[0].collections[0]
        fig.colorbar(mappable, ax=list(axes.flat), label="attention weight", shrink=0.9)
    fig.suptitle(suptitle)
    return fig


# --------------------------------------------------------------------------------------------
# Diagrams for notebook 01 (pictures of ideas, not of computed numbers)
# --------------------------------------------------------------------------------------------
_ENC, _DEC, _CTX, _ARROW = "#cfe2f3", "#d9ead3", "#f4cccc", "#b45f06"


def _box(ax, x: float, y: float, text: str, color: str, w: float = 0.8, h: float = 0.5) -> None:
    ax.add_patch(plt.Rectangle((x - w / 2, y - h / 2), w, h, facecolor=color, edgecolor="black"))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax, start, end, lw: float = 1.0, color: str = "black") -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "lw": lw, "color": color})


def plot_bottleneck(words, weights, decoder_steps: int = 4):
    """Two diagrams side by side and return the ``Figure``: left, an encoder-decoder RNN whose
    decoder sees only the last encoder state, the box ``c = h_T`` (the bottleneck); right, a
    decoder step that reads a weighted average of every encoder state, arrow widths proportional
    to ``weights``.

    Shapes: ``words``: ``T`` source words; ``weights``: ``T`` non-negative numbers (illustrative,
    drawn as given and printed on the arrows).
    """
    words = [str(w) for w in words]
    a = _to_numpy("weights", weights)
    if a.ndim != 1 or a.shape[0] != len(words):
        raise ValueError(f"weights must have one entry per word: {len(words)} words, "
                         f"got weights of shape {a.shape}")
    if (a < 0).any():
        raise ValueError("weights must be non-negative (they are drawn as arrow widths)")
    T = len(words)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax in (left, right):
        for i, word in enumerate(words):
            _box(ax, i, 0, f"$h_{{{i + 1}}}$", _ENC)
            ax.text(i, -0.6, word, ha="center", fontsize=8)
    # Left: everything passes through one fixed-size vector c = h_T, labelled so.
    for i in range(1, T):
        _arrow(left, (i - 0.6, 0), (i - 0.4, 0))
    last = T - 1
    _box(left, last, 1.4, f"$c = h_{{{T}}}$", _CTX, w=0.9)
    _arrow(left, (last, 0.25), (last, 1.15), lw=2)
    first = max(0, last - decoder_steps + 1)
    for j in range(decoder_steps):
        x = first + j
        _box(left, x, 2.8, f"$s_{{{j + 1}}}$", _DEC)
        _arrow(left, (last, 1.65), (x, 2.55), color=_ARROW)
        if j:
            _arrow(left, (x - 0.6, 2.8), (x - 0.4, 2.8))
    left.text(min(0.9, last / 2), 1.4, "one fixed-size vector\ncarries the whole sentence",
              ha="center", fontsize=9)
    left.set_title("Encoder-decoder RNN: the bottleneck")
    # Right: the decoder state looks back at every encoder state.
    centre = (T - 1) / 2
    for i in range(T):
        _arrow(right, (i, 0.25), (centre, 2.55), lw=0.5 + 8 * float(a[i]), color=_ARROW)
        right.text(i + 0.05 * (centre - i), 0.75, f"{a[i]:.2f}", ha="center", fontsize=8)
    _box(right, centre, 2.8, "$s_t$", _DEC)
    right.text(min(centre + 2.2, T - 0.3), 2.8, "decoder reads a weighted\naverage of all states",
               ha="center", fontsize=9)
    right.set_title("With attention: look back at every state")
    for ax in (left, right):
        ax.set_xlim(-0.8, T - 0.2)
        ax.set_ylim(-0.9, 3.3)
        ax.axis("off")
    fig.tight_layout()
    return fig


def plot_word_links(words, query: int, strong: int, weak: int | None = None,
                    title: str = "", strong_label: str = "strong", weak_label: str = "weak"):
    """Write a sentence on one line and draw curved arrows from word ``query`` to word ``strong``
    (thick, labelled outside its arc) and, optionally, to word ``weak`` (thin, dashed, labelled
    inside its arc when it is the shorter one). Returns the ``Axes``.

    Shapes: ``words``: ``T`` strings; ``query``, ``strong``, ``weak``: indices in ``0 .. T-1``.
    """
    words = [str(w) for w in words]
    T = len(words)
    for name, idx in (("query", query), ("strong", strong), ("weak", weak)):
        if idx is None and name == "weak":
            continue
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)) or not 0 <= idx < T:
            raise ValueError(f"{name} must be a word index in 0..{T - 1}; got {idx!r}")
    fig, ax = plt.subplots(figsize=(max(6.0, T), 2.6))
    for x, word in enumerate(words):
        bold = x in (query, strong)
        ax.text(x, 0, word, ha="center", va="center", fontsize=11,
                fontweight="bold" if bold else "normal")
    links = [(strong, 3.0, _ARROW, "-", strong_label, True)]  # label outside its arc
    if weak is not None:  # label inside its arc: a longer strong arc may pass just outside it
        links.append((weak, 1.0, "grey", "--", weak_label, abs(weak - query) > abs(strong - query)))
    ax.set_xlim(-0.8, T - 0.2)
    ax.set_ylim(-0.4, 1.4)
    ax.axis("off")
    rad = 0.35
    for target, lw, color, ls, label, outside in links:
        ax.annotate("", xy=(target, 0.15), xytext=(query, 0.15),
                    arrowprops={"arrowstyle": "->", "lw": lw, "color": color, "ls": ls,
                                "connectionstyle": f"arc3,rad={rad}"})
        # The arc is a quadratic Bezier curve drawn in display space: its control point sits
        # rad * (dy, -dx) from the midpoint, so its apex sits half as far. Put the label just
        # beyond the apex (outside the arc) or just below it (inside), never on a line.
        start, end = ax.transData.transform([(query, 0.15), (target, 0.15)])
        (dx, dy), mid = end - start, (start + end) / 2
        apex = ax.transData.inverted().transform(mid + 0.5 * rad * np.array([dy, -dx]))
        up = (-dx >= 0) == outside  # the arc bulges upwards when it runs leftwards
        ax.annotate(label, apex, textcoords="offset points", xytext=(0, 5 if up else -5),
                    color=color, fontsize=9, ha="center", va="bottom" if up else "top")
    ax.set_title(title)
    return ax


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """Vertices of the 2-D convex hull of ``points`` (n, 2), counter-clockwise (Andrew's
    monotone chain)."""
    pts = sorted(map(tuple, points))

    def cross(o, a, b) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list = []
    upper: list = []
    for chain, seq in ((lower, pts), (upper, reversed(pts))):
        for p in seq:
            while len(chain) >= 2 and cross(chain[-2], chain[-1], p) <= 0:
                chain.pop()
            chain.append(p)
    return np.array(lower[:-1] + upper[:-1])


def plot_context_vectors(X, Z, tokens=None, ax=None, title: str = "Context vectors"):
    """Draw the inputs, their convex hull and centroid, and an arrow from each input ``x_i`` to
    its context vector ``z_i`` (each token in its own colour: circle ``x_i``, diamond ``z_i``),
    all projected onto the inputs' first two principal directions
    (a linear map, so a weighted average of the inputs stays one: points inside the hull stay
    inside). Returns the ``Axes``.

    Shapes: ``X``: ``(T, d)`` inputs with ``T >= 3`` and ``d >= 2``; ``Z``: ``(T, d)`` context
    vectors; ``tokens``: ``T`` labels (default ``0 .. T-1``).
    """
    X, Z = _to_numpy("X", X), _to_numpy("Z", Z)
    if X.ndim != 2 or X.shape[0] < 3 or X.shape[1] < 2:
        raise ValueError(f"X must be (T, d) with T >= 3 and d >= 2; got shape {X.shape}")
    if Z.shape != X.shape:
        raise ValueError(f"Z must have the shape of X {X.shape}; got {Z.shape}")
    if tokens is not None and len(tokens) != X.shape[0]:
        raise ValueError(f"tokens has {len(tokens)} labels but X has {X.shape[0]} rows")
    labels = _check_tokens("tokens", tokens, X.shape[0], "rows (tokens)")
    centre = X.mean(axis=0)
    _, _, Vt = np.linalg.svd(X - centre, full_matrices=False)
    P = Vt[:2] * np.sign(Vt[:2, [0]] + (Vt[:2, [0]] == 0))  # a fixed sign: first entry >= 0
    x2, z2 = (X - centre) @ P.T, (Z - centre) @ P.T
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 4.5))
    hull = _convex_hull(x2)
    ax.fill(hull[:, 0], hull[:, 1], color="#ececec", edgecolor="#9a9a9a", lw=1,
            label="convex hull of the inputs")
    # one categorical colour per token: x_i (circle), its arrow and z_i (diamond) share it
    palette = plt.get_cmap("tab10" if len(x2) <= 10 else "tab20")
    colors = [palette(i % palette.N) for i in range(len(x2))]
    for (x0, y0), (x1, y1), color in zip(x2, z2, colors, strict=True):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "lw": 1.0, "color": color, "alpha": 0.8,
                                "shrinkA": 3, "shrinkB": 4})
    ax.scatter(x2[:, 0], x2[:, 1], c=colors, s=40, zorder=3, edgecolors="black", linewidths=0.5)
    ax.scatter(z2[:, 0], z2[:, 1], c=colors, marker="D", s=30, zorder=4, edgecolors="black",
               linewidths=0.5, alpha=0.85)
    ax.scatter([0], [0], marker="x", color="black", s=60, zorder=5, label="centroid")
    # legend entries for the two marker shapes (colours name the tokens)
    ax.scatter([], [], marker="o", color="white", edgecolors="black", s=40,
               label="input $x^{(i)}$ (colour = token)")
    ax.scatter([], [], marker="D", color="white", edgecolors="black", s=30,
               label="its context vector $z^{(i)}$")
    # labels point away from the centroid; a point close to an earlier one gets its label turned
    # a quarter turn, so near-identical tokens stay readable
    near = 0.06 * float(np.ptp(x2, axis=0).max() or 1.0)
    for i, ((x0, y0), label) in enumerate(zip(x2, labels, strict=True)):
        u = np.array([x0, y0]) / (np.hypot(x0, y0) or 1.0)
        if any(np.hypot(*(x2[i] - x2[k])) < near for k in range(i)):
            u = np.array([u[1], -u[0]])
        ax.annotate(label, (x0, y0), textcoords="offset points", xytext=tuple(9 * u), fontsize=9,
                    color=colors[i], fontweight="bold",
                    ha="left" if u[0] >= -0.3 else "right", va="bottom" if u[1] >= -0.3 else "top")
    ax.margins(0.15)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("principal direction 1")
    ax.set_ylabel("principal direction 2")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best")
    return ax


def zoom_context_vectors(ax, X, Z, tokens=None, bounds=(0.67, 0.025, 0.315, 0.38),
                         label_offsets=None, pad: float = 0.25):
    """Enlarge the context vectors of a ``plot_context_vectors`` panel in an inset of ``ax``.

    The inset shows each ``z_i`` (diamond, the token's colour in that panel) and the centroid
    (cross) in the same projection onto the inputs' first two principal directions, around the
    box that holds them, widened by ``pad`` on each side; the enlarged box is marked on ``ax``.
    ``bounds`` places the inset in ``ax``'s axes fraction ``(x0, y0, width, height)``.
    ``label_offsets`` maps a token to its label offset in points ``(dx, dy)``; by default labels
    point away from the middle of the diamonds, a quarter turn further for a diamond that nearly
    covers an earlier one. Returns the inset ``Axes``.

    Shapes: ``X``, ``Z``: ``(T, d)`` with ``T >= 3``, ``d >= 2``; ``tokens``: ``T`` labels.
    """
    X, Z = _to_numpy("X", X), _to_numpy("Z", Z)
    if X.ndim != 2 or X.shape[0] < 3 or X.shape[1] < 2:
        raise ValueError(f"X must be (T, d) with T >= 3 and d >= 2; got shape {X.shape}")
    if Z.shape != X.shape:
        raise ValueError(f"Z must have the shape of X {X.shape}; got {Z.shape}")
    labels = _check_tokens("tokens", tokens, X.shape[0], "rows (tokens)")
    centre = X.mean(axis=0)
    _, _, Vt = np.linalg.svd(X - centre, full_matrices=False)
    P = Vt[:2] * np.sign(Vt[:2, [0]] + (Vt[:2, [0]] == 0))  # the projection of plot_context_vectors
    z2 = (Z - centre) @ P.T
    box = np.vstack([z2, np.zeros((1, 2))])  # the diamonds and the centroid
    low, high = box.min(axis=0), box.max(axis=0)
    span = np.maximum(high - low, 1e-12)
    low, high = low - pad * span, high + pad * span
    zoom = ax.inset_axes(list(bounds))
    palette = plt.get_cmap("tab10" if len(z2) <= 10 else "tab20")
    colors = [palette(i % palette.N) for i in range(len(z2))]
    zoom.scatter(z2[:, 0], z2[:, 1], c=colors, marker="D", s=30, edgecolors="black", linewidths=0.5)
    zoom.scatter([0], [0], marker="x", color="black", s=40)
    middle = z2.mean(axis=0)
    near = 0.08 * float(span.max())
    for i, label in enumerate(labels):
        if label_offsets is not None and label in label_offsets:
            offset = tuple(label_offsets[label])
        else:
            u = z2[i] - middle
            u = u / (np.hypot(*u) or 1.0)
            if any(np.hypot(*(z2[i] - z2[k])) < near for k in range(i)):
                u = np.array([u[1], -u[0]])
            offset = tuple(16 * u)
        zoom.annotate(label, z2[i], xytext=offset, textcoords="offset points", fontsize=8,
                      ha="center", va="center", color=colors[i], fontweight="bold",
                      arrowprops={"arrowstyle": "-", "lw": 0.6, "color": colors[i], "shrinkB": 3})
    zoom.set(xlim=(low[0], high[0]), ylim=(low[1], high[1]), xticks=[], yticks=[])
    ax.indicate_inset_zoom(zoom, edgecolor="dimgrey")
    return zoom


def log_ticks(ax, axis: str = "y", subs=(1.0, 2.0, 5.0)) -> None:
    """Label a log-scaled axis of ``ax`` at ``subs`` times each power of ten (1, 2 and 5 unless
    told), as plain numbers (``0.5``, ``20``, ``1000``), with no minor labels. ``axis`` is ``"x"``
    or ``"y"``; pass more ``subs`` for an axis that spans less than a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y'; got {axis!r}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=tuple(subs)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def label_points(ax, xs, ys, labels, colors, fontsize: float = 8, shared_x: str = "split") -> list:
    """Draw one dot per point and write its label next to it; return the text objects.

    Shapes: ``xs``, ``ys``, ``labels``, ``colors``: ``n`` each. Every label hangs just below its
    dot (clear of a line running through the dots, such as a roofline's roof). A dot alone at its x
    gets its label to the right. Dots that share an x, with ``shared_x="split"`` (the default): the
    highest gets its label to the left and the others to the right, so that two labels never sit
    on top of each other. With ``shared_x="stack"``: their labels form one column to the left,
    highest dot first, each below the lines of the ones above, and every dot but the highest is
    drawn as a hollow ring, so that dots at nearly the same height both read; the column's labels
    sit on a white box, so that they read over grid and reference lines."""
    xs, ys, labels, colors = list(xs), list(ys), list(labels), list(colors)
    if not len(xs) == len(ys) == len(labels) == len(colors):
        raise ValueError(f"xs, ys, labels and colors must have one entry per point; got lengths "
                         f"{len(xs)}, {len(ys)}, {len(labels)}, {len(colors)}")
    if shared_x not in ("split", "stack"):
        raise ValueError(f"shared_x must be 'split' or 'stack'; got {shared_x!r}")
    texts = []
    for k, (x, y, label, color) in enumerate(zip(xs, ys, labels, colors, strict=True)):
        twins = [(ys[j], -j) for j in range(len(xs)) if xs[j] == x and j != k]
        anchor, ring, stacked = (x, y), False, bool(twins) and shared_x == "stack"
        if stacked:  # one column left of the group, highest dot's label first
            above = sorted((j for j in range(len(xs)) if xs[j] == x and (ys[j], -j) > (y, -k)),
                           key=lambda j: (-ys[j], j))
            lines_above = sum(labels[j].count("\n") + 1 for j in above)
            anchor, ring = (x, max(twins)[0] if above else y), bool(above)
            # clear of the ring (13 pt) round a lower dot of the group
            dx, dy, ha, va = -16, -6 - 1.25 * fontsize * lines_above, "right", "top"
        elif twins and (y, -k) > max(twins):  # the highest dot sharing this x: label on the left
            dx, dy, ha, va = -9, -3, "right", "top"
        else:  # a dot alone, or a lower one of a shared x (label further down, clear of the rest)
            dx, dy, ha, va = 7, -8 if twins else -3, "left", "top"
        if ring:
            ax.plot([x], [y], "o", ms=13, mfc="none", mew=2, color=color)
        else:
            ax.plot([x], [y], "o", ms=7, color=color)
        box = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}
        texts.append(ax.annotate(label, anchor, xytext=(dx, dy), textcoords="offset points",
                                 fontsize=fontsize, ha=ha, va=va, color=color,
                                 bbox=box if stacked else None))
    return texts


def print_table(rows: dict, columns, fmt=".2f", corner: str = "") -> None:
    """Print a right-aligned text table: one line per ``rows`` item, its key, then its values.

    Shapes: ``rows``: {label: sequence of ``len(columns)`` values}; ``columns``: headers, one per
    value. ``fmt``: one format spec for every float, or one per column (a ``str`` value is printed
    as it is). ``corner`` heads the label column. Each column is as wide as its widest entry."""
    columns = list(columns)
    fmts = [fmt] * len(columns) if isinstance(fmt, str) else list(fmt)
    if len(fmts) != len(columns):
        raise ValueError(f"fmt must be one spec or one per column ({len(columns)}); "
                         f"got {len(fmts)}")
    cells = {}
    for label, values in rows.items():
        values = list(values)
        if len(values) != len(columns):
            raise ValueError(f"row {label!r} has {len(values)} values; "
                             f"expected one per column ({len(columns)})")
        cells[str(label)] = [v if isinstance(v, str) else format(float(v), f)
                             for v, f in zip(values, fmts, strict=True)]
    first = max([len(corner), *map(len, cells)])
    widths = [max([len(h), *(len(c[j]) for c in cells.values())]) for j, h in enumerate(columns)]
    for label, row in [(corner, columns), *cells.items()]:
        print(f"{label:<{first}s}"
              + "".join(f"  {c:>{w}s}" for c, w in zip(row, widths, strict=True)))


def _same_lengths(**named) -> int:
    lengths = {name: len(list(v)) for name, v in named.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError("expected one entry each; got lengths "
                         + ", ".join(f"{name} {n}" for name, n in lengths.items()))
    return next(iter(lengths.values()))


def plot_online_softmax(scores, trace):
    """Two panels for the online softmax over chunks of keys; returns the figure.

    ``scores``: ``(n,)`` the scores of one query row. ``trace``: one tuple per chunk,
    ``(first key, last key, running max m, alpha, old l, alpha * old l, the chunk's own sum)``.
    Left: the scores and the running max per chunk. Right: per chunk, the old sum before
    rescaling (outlined) beside alpha times it, with the chunk's own sum stacked on top (labelled
    "≈ 0" where too thin to see)."""
    scores = _to_numpy("scores", scores).reshape(-1)
    trace = [tuple(row) for row in trace]
    if not trace or any(len(row) != 7 for row in trace):
        raise ValueError("trace must hold one 7-tuple (first, last, m, alpha, old l, "
                         "alpha * old l, new part) per chunk")
    if trace[-1][1] != len(scores) - 1:
        raise ValueError(f"the last chunk must end at the last score ({len(scores) - 1}); "
                         f"got {trace[-1][1]}")
    fig, (ax_m, ax_l) = plt.subplots(1, 2, figsize=(8, 2.8))
    ax_m.plot(range(len(scores)), scores, "o", color="k", label="score $s_j$")
    for k, (first, last, m_k, *_) in enumerate(trace):
        ax_m.hlines(m_k, first - 0.4, last + 0.4, color="tab:red", lw=2.5,
                    label="running max $m$" if k == 0 else None)
        ax_m.axvline(last + 0.5, color="grey", ls=":", lw=1)
    ax_m.set(xlabel=f"key j (chunks of {trace[0][1] - trace[0][0] + 1})", ylabel="score",
             title="scores and the running max")
    ax_m.legend(fontsize=8, loc="upper left")
    names = [f"keys {first}-{last}" if last > first else f"key {first}"
             for first, last, *_ in trace]
    x = np.arange(len(trace))
    before, kept, added = ([row[i] for row in trace] for i in (4, 5, 6))
    ax_l.bar(x - 0.2, before, 0.4, facecolor="none", edgecolor="tab:grey", hatch="//",
             label=r"old $\ell$, before rescaling")
    ax_l.bar(x + 0.2, kept, 0.4, color="tab:grey", label=r"old $\ell$ times $\alpha$")
    ax_l.bar(x + 0.2, added, 0.4, bottom=kept, color="tab:blue",
             label=r"the chunk's $\sum e^{s_j - m}$")
    for k, (*_, alpha, _, old, new) in enumerate(trace):
        ax_l.annotate(rf"$\alpha$ = {alpha:.4f}" if k else r"$\alpha$ = 0 (first chunk)",
                      (k + 0.2, old + new), xytext=(0, 3), textcoords="offset points",
                      ha="center", fontsize=8)
    top = max(max(before), *(b + a for b, a in zip(kept, added, strict=True)))
    for k in range(1, len(trace)):  # a chunk's own part too thin to see: say so
        if added[k] < 0.01 * top:
            ax_l.annotate("own\n" r"$\approx 0$", (k + 0.2, kept[k] + added[k]), xytext=(0, -4),
                          textcoords="offset points", ha="center", va="top", fontsize=8,
                          color="white")
    if len(trace) > 1:
        ax_l.annotate(rf"old $\ell \times \alpha$ = {kept[1]:.4f}", (1.2, kept[1]),
                      xytext=(1.45, 1.55 * top), fontsize=8,
                      arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax_l.set_xticks(x, names)
    ax_l.set(ylabel=r"running sum $\ell$", ylim=(0, 2 * top), title=r"$\ell$ after each chunk")
    ax_l.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_memory_hierarchy(n_tiles: int = 4, hbm=("40 GB", "1.5 TB/s"), sram=("192 KiB", "19 TB/s"),
                          sms: int = 108, sram_total: str = "about 20 MB"):
    """Schematic of a GPU's memory: Q, K, V and O in HBM (each cut into ``n_tiles`` blocks of
    rows), one query block ``Q_i`` and its accumulator ``O_i`` kept in on-chip SRAM while the
    tiles ``K_j``, ``V_j`` stream through: FlashAttention-2's loop order (FlashAttention-1 keeps
    ``K_j``, ``V_j`` and streams ``Q_i``, ``O_i``). The SRAM is not one pool: each of the ``sms``
    streaming multiprocessors has its own shared memory/L1, and the box is one SM's, where one
    thread block works. ``hbm``: (capacity, bandwidth); ``sram``: (capacity per SM, bandwidth of
    all SMs together); ``sram_total``: the capacity of all SMs together. The defaults are a 40 GB
    A100's (Dao et al. 2022, section 2.1 and Figure 1: 192 KiB per SM, 108 SMs).
    Returns the axes."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if not isinstance(n_tiles, int) or n_tiles < 2:
        raise ValueError(f"n_tiles must be an int >= 2, got {n_tiles!r}")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.add_patch(Rectangle((0, 2.6), 10, 2.2, fc="#dceefb", ec="tab:blue", lw=1.5, gid="HBM"))
    ax.text(0.15, 4.6, f"HBM (device memory): {hbm[0]}, {hbm[1]}", va="top", fontsize=10)
    ax.add_patch(Rectangle((1.5, -0.95), 7, 2.25, fc="#fde9d4", ec="tab:orange", lw=1.5,
                           gid="SRAM"))
    ax.text(5.0, -0.4, f"one SM's on-chip SRAM (shared memory/L1): {sram[0]}\n"
            f"{sms} SMs: {sram_total}, {sram[1]} in all", ha="center", va="top", fontsize=9,
            linespacing=1.1)
    colour = {"Q": "tab:blue", "K": "tab:green", "V": "tab:purple", "O": "tab:red"}
    width = 2.0 / n_tiles
    for k, name in enumerate("QKVO"):  # each matrix a row of n_tiles blocks in HBM
        x0 = 0.4 + 2.4 * k
        ax.text(x0 + 1.0, 3.85, name, ha="center", fontsize=10, weight="bold")
        for j in range(n_tiles):
            ax.add_patch(Rectangle((x0 + j * width, 3.0), width * 0.9, 0.6, fc=colour[name],
                                   alpha=0.9 if (name in "QO" and j == 0) or name in "KV" else 0.25,
                                   gid=f"{name}{j}"))
    blocks = {"Q_i (kept)": 2.0, "K_j": 3.6, "V_j": 5.0, "O_i (kept)": 6.6}
    for label, x in blocks.items():
        ax.add_patch(Rectangle((x, 0.25), 1.1, 0.6, fc=colour[label[0]], alpha=0.9,
                               gid=f"on-chip {label}"))
        ax.text(x + 0.55, 0.1, label.replace("_i", "$_i$").replace("_j", "$_j$"), ha="center",
                va="top", fontsize=9)
    arrows = [((0.4 + 0.9 * width / 2, 3.0), (2.55, 0.85), "once"),  # Q_0 in
              ((2.8 + 1.0, 3.0), (4.15, 0.85), "every j"),
              ((5.2 + 1.0, 3.0), (5.55, 0.85), "every j"),
              ((7.15, 0.85), (7.6 + 0.9 * width / 2, 3.0), "once")]  # O_0 out
    for start, end, label in arrows:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.2,
                                     color="0.3"))
        ax.text((start[0] + end[0]) / 2 + 0.1, 2.1, label, fontsize=8, color="0.3")
    ax.set(xlim=(-0.1, 10.1), ylim=(-1.05, 4.9),
           title="GPU memory, and the loop FlashAttention-2 runs in it:\na query block stays in "
                 "one SM's SRAM; K and V tiles stream through")
    ax.axis("off")
    fig.tight_layout()
    return ax


def plot_roofline(roofs: dict, kernels: dict, title: str = "Roofline (modelled)",
                  measured: dict | None = None):
    """Log-log roofline: attainable FLOP/s ``min(P, W * I)`` against arithmetic intensity ``I``
    (FLOP/byte), one line per device, and each kernel as a labelled dot on the first device's roof.

    ``roofs``: ``{device: (peak FLOP/s P, bandwidth bytes/s W)}``, positive numbers; each line's
    legend entry names its balance point ``P / W``. ``kernels``: ``{label: intensity}``, positive;
    labels with the same intensity share one dot and one label (``"a, b: 2 kernels"``), above-left
    of it, or below-right where the dot before lies within a factor 4, joined to it by a short
    line, on a white box so that a roof line behind it does not cross the text.

    ``measured`` (optional): ``{label: (intensity, achieved FLOP/s)}``, positive; each is a hollow
    circle (``IMPLEMENTATION_COLOURS`` by label) joined by a dotted line to the first roof above it
    and annotated with how far below that roof it lies (``x1.9``). Returns the axes."""
    measured = dict(measured or {})
    for label, point in measured.items():
        if len(point) != 2 or min(point) <= 0:
            raise ValueError(f"measured {label!r} must be (intensity, FLOP/s), both > 0, "
                             f"got {point!r}")
    if not roofs or not kernels:
        raise ValueError(f"need at least one roof and one kernel, got {len(roofs)} and "
                         f"{len(kernels)}")
    for name, pw in roofs.items():
        if len(pw) != 2 or min(pw) <= 0:
            raise ValueError(f"roof {name!r} must be (peak FLOP/s, bytes/s), both > 0, got {pw!r}")
    if min(kernels.values()) <= 0:
        raise ValueError(f"intensities must be > 0, got {kernels!r}")
    shared_dot: dict[float, list[str]] = {}
    for label, intensity in kernels.items():  # one dot per distinct intensity
        shared_dot.setdefault(round(float(intensity), 6), []).append(label)
    lo = min(min(shared_dot), min(p / w for p, w in roofs.values())) / 100  # room for a label
    hi = max(max(shared_dot), max(p / w for p, w in roofs.values())) * 4
    xs = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = sns.color_palette("dark", len(roofs))
    for k, ((name, (peak, bw)), colour) in enumerate(zip(roofs.items(), colours, strict=True)):
        ax.loglog(xs, np.minimum(peak, bw * xs), color=colour, lw=2 if k == 0 else 1.2,
                  label=f"{name}: balance {peak / bw:.0f} FLOP/byte")
    peak, bw = next(iter(roofs.values()))
    below, previous = False, None
    for k, (intensity, labels) in enumerate(sorted(shared_dot.items())):
        y = min(peak, bw * intensity)
        ax.plot([intensity], [y], "o", ms=7, color="tab:red", zorder=3, gid=", ".join(labels),
                label=f"kernel, on the {next(iter(roofs))} roof" if k == 0 else None)
        text = labels[0] if len(labels) == 1 else f"{', '.join(labels)}: {len(labels)} kernels"
        # above-left of the dot, off the roofs; below-right when the dot before is within x4;
        # a short red line joins each label to its own dot
        below = previous is not None and intensity < 4 * previous and not below
        ax.annotate(text, (intensity, y), fontsize=8, xytext=(12, -12) if below else (-10, 10),
                    textcoords="offset points", ha="left" if below else "right",
                    va="top" if below else "bottom",
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.9},
                    arrowprops={"arrowstyle": "-", "color": "tab:red", "lw": 0.8, "shrinkB": 4})
        previous = intensity
    for k, (label, (intensity, achieved)) in enumerate(measured.items()):
        roof = min(peak, bw * intensity)
        colour = IMPLEMENTATION_COLOURS.get(label, f"C{4 + k}")
        ax.plot([intensity, intensity], [achieved, roof], ":", color=colour, lw=1)
        ax.plot([intensity], [achieved], "o", ms=9, mfc="none", mew=1.8, color=colour, zorder=3,
                gid=f"measured: {label}", label=f"{label}, measured")
        ax.annotate(f"x{roof / achieved:.1f} below the roof", (intensity, achieved), fontsize=8,
                    xytext=(8, -4), textcoords="offset points", ha="left", va="top", color=colour)
    top = max(p for p, _ in roofs.values())
    ax.set(xlabel="arithmetic intensity (FLOP/byte, log scale)", ylim=(None, 8 * top),
           ylabel="attainable FLOP/s (log scale)", xlim=(lo, hi), title=title)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return ax


def plot_block_sweep(blocks, times_ms, causal_ms, sdpa_ms: float, extra_mib, T: int,
                     device: str = "cpu"):
    """Time per call of a tiled attention against its block size, full and causal, with SDPA's
    time as a line (top panel), and the extra memory (bottom panel, same x axis); returns
    ``(ax, ax_memory)``.

    ``blocks``, ``times_ms``, ``causal_ms``, ``extra_mib``: ``n`` each (block sizes, ms per call,
    ms per causal call, MiB beyond the output). ``sdpa_ms``: one number, written in its legend
    entry. No causal / full ratio
    is written on the panel: near a ratio of 1 it would read as a finding. A block equal to ``T``
    is labelled as the one tile of naive attention."""
    blocks = list(blocks)
    _same_lengths(blocks=blocks, times_ms=times_ms, causal_ms=causal_ms, extra_mib=extra_mib)
    fig, (ax, ax_mem) = plt.subplots(2, 1, figsize=(7, 5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    ax.loglog(blocks, list(times_ms), "s-", base=2, color="tab:blue", label="tiled_attention")
    ax.loglog(blocks, list(causal_ms), "v--", base=2, color="tab:cyan",
              label="tiled_attention, causal")
    ax.axhline(sdpa_ms, color="tab:green", ls="-", lw=1.5, label=f"SDPA ({sdpa_ms:.2f} ms)")
    log_ticks(ax, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0))  # the times span about one decade
    ax.set(ylabel="time per call\n(ms, log scale)")
    ax.set_title(f"Tiled attention at T = {T} on {device}, by block size")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    ax_mem.loglog(blocks, list(extra_mib), "o-", color="tab:purple", base=2,
                  label="tiled_attention")
    ax_mem.set(xlabel="block size b", ylabel="extra memory beyond\nthe output (MiB, log scale)")
    log_ticks(ax_mem)
    ax_mem.set_xticks(blocks, [f"{b}\n(one tile)" if b == T else str(b) for b in blocks])
    fig.tight_layout()
    return ax, ax_mem


_TIME_STYLE = {"NumPy reference": "o-", "naive PyTorch": "s-", "SDPA": "^-",
               "tiled loop (eager)": "D--"}
# one colour per implementation in every figure of notebook 05 (CPU or GPU, timed or recorded)
IMPLEMENTATION_COLOURS = {"NumPy reference": "C0", "naive PyTorch": "C1", "SDPA": "C2",
                          "tiled loop (eager)": "C3"}


def plot_times_by_length(lengths, panels: dict, extra: dict | None = None,
                         reference: str = "SDPA", device: str = "cpu"):
    """Log-log time per call against sequence length, one panel per dtype; returns the axes.

    ``lengths``: ``n`` sequence lengths. ``panels``: ``{dtype name: {implementation: n times in
    ms}}``. ``extra``: optional ``{dtype name: {label: (lengths, times)}}``, drawn dotted in the
    colour of the implementation the label starts with (e.g. the CPU's times beside a GPU's).
    Each panel gets a slope-2 line through twice ``reference``'s time at the longest length (beside
    its line, not on top of it)."""
    lengths, extra = list(lengths), extra or {}
    names = list(dict.fromkeys(n for p in panels.values() for n in p))
    for title, times in panels.items():
        for name, ms in times.items():
            if len(list(ms)) != len(lengths):
                raise ValueError(f"{title}, {name}: {len(list(ms))} times for "
                                 f"{len(lengths)} lengths")
        if reference not in times:
            raise ValueError(f"panel {title!r} has no {reference!r} times for the slope-2 line")
    colour = {name: IMPLEMENTATION_COLOURS.get(name, f"C{4 + i}") for i, name in enumerate(names)}
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 + 3.5 * (len(panels) - 1), 4.3),
                             sharey=True, squeeze=False)
    for ax, (title, times) in zip(axes[0], panels.items(), strict=True):
        for name, ms in times.items():
            # the tiled loop: a large hollow marker, visible over a coinciding one
            hollow = name == "tiled loop (eager)"
            ax.loglog(lengths, list(ms), _TIME_STYLE.get(name, "o-"), color=colour[name],
                      label=name, base=2, ms=12 if hollow else 6, mfc="none" if hollow else None,
                      mew=1.5 if hollow else None)
        for label, (xs, ys) in extra.get(title, {}).items():
            base_name = next((n for n in names if label.startswith(n)), None)
            ax.loglog(list(xs), list(ys), "x:", color=colour.get(base_name, "grey"), label=label,
                      base=2)
        last = 2 * list(times[reference])[-1]  # twice its last time: beside its line, not on it
        ax.loglog(lengths, [last * (T / lengths[-1]) ** 2 for T in lengths], "k:",
                  label=r"$\propto T^2$ (slope 2)", base=2)
        ax.set_xticks(lengths, [str(T) for T in lengths])
        log_ticks(ax)
        ax.set(xlabel="sequence length T", title=f"Time on {device}, {title}")
    axes[0, 0].set_ylabel("time per call (ms, log scale)")
    axes[0, -1].legend(*axes[0, 0].get_legend_handles_labels(), fontsize=8, loc="upper left",
                       bbox_to_anchor=(1.02, 1))
    return axes[0]


def plot_gpu_record(times: dict, peaks: dict, capacity_mib: float | None = None,
                    gpu: str = "GPU", memory_label: str = "forward peak memory"):
    """Two log-log panels of measurements recorded on a GPU; returns the two axes.

    ``times``: ``{label: (lengths, ms per call)}``, drawn left. ``peaks``: ``{label: (lengths,
    MiB)}``, drawn right; a label ending in ``"(formula)"`` is drawn dotted (an extrapolation, not
    a measurement). ``capacity_mib``: the card's memory, a grey line on the right panel.
    ``memory_label`` names the right panel's quantity. Each label's lengths and values must have
    the same length."""
    for name, series in (("times", times), ("peaks", peaks)):
        for label, (xs, ys) in series.items():
            if len(list(xs)) != len(list(ys)) or not list(xs):
                raise ValueError(f"{name}[{label!r}]: {len(list(xs))} lengths for "
                                 f"{len(list(ys))} values (need the same, at least one)")
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.3))
    colour = dict(IMPLEMENTATION_COLOURS)  # the implementation is the label's text before a comma
    for ax, series in ((ax_t, times), (ax_m, peaks)):
        for label, (xs, ys) in series.items():
            base = label.removesuffix(" (formula)")
            colour.setdefault(base.split(",")[0], f"C{len(colour)}")
            dotted = label.endswith("(formula)")
            style = ":" if dotted else ("o-" if "float16" in label or ax is ax_m else "s--")
            ax.loglog(list(xs), list(ys), style, color=colour[base.split(",")[0]], label=label,
                      base=2)
        log_ticks(ax)
        ax.set_xlabel("sequence length T")
        ax.legend(fontsize=8, loc="upper left" if ax is ax_t else "lower right")
    lengths = sorted({x for xs, _ in times.values() for x in xs})
    ax_t.set_xticks(lengths, [str(T) for T in lengths])
    ax_t.set(ylabel="time per call (ms, log scale)", title=f"{gpu}: time per call")
    if capacity_mib is not None:
        ax_m.axhline(capacity_mib, color="grey", lw=1)
        ax_m.text(ax_m.get_xlim()[0] * 1.2, capacity_mib * 1.4, f"the card's memory, "
                  f"{capacity_mib / 1024:.0f} GiB", fontsize=8, color="dimgrey")
        ax_m.set_ylim(top=capacity_mib * 6)
    from matplotlib.ticker import LogLocator

    ax_m.yaxis.set_major_locator(LogLocator(base=10))  # decades only: the axis spans six of them
    mem_lengths = sorted({x for xs, _ in peaks.values() for x in xs})
    ax_m.set_xticks(mem_lengths, [str(T) for T in mem_lengths], rotation=45)
    ax_m.set(ylabel="peak memory (MiB, log scale)", title=f"{gpu}: {memory_label}")
    fig.tight_layout()
    return ax_t, ax_m


def plot_mask_error_vs_gap(gaps, err_gradual, err_flushed, err_before, cut_gradual: float,
                           cut_flushed: float,
                           flushed_label: str = "(b) renormalise after, denormals flushed",
                           floor: float = -7.0):
    """Notebook 03's float32 masks: the largest error of the two allowed weights of the scores
    (0, 1, g), key 2 in the future, against the gap g, on a log10 axis; returns the axes.

    ``gaps``: (n,) gaps g. ``err_gradual``, ``err_flushed``: (n,) errors of (b), renormalising
    after the softmax, with gradual underflow (blue) and with denormals flushed (red); NaN where
    (b) gave NaN, drawn as a row of markers per curve above the error axis. ``err_before``: (n,)
    errors of (a), -inf before the softmax (green). ``cut_gradual``, ``cut_flushed``: the gap past
    which e^-g is 0 in each mode; dashed lines mark each cut-off c and c + 1 (NaN), labelled on top.
    ``flushed_label``: the legend's name of the red curve. ``floor``: log10 of the smallest error
    drawn (below -6); smaller errors, and 0, are drawn at it. NumPy arrays or torch tensors."""
    n = _same_lengths(gaps=gaps, err_gradual=err_gradual, err_flushed=err_flushed,
                      err_before=err_before)
    if n < 2:
        raise ValueError(f"need at least 2 gaps; got {n}")
    gaps = _to_numpy("gaps", gaps)
    named = (("err_gradual", err_gradual), ("err_flushed", err_flushed), ("err_before", err_before))
    errs = [_to_numpy(name, e) for name, e in named]
    if gaps.ndim != 1 or any(e.ndim != 1 for e in errs):
        raise ValueError("gaps and the three errors must be 1-D, one entry per gap")
    if not np.isfinite(gaps).all() or np.any(np.diff(gaps) <= 0):
        raise ValueError("gaps must be finite and increasing")
    if any(np.nanmin(e, initial=0.0) < 0 for e in errs):
        raise ValueError("errors are absolute values: none may be negative")
    if not (np.isfinite(cut_gradual) and np.isfinite(cut_flushed)):
        raise ValueError(f"the cut-offs must be finite; got {cut_gradual!r}, {cut_flushed!r}")
    if not floor < -6:
        raise ValueError(f"floor must lie below -6 (the lowest labelled error, 1e-6); "
                         f"got {floor!r}")
    err_gradual, err_flushed, err_before = errs

    def log_err(e):  # log10, with errors below 10^floor (or exactly 0) at the floor
        return np.maximum(np.log10(np.maximum(e, 1e-30)), floor)

    fig, ax = plt.subplots(figsize=(10, 4.8), layout="constrained")
    gradual_label = "(b) renormalise after, gradual underflow"
    for err, colour, lw, nan_row, name in ((err_flushed, "C3", 2.5, 1.0, flushed_label),
                                           (err_gradual, "C0", 1.2, 2.0, gradual_label)):
        ok = ~np.isnan(err)
        ax.plot(gaps[ok], log_err(err[ok]), color=colour, lw=lw, label=name)
        ax.plot(gaps[~ok], np.full(int((~ok).sum()), nan_row), "|", color=colour, ms=10, mew=1.5)
    ax.plot(gaps, log_err(err_before), color="C2", lw=2.5, label="(a) -inf before the softmax")
    cuts = sorted((c + shift, colour) for c, colour in ((cut_gradual, "C0"), (cut_flushed, "C3"))
                  for shift in (0, 1))
    # dashed lines from the floor to just below the NaN rows
    ax.vlines([c for c, _ in cuts], floor - 0.5, 0.5, color="gray", ls="--", lw=1)
    cut_axis = ax.secondary_xaxis("top")
    cut_axis.set_xticks([c for c, _ in cuts], [f"{c:.2f}" for c, _ in cuts], fontsize=8)
    sides = ("right", "left") * 2
    for tick, (_, colour), side in zip(cut_axis.get_xticklabels(), cuts, sides, strict=True):
        tick.set_color(colour)
        tick.set_horizontalalignment(side)  # each pair of labels spreads apart, clear of the other
    cut_axis.set_xlabel("dashed: cut-offs from torch.finfo, where (b) turns (0, 1), then NaN",
                        fontsize=9)
    ax.set_yticks([floor, -6, -4, -2, 0, 1, 2],
                  [f"≤ $10^{{{floor:g}}}$\n(rounding)", "$10^{-6}$", "$10^{-4}$", "$10^{-2}$", "1",
                   "NaN, flushed", "NaN, gradual"])
    for tick, colour in zip(ax.get_yticklabels()[-2:], ("C3", "C0"), strict=True):
        tick.set_color(colour)
    ax.set_ylim(floor - 0.5, 2.5)
    ax.set_xlabel("gap g: the scores are (0, 1, g), key 2 in the future")
    ax.set_ylabel("largest error of the two allowed weights")
    ax.set_title("float32 scores (0, 1, g): renormalising after the softmax goes silently wrong, "
                 "then NaN")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    return ax
