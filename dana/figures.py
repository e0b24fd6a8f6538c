"""Figures drawn without pyplot: a :class:`matplotlib.figure.Figure` on its own Agg
canvas, so that writing a plot never changes matplotlib's global backend or pyplot's
figures (a notebook's inline backend stays as it was)."""

from __future__ import annotations

from typing import Any


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kw: Any):
    """``(figure, axes)`` as ``pyplot.subplots`` returns them, on a private Agg canvas
    (nothing to close: the figure is collected with its last reference)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kw)
