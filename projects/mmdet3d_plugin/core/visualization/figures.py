"""Figures on matplotlib's Agg canvas and the colour scales the AQR pictures share."""
import os
import os.path as osp
from typing import Tuple

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

#: Smallest colour range: a constant value (e.g. the weights of an untrained router) still gets a valid scale.
MIN_RANGE = 1e-6


def new_figure(size_in: Tuple[float, float]) -> Figure:
    """A figure of ``size_in`` (width, height) inches on an Agg canvas, with constrained layout."""
    figure = Figure(figsize=size_in, layout='constrained')
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, path: str, dpi: int = 100) -> str:
    """Write ``figure`` as a PNG to ``path`` (folders created); returns ``path``."""
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=dpi, format='png')
    return path


def value_norm(values: np.ndarray) -> Normalize:
    """Colour scale from the smallest to the largest finite value (widened around a constant)."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return Normalize(0.0, 1.0)
    low, high = float(finite.min()), float(finite.max())
    if high - low < MIN_RANGE:
        low, high = low - MIN_RANGE, high + MIN_RANGE
    return Normalize(low, high)


def symmetric_norm(*arrays: np.ndarray) -> Normalize:
    """Colour scale ``[-m, m]`` with ``m`` the largest absolute value of the arrays (0 in the middle)."""
    largest = max((float(np.abs(a).max()) for a in arrays if np.size(a)), default=0.0)
    largest = max(largest, MIN_RANGE)
    return Normalize(-largest, largest)
