"""One query's cross-attention bias as heat maps over the BEV key grid and over each camera's key grid."""
from typing import Optional, Sequence, Tuple

import numpy as np
from matplotlib.figure import Figure

from .camera_plot import view_grid
from .figures import new_figure, symmetric_norm

HIGHLIGHT_COLOUR = 'magenta'
CMAP = 'RdBu_r'
#: Fewest cells shown around the biased BEV cells on each side when the BEV panel zooms in on them.
ZOOM_MARGIN_CELLS = 4


def biased_extent(bias: np.ndarray, pc_range: Sequence[float]) -> Tuple[float, float, float, float]:
    """``(x_min, x_max, y_min, y_max)`` (m) of the BEV cells with a non-zero bias, with a margin.

    The margin on each side is the biased region's own size (at least
    ``ZOOM_MARGIN_CELLS`` cells), so the region fills about a third of the
    view; the result stays inside ``pc_range`` (all of it when nothing is biased).
    """
    height, width = bias.shape
    rows, columns = np.nonzero(bias)
    if rows.size == 0:
        return pc_range[0], pc_range[3], pc_range[1], pc_range[4]
    cell_x = (pc_range[3] - pc_range[0]) / width
    cell_y = (pc_range[4] - pc_range[1]) / height
    margin_x = max(columns.max() + 1 - columns.min(), ZOOM_MARGIN_CELLS)
    margin_y = max(rows.max() + 1 - rows.min(), ZOOM_MARGIN_CELLS)
    return (pc_range[0] + max(columns.min() - margin_x, 0) * cell_x,
            pc_range[0] + min(columns.max() + 1 + margin_x, width) * cell_x,
            pc_range[1] + max(rows.min() - margin_y, 0) * cell_y,
            pc_range[1] + min(rows.max() + 1 + margin_y, height) * cell_y)


def plot_query_bias(bev_bias: np.ndarray,
                    camera_bias: np.ndarray,
                    pc_range: Sequence[float],
                    names: Sequence[str],
                    images: Optional[Sequence[np.ndarray]] = None,
                    query_xy: Optional[Tuple[float, float]] = None,
                    query_pixel: Optional[Tuple[int, float, float]] = None,
                    title: str = '') -> Figure:
    """The heat maps of one query's bias (keys with zero bias are left transparent).

    One symmetric colour scale (0 white) for all panels. The BEV grid spans
    ``pc_range`` in x / y; its panel zooms in on the biased cells
    (:func:`biased_extent`). Each camera grid spans its whole (padded) input
    image, drawn faintly underneath when ``images`` are given.

    Args:
        bev_bias (np.ndarray): ``[H_bev, W_bev]``, row ``y`` from ``y_min``.
        camera_bias (np.ndarray): ``[N, H_img, W_img]``.
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        names (Sequence[str]): ``N`` camera names.
        images (Sequence[np.ndarray], optional): ``N`` ``[H, W, 3]`` uint8
            input images (the padded size the camera keys cover).
        query_xy (tuple[float, float], optional): the query's BEV position (m).
        query_pixel (tuple[int, float, float], optional): ``(view, u, v)`` of
            the query in the camera that sees it.
        title (str): figure title.

    Returns:
        Figure: on an Agg canvas.
    """
    if len(camera_bias) != len(names):
        raise ValueError(f'{len(camera_bias)} camera grids but {len(names)} camera names')
    rows, columns, places = view_grid(names)
    figure = new_figure((8.0 + 4.2 * columns, 7.0))
    grid = figure.add_gridspec(rows, columns + 2)
    norm = symmetric_norm(bev_bias, camera_bias)
    ax = figure.add_subplot(grid[:, :2])
    heat = ax.imshow(np.ma.masked_equal(bev_bias, 0.0), origin='lower', cmap=CMAP, norm=norm, interpolation='nearest',
                     extent=(pc_range[0], pc_range[3], pc_range[1], pc_range[4]))
    ax.set_facecolor('0.93')
    if query_xy is not None:
        ax.scatter(*query_xy, s=200, marker='*', facecolors='none', edgecolors=HIGHLIGHT_COLOUR, linewidths=1.5)
    x_min, x_max, y_min, y_max = biased_extent(bev_bias, pc_range)
    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.set_xlabel('x (m, LiDAR frame)')
    ax.set_ylabel('y (m)')
    ax.set_title(f'BEV keys {bev_bias.shape[0]}x{bev_bias.shape[1]} ({int(np.count_nonzero(bev_bias))} biased), '
                 f'x {x_min:.1f}..{x_max:.1f} m, y {y_min:.1f}..{y_max:.1f} m', fontsize=9)
    for view, (name, (row, column)) in enumerate(zip(names, places)):
        ax = figure.add_subplot(grid[row, column + 2])
        keys = camera_bias[view]
        height, width = images[view].shape[:2] if images is not None else keys.shape
        if images is not None:
            ax.imshow(images[view], alpha=0.45)
        ax.imshow(np.ma.masked_equal(keys, 0.0), cmap=CMAP, norm=norm, interpolation='nearest', alpha=0.9,
                  extent=(0, width, height, 0))
        if query_pixel is not None and query_pixel[0] == view:
            ax.scatter(query_pixel[1], query_pixel[2], s=200, marker='*', facecolors='none',
                       edgecolors=HIGHLIGHT_COLOUR, linewidths=1.5)
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        ax.set_title(f'{name}: keys {keys.shape[0]}x{keys.shape[1]} ({int(np.count_nonzero(keys))} biased)',
                     fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    figure.colorbar(heat, ax=figure.axes, shrink=0.8, label='bias added to the attention logits')
    figure.suptitle(title, fontsize=10)
    return figure
