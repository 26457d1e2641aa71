"""Pictures of attention: one heatmap, or a grid of heads. Every notebook draws with these.

Conventions: queries run down the rows, keys across the columns; masked cells (where the boolean
mask is False, i.e. "may not attend") are drawn as grey hatching, distinct from a small weight.
Both functions accept NumPy arrays or PyTorch tensors (moved to the CPU and detached).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = ["plot_attention", "plot_heads"]

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
        vmin=0.0 if vmax is not None else None,
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
    if allowed is not None and not allowed.all():
        for i, j in zip(*np.nonzero(~allowed), strict=True):
            ax.add_patch(
                plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#9a9a9a", lw=0)
            )
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
):
    """Draw one heatmap per head in a grid and return the ``Figure``.

    Shapes:
        weights: ``(num_heads, T_q, T_k)``; mask broadcastable to it (True = may attend).
        titles: ``num_heads`` strings (default "head 0", "head 1", ...).
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
        nrows, ncols, figsize=(0.5 * T_k * ncols + 1.5 * ncols, 0.45 * T_q * nrows + 1.2 * nrows),
        squeeze=False, constrained_layout=True,
    )
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
    fig.suptitle(suptitle)
    return fig
