"""What the lie probe predicts per query: does the LiDAR lie to it, does the camera lie to it?

The lie study's per-query truths (``models/aqr/sensor_lies.py``, read from the sample's corruption record):

* **LiDAR lies** where the query's reference point is within ``GHOST_MARGIN_M`` (2 m, BEV) of a ghost's box
  (``lidar_ghost``), the truth ``routing_targets.lidar_untrusted`` gives the router's targets;
* **camera lies** where the reference point projects into a yawed view (``view_yaw``): the view the router's
  projection picks for the query (``projection_info``) is live without the lies and dead with them
  (``routing_targets.live_camera_views``).
"""
from typing import Mapping

import torch
from torch import Tensor

from ..models.aqr.routing_targets import lidar_untrusted, live_camera_views

#: Columns of :func:`lie_targets`.
LIE_TARGETS = ('lidar', 'camera')


def yawed_view_mask(img_meta: Mapping, num_views: int, device: torch.device) -> Tensor:
    """``[num_views]`` bool: the views the sample's corruption yawed (live only when the lies are ignored)."""
    return live_camera_views(img_meta, num_views, device) & ~live_camera_views(img_meta, num_views, device, lies=True)


def lie_targets(reference_xyz: Tensor, pers_index: Tensor, visible: Tensor, img_meta: Mapping,
                num_views: int) -> Tensor:
    """The lie truths of one sample's queries.

    Args:
        reference_xyz (Tensor): ``[Q, 3]`` reference points in metres (LiDAR frame).
        pers_index (Tensor): ``[Q, 3]`` long ``(view, h, w)`` of each query's camera cell, ``-1`` where no view
            sees it (``projection_info['pts_pers_idx']`` of one sample).
        visible (Tensor): ``[Q]`` bool, a view sees the query.
        img_meta (Mapping): the sample's meta with its ``corruption`` record.
        num_views (int): camera views of the sample.

    Returns:
        Tensor: ``[Q, 2]`` bool, columns :data:`LIE_TARGETS`.
    """
    if reference_xyz.dim() != 2 or pers_index.shape != (reference_xyz.shape[0], 3) or visible.shape != \
            reference_xyz.shape[:1]:
        raise ValueError(f'reference_xyz [Q, 3], pers_index [Q, 3] and visible [Q] expected, got '
                         f'{tuple(reference_xyz.shape)}, {tuple(pers_index.shape)} and {tuple(visible.shape)}')
    lidar = lidar_untrusted(reference_xyz, img_meta, lies=True)
    yawed = yawed_view_mask(img_meta, num_views, reference_xyz.device)
    camera = visible & yawed[pers_index[:, 0].clamp(min=0)]
    return torch.stack([lidar, camera], dim=-1)
