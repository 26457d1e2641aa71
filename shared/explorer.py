"""An attention explorer for notebook 02: a temperature slider and a query picker redraw the
weights heatmap and the picked query's context vector.

``attention_explorer(Q, K, V, tokens)`` shows the controls (ipywidgets) and draws the default
state as an ordinary figure, so a notebook without a live kernel (the book site, nbval) shows and
compares that static picture. With a kernel (JupyterLab, Colab), moving a control redraws the
figure inside the panel. The arithmetic lives in ``explorer_state``, which needs no widgets.

The weights are ``softmax(Q K^T / temperature)``: ``temperature = sqrt(d_k)`` is scaled
dot-product attention, a small temperature sharpens every row towards its largest score, a large
one flattens it towards the uniform average.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["explorer_state", "draw_explorer", "attention_explorer", "AttentionExplorer"]

TEMPERATURE_RANGE = (0.03, 30.0)  # the slider's ends (a log scale)


def _as_matrix(name: str, x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.number):
        raise TypeError(f"{name} must be a numeric array or tensor; got dtype {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (T, d); got shape {a.shape}")
    return a.astype(np.float64)


def explorer_state(Q, K, V, temperature: float, query: int) -> dict:
    """The numbers the explorer draws, for one slider value and one picked query.

    Shapes: Q ``(T_q, d_k)``, K ``(T_k, d_k)``, V ``(T_k, d_v)`` (arrays or tensors);
    ``temperature`` > 0; ``query`` in ``0..T_q-1``.

    Returns a dict: ``weights`` ``(T_q, T_k)`` = softmax(Q K^T / temperature) row by row,
    ``row`` ``(T_k,)`` the picked query's weights, ``context`` ``(d_v,)`` = row @ V,
    ``entropy`` (nats) of that row, ``temperature`` and ``query``.
    """
    Q, K, V = _as_matrix("Q", Q), _as_matrix("K", K), _as_matrix("V", V)
    if Q.shape[1] != K.shape[1]:
        raise ValueError(f"Q and K need the same width d_k; got Q {Q.shape} and K {K.shape}")
    if V.shape[0] != K.shape[0]:
        raise ValueError(f"V needs one row per key; got K {K.shape} and V {V.shape}")
    temperature = float(temperature)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number; got {temperature}")
    if isinstance(query, bool) or not isinstance(query, (int, np.integer)) \
            or not 0 <= query < Q.shape[0]:
        raise ValueError(f"query must be a row index in 0..{Q.shape[0] - 1}; got {query!r}")
    scores = Q @ K.T / temperature
    scores = scores - scores.max(axis=-1, keepdims=True)  # stable softmax
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    row = weights[query]
    entropy = float(-(row * np.log(np.where(row > 0, row, 1.0))).sum())
    return {"weights": weights, "row": row, "context": row @ V, "entropy": entropy,
            "temperature": temperature, "query": int(query)}


def _context_path(Q, K, V, query: int, n: int = 121) -> np.ndarray:
    """The query's context vector for temperatures across the slider's range: (n, d_v)."""
    lo, hi = TEMPERATURE_RANGE
    return np.stack([explorer_state(Q, K, V, t, query)["context"]
                     for t in np.geomspace(lo, hi, n)])


def draw_explorer(Q, K, V, tokens, temperature: float, query: int, fig=None):
    """Draw one state of the explorer and return the ``Figure``.

    Left: the weights ``(T, T)`` on a fixed [0, 1] colour scale, the picked query's row outlined.
    Right: for ``d_v == 2``, the value vectors as points (area = the picked query's weight on
    them), the context vector as a star and, as a grey line, the path it takes as the temperature
    runs across the slider's range; for other ``d_v``, the context vector's entries as bars.
    """
    from matplotlib.patches import Rectangle

    state = explorer_state(Q, K, V, temperature, query)
    Vn = _as_matrix("V", V)
    T_q, T_k = state["weights"].shape
    tokens = [str(t) for t in tokens]
    if len(tokens) != T_k or T_q != T_k:
        raise ValueError(f"tokens must label the {T_k} tokens of a self-attention matrix; got "
                         f"{len(tokens)} labels for weights of shape {state['weights'].shape}")
    if fig is None:
        fig = plt.figure(figsize=(10.5, 4.6), dpi=100)
    fig.clear()
    ax_w, ax_z = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    image = ax_w.imshow(state["weights"], cmap="viridis", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax_w, label=r"weight $\alpha_{ij}$", shrink=0.9)
    for i in range(T_q):
        for j in range(T_k):
            w = state["weights"][i, j]
            ax_w.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=8,
                      color="black" if w > 0.6 else "white")
    ax_w.add_patch(Rectangle((-0.5, query - 0.5), T_k, 1, fill=False, edgecolor="#e4572e", lw=2.5))
    ax_w.set_xticks(range(T_k), tokens, rotation=45)
    ax_w.set_yticks(range(T_q), tokens)
    ax_w.set_xlabel("keys (attended to)")
    ax_w.set_ylabel("queries (attending)")
    ax_w.set_title(f"weights softmax($QK^\\top/\\tau$), $\\tau$ = {state['temperature']:.3f}")
    z = state["context"]
    if Vn.shape[1] == 2:
        path = _context_path(Q, K, V, query)
        ax_z.plot(path[:, 0], path[:, 1], color="grey", lw=1, zorder=1,
                  label=r"$z$ as $\tau$ runs over the slider")
        ax_z.scatter(Vn[:, 0], Vn[:, 1], s=40 + 1500 * state["row"], color="#4c72b0", alpha=0.6,
                     zorder=2, label="values $v_j$ (area = weight)")
        for j, tok in enumerate(tokens):  # alternate above/below, so close values stay legible
            ax_z.annotate(tok, Vn[j], textcoords="offset points", fontsize=8,
                          xytext=(7, 5) if j % 2 else (7, -11))
        ax_z.scatter([z[0]], [z[1]], marker="*", s=260, color="#e4572e", zorder=3,
                     label=f"context vector $z$ of '{tokens[query]}'")
        ax_z.margins(0.12)
        ax_z.set_xlabel("value dimension 0")
        ax_z.set_ylabel("value dimension 1")
        ax_z.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    else:
        ax_z.bar(range(len(z)), z, color="#e4572e")
        ax_z.set_xlabel("context vector dimension")
        ax_z.set_ylabel("value")
    ax_z.set_title(f"'{tokens[query]}': entropy {state['entropy']:.2f} nats "
                   f"(uniform {math.log(T_k):.2f})")
    fig.tight_layout()
    return fig


class AttentionExplorer:
    """The live panel: ``temperature`` slider, ``query`` picker and the figure they redraw.

    ``state`` holds the numbers of the current setting (see ``explorer_state``); ``set(...)``
    changes the setting from code exactly as the controls do. Shown in a notebook it renders as
    the widget panel; its plain-text form is one fixed line (no widget ids).
    """

    def __init__(self, Q, K, V, tokens, temperature: float | None = None, query: int = 0):
        import ipywidgets as widgets

        self.Q, self.K, self.V = _as_matrix("Q", Q), _as_matrix("K", K), _as_matrix("V", V)
        self.tokens = [str(t) for t in tokens]
        d_k = self.K.shape[1]
        self.default_temperature = math.sqrt(d_k) if temperature is None else float(temperature)
        self.state = explorer_state(self.Q, self.K, self.V, self.default_temperature, query)
        # The slider's grid runs through the default exactly, so the browser does not snap it
        # to a neighbouring step (which would redraw at once, away from the default).
        step, centre = 0.02, math.log10(self.default_temperature)
        lo, hi = (math.log10(t) for t in TEMPERATURE_RANGE)
        self.slider = widgets.FloatLogSlider(
            value=self.default_temperature, base=10, step=step,
            min=centre - round((centre - lo) / step) * step,
            max=centre + round((hi - centre) / step) * step,
            description="temperature τ", readout_format=".3f",
            style={"description_width": "initial"}, continuous_update=True)
        self.picker = widgets.Dropdown(
            options=[(f"{i}: {t}", i) for i, t in enumerate(self.tokens)], value=query,
            description="query", style={"description_width": "initial"})
        self.output = widgets.Output()
        note = widgets.HTML(f"τ = √d_k = {math.sqrt(d_k):.3f} is scaled dot-product attention")
        self.panel = widgets.VBox([widgets.HBox([self.slider, self.picker]), note, self.output])
        self._static = None  # the display handle of the default picture, once shown
        self.slider.observe(self._on_change, names="value")
        self.picker.observe(self._on_change, names="value")

    def set(self, temperature: float | None = None, query: int | None = None) -> dict:
        """Move the controls (and so redraw); returns the new ``state``."""
        if query is not None:
            self.picker.value = query
        if temperature is not None:
            self.slider.value = temperature
        return self.state

    def figure(self):
        """A new (closed) figure of the current state: display it, or save it."""
        fig = draw_explorer(self.Q, self.K, self.V, self.tokens, self.state["temperature"],
                            self.state["query"])
        plt.close(fig)  # shown by display(), never by the inline backend a second time
        return fig

    def _on_change(self, _change=None) -> None:
        temperature, query = self.slider.value, self.picker.value
        if query == self.state["query"] and math.isclose(temperature, self.state["temperature"],
                                                          rel_tol=1e-9):
            return  # a round trip through the browser, not a new setting: keep the picture
        self.state = explorer_state(self.Q, self.K, self.V, temperature, query)
        from IPython.display import clear_output, display

        with self.output:
            clear_output(wait=True)
            display(self.figure())
        if self._static is not None:  # the live figure replaces the default picture below
            self._static.update({"text/plain": ""}, raw=True)
            self._static = None

    def show(self) -> AttentionExplorer:
        """Display the controls, then the default state as an ordinary figure."""
        from IPython.display import display

        display(self)
        self._static = display(self.figure(), display_id=True)
        return self

    def _repr_mimebundle_(self, include=None, exclude=None):
        own = getattr(self.panel, "_repr_mimebundle_", None)  # ipywidgets 8; 7 (Colab) lacks it
        bundle = dict((own(include=include, exclude=exclude) if own else None) or {})
        bundle.setdefault("application/vnd.jupyter.widget-view+json", {
            "version_major": 2, "version_minor": 0, "model_id": self.panel.model_id})
        bundle["text/plain"] = ("attention explorer: a temperature slider and a query picker "
                                "(live with a running kernel; its default picture is below)")
        return bundle


def attention_explorer(Q, K, V, tokens, temperature: float | None = None,
                       query: int = 0) -> AttentionExplorer:
    """Show the explorer for one self-attention computation and return it.

    Shapes: Q, K ``(T, d_k)``, V ``(T, d_v)``; ``tokens``: T labels; ``temperature`` defaults
    to ``sqrt(d_k)``; ``query`` is the row picked first (0-based).
    """
    return AttentionExplorer(Q, K, V, tokens, temperature, query).show()
