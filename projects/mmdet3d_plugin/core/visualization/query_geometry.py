"""Where the decoder's queries are: metric reference points and their pixels in the camera that sees them."""
from typing import Sequence

import numpy as np

from ...datasets.camera_geometry import project_points


def query_centres(reference_points: np.ndarray, pc_range: Sequence[float]) -> np.ndarray:
    """Metric LiDAR coordinates of normalised reference points.

    Args:
        reference_points (np.ndarray): ``[Q, 3]`` in ``[0, 1]`` (clamped, as the
            AQR projection clamps them).
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.

    Returns:
        np.ndarray: ``[Q, 3]`` float64 metres.
    """
    low = np.asarray(pc_range[:3], dtype=np.float64)
    high = np.asarray(pc_range[3:6], dtype=np.float64)
    return np.clip(np.asarray(reference_points, dtype=np.float64), 0.0, 1.0) * (high - low) + low


def query_pixels(centres: np.ndarray, lidar2img: np.ndarray, views: np.ndarray) -> np.ndarray:
    """Pixel of every query in its camera view.

    Args:
        centres (np.ndarray): ``[Q, 3]`` metric points.
        lidar2img (np.ndarray): ``[N, 4, 4]`` LiDAR -> input image matrices.
        views (np.ndarray): ``[Q]`` int view of each query, ``-1`` for a query
            seen by no camera (AQR's ``pts_pers_idx[..., 0]``).

    Returns:
        np.ndarray: ``[Q, 2]`` ``(u, v)`` input-image pixels; NaN for ``views == -1``.
    """
    centres = np.asarray(centres, dtype=np.float64)
    lidar2img = np.asarray(lidar2img, dtype=np.float64)
    views = np.asarray(views)
    if views.shape != centres.shape[:1] or (views >= len(lidar2img)).any():
        raise ValueError(f'views {views.shape} (max {views.max(initial=-1)}) must give one of the {len(lidar2img)} '
                         f'views for each of the {len(centres)} queries')
    pixels = np.full((len(centres), 2), np.nan)
    for view in np.unique(views[views >= 0]):
        chosen = views == view
        pixels[chosen] = project_points(centres[chosen], lidar2img[view])[0]
    return pixels
