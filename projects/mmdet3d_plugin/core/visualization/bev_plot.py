"""Bird's-eye view: LiDAR points, ground-truth and predicted boxes, and the queries coloured by a value."""
from typing import Optional, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...datasets.box_geometry import bev_corners
from .figures import new_figure, value_norm

GT_COLOUR = 'tab:green'
PRED_COLOUR = 'tab:red'
HIGHLIGHT_COLOUR = 'magenta'
#: Most LiDAR points drawn (an evenly strided subset of a larger cloud).
MAX_POINTS = 40000


def draw_boxes(ax: Axes, boxes: np.ndarray, colour: str, linewidth: float = 1.2) -> None:
    """Outline LiDAR boxes ``[M, >=7]`` (``x, y, z, dx, dy, dz, yaw``) in BEV, with a tick from centre to front."""
    for corners, box in zip(bev_corners(boxes), np.asarray(boxes, dtype=np.float64)):
        ring = np.vstack([corners, corners[:1]])
        ax.plot(ring[:, 0], ring[:, 1], color=colour, linewidth=linewidth)
        front = corners[[0, 3]].mean(axis=0)  # corners 0 and 3 are at +dx / 2 along the heading
        ax.plot([box[0], front[0]], [box[1], front[1]], color=colour, linewidth=linewidth)


def draw_points(ax: Axes, points: np.ndarray) -> None:
    """LiDAR points ``[P, >=2]`` as small grey dots."""
    points = np.asarray(points)
    step = max(1, int(np.ceil(len(points) / MAX_POINTS)))
    ax.scatter(points[::step, 0], points[::step, 1], s=0.3, c='0.55', alpha=0.5, linewidths=0, rasterized=True)


def plot_bev(pc_range: Sequence[float],
             points: Optional[np.ndarray] = None,
             gt_boxes: Optional[np.ndarray] = None,
             pred_boxes: Optional[np.ndarray] = None,
             query_xy: Optional[np.ndarray] = None,
             query_values: Optional[np.ndarray] = None,
             value_label: str = 'LiDAR weight',
             highlight: Optional[int] = None,
             title: str = '') -> Figure:
    """The BEV picture (x to the right, y up, metres, limits from ``pc_range``).

    Args:
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        points (np.ndarray, optional): ``[P, >=2]`` LiDAR points.
        gt_boxes (np.ndarray, optional): ``[M, >=7]`` ground-truth boxes (green).
        pred_boxes (np.ndarray, optional): ``[D, >=7]`` predicted boxes (red).
        query_xy (np.ndarray, optional): ``[Q, 2]`` query positions.
        query_values (np.ndarray, optional): ``[Q]`` colour of each query
            (with a colorbar named ``value_label``); grey dots without.
        value_label (str): colorbar label.
        highlight (int, optional): query to mark with a star.
        title (str): axes title.

    Returns:
        Figure: on an Agg canvas.
    """
    figure = new_figure((9.0, 8.0))
    ax = figure.add_subplot()
    if points is not None and len(points):
        draw_points(ax, points)
    legend = []
    for boxes, colour, name in ((gt_boxes, GT_COLOUR, 'ground truth'), (pred_boxes, PRED_COLOUR, 'prediction')):
        if boxes is not None:
            draw_boxes(ax, boxes, colour)
            legend.append(Line2D([], [], color=colour, label=f'{name} ({len(boxes)})'))
    if query_xy is not None:
        query_xy = np.asarray(query_xy)
        if query_values is None:
            ax.scatter(query_xy[:, 0], query_xy[:, 1], s=10, c='0.2', marker='o', linewidths=0)
        else:
            norm = value_norm(query_values)
            dots = ax.scatter(query_xy[:, 0], query_xy[:, 1], s=16, c=query_values, cmap='viridis', norm=norm,
                              edgecolors='k', linewidths=0.2)
            figure.colorbar(dots, ax=ax, shrink=0.8, label=f'{value_label} (range {norm.vmin:.3f} .. {norm.vmax:.3f})')
        legend.append(Line2D([], [], color='0.2', marker='o', linestyle='', label=f'queries ({len(query_xy)})'))
        if highlight is not None:
            ax.scatter(*query_xy[highlight], s=260, marker='*', facecolors='none', edgecolors=HIGHLIGHT_COLOUR,
                       linewidths=1.8)
            legend.append(Line2D([], [], color=HIGHLIGHT_COLOUR, marker='*', linestyle='', markerfacecolor='none',
                                 markersize=12, label=f'query {highlight}'))
    ax.set_xlim(pc_range[0], pc_range[3])
    ax.set_ylim(pc_range[1], pc_range[4])
    ax.set_aspect('equal')
    ax.set_xlabel('x (m, LiDAR frame)')
    ax.set_ylabel('y (m)')
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(handles=legend, loc='upper right', fontsize=8, framealpha=0.8)
    return figure
