"""The camera images of a sample in a grid, with the queries each camera sees coloured by a value."""
from typing import List, Optional, Sequence, Tuple

import numpy as np
from matplotlib.figure import Figure

from .figures import new_figure, value_norm

HIGHLIGHT_COLOUR = 'magenta'
#: nuScenes' six cameras as they are usually shown: front row, then back row.
NUSCENES_LAYOUT = (('CAM_FRONT_LEFT', 'CAM_FRONT', 'CAM_FRONT_RIGHT'),
                   ('CAM_BACK_LEFT', 'CAM_BACK', 'CAM_BACK_RIGHT'))
COLUMNS = 3


def view_grid(names: Sequence[str]) -> Tuple[int, int, List[Tuple[int, int]]]:
    """Grid of the camera panels: ``(rows, columns, [(row, column) of each view])``.

    The six nuScenes cameras (in any order) go to their usual places (front
    row: left, front, right; back row: left, back, right); other rigs fill
    rows of three in view order.
    """
    layout = [name for row in NUSCENES_LAYOUT for name in row]
    if sorted(names) == sorted(layout):
        return len(NUSCENES_LAYOUT), COLUMNS, [divmod(layout.index(name), COLUMNS) for name in names]
    rows = max(1, -(-len(names) // COLUMNS))
    return rows, COLUMNS, [divmod(index, COLUMNS) for index in range(len(names))]


def plot_cameras(images: Sequence[np.ndarray],
                 names: Sequence[str],
                 query_uv: Optional[np.ndarray] = None,
                 query_views: Optional[np.ndarray] = None,
                 query_values: Optional[np.ndarray] = None,
                 value_label: str = 'camera weight',
                 highlight: Optional[int] = None,
                 title: str = '') -> Figure:
    """The camera grid, each query drawn in the view that sees it.

    Args:
        images (Sequence[np.ndarray]): ``N`` ``[H, W, 3]`` uint8 RGB images.
        names (Sequence[str]): ``N`` camera names (panel titles and layout).
        query_uv (np.ndarray, optional): ``[Q, 2]`` pixel of each query in its view.
        query_views (np.ndarray, optional): ``[Q]`` view of each query, ``-1``
            for none (not drawn).
        query_values (np.ndarray, optional): ``[Q]`` colour of each query
            (with a colorbar named ``value_label``).
        value_label (str): colorbar label.
        highlight (int, optional): query to mark with a star (if a view sees it).
        title (str): figure title.

    Returns:
        Figure: on an Agg canvas.
    """
    if len(images) != len(names):
        raise ValueError(f'{len(images)} images but {len(names)} camera names')
    rows, columns, places = view_grid(names)
    height, width = images[0].shape[:2]
    figure = new_figure((5.0 * columns, 5.0 * rows * height / width + 1.2))
    axes = figure.subplots(rows, columns, squeeze=False)
    norm = value_norm(query_values) if query_values is not None else None
    dots = None
    for view, (image, name, (row, column)) in enumerate(zip(images, names, places)):
        ax = axes[row, column]
        ax.imshow(image)
        seen = np.zeros(0, dtype=bool) if query_views is None else np.asarray(query_views) == view
        if seen.any():
            uv = np.asarray(query_uv)[seen]
            dots = ax.scatter(uv[:, 0], uv[:, 1], s=22, c=np.asarray(query_values)[seen], cmap='plasma', norm=norm,
                              edgecolors='w', linewidths=0.4)
            if highlight is not None and seen[highlight]:
                ax.scatter(*np.asarray(query_uv)[highlight], s=320, marker='*', facecolors='none',
                           edgecolors=HIGHLIGHT_COLOUR, linewidths=2.0)
        ax.set_xlim(0, image.shape[1])
        ax.set_ylim(image.shape[0], 0)
        ax.set_title(f'{name} ({int(seen.sum())} queries)', fontsize=9)
        ax.set_axis_off()
    for row, column in set(np.ndindex(rows, columns)) - set(places):
        axes[row, column].set_axis_off()
    if dots is not None:
        figure.colorbar(dots, ax=axes, shrink=0.8, label=f'{value_label} (range {norm.vmin:.3f} .. {norm.vmax:.3f})')
    figure.suptitle(title, fontsize=10)
    return figure
