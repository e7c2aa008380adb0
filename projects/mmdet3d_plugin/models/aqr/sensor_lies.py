"""Where a sample's sensors lie, read from its corruption record (``img_meta['corruption']``).

The lying corruptions of ``datasets/pipelines/corruption.py`` give plausible but wrong evidence, and their record
says where:

* ``ghost_boxes`` (``lidar_ghost``, ``mixed_lie``): objects that exist only in the point cloud. The record keeps
  them in the frame the corruption placed them in, before the training pipeline's 3D augmentation;
  :func:`ghost_boxes` replays that augmentation (``transformation_3d_flow``: ``R``, ``S``, ``T``, ``HF``, ``VF``
  with ``pcd_rotation``, ``pcd_scale_factor``, ``pcd_trans``, as mmdet3d's ``apply_3d_transformation`` does
  for points), so the boxes sit where the model sees their points;
* ``yawed_views`` (``view_yaw``, ``mixed_lie``): camera views whose calibration is wrong (:func:`yawed_views`);
* ``misaligned`` (``lidar_misalign``): the whole point cloud moved against the cameras and the boxes
  (:func:`lidar_misaligned`).

A query whose reference point is within ``GHOST_MARGIN_M`` of a ghost's box in bird's eye view
(:func:`near_boxes`) reads a LiDAR that lies to it; :func:`lying_modalities` names the sensors that lie somewhere
in a sample (a per-sample gate's label). Pure functions of tensors and metas.
"""
from typing import Mapping, Sequence, Set

import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from torch import Tensor

from ...datasets.pipelines.corruption import CORRUPTION_KEY
from ..utils.box_frame import box_frame_offsets

#: Metres around a ghost's box (BEV) within which a query's reference point is near it: the devkit's match distance.
GHOST_MARGIN_M = 2.0
#: The ``LiDARInstance3DBoxes`` columns of a ghost box that the targets use: ``x, y, z, x_size, y_size, z_size, yaw``.
BOX_COLUMNS = 7


def _record(img_meta: Mapping) -> Mapping:
    return img_meta.get(CORRUPTION_KEY) or {}


def ghost_boxes(img_meta: Mapping, device: torch.device) -> Tensor:
    """The sample's ghost boxes in the model's frame (after the pipeline's 3D augmentation).

    Args:
        img_meta (Mapping): ``corruption['ghost_boxes']`` and, where the flow moved the scene, the keys of
            ``AUGMENTATION_META_KEYS`` (``datasets/pipelines/corruption.py``).
        device (torch.device): of the result.

    Returns:
        Tensor: ``[G, 7]`` float32 LiDAR boxes (bottom centre, yaw); ``G = 0`` without ghosts.

    Raises:
        KeyError: ``transformation_3d_flow`` names a step whose parameter is not in the meta.
        ValueError: an unknown step.
    """
    rows = _record(img_meta).get('ghost_boxes') or []
    boxes = LiDARInstance3DBoxes(torch.tensor([list(row)[:BOX_COLUMNS] for row in rows],
                                              dtype=torch.float32).reshape(-1, BOX_COLUMNS), box_dim=BOX_COLUMNS)
    if len(rows):
        for step in img_meta.get('transformation_3d_flow', ()):
            _replay(boxes, step, img_meta)
    return boxes.tensor.to(device)


def _replay(boxes: LiDARInstance3DBoxes, step: str, img_meta: Mapping) -> None:
    """Apply one step of ``transformation_3d_flow`` to ``boxes`` in place."""
    parameter = dict(R='pcd_rotation', S='pcd_scale_factor', T='pcd_trans').get(step)
    if parameter is not None and parameter not in img_meta:
        raise KeyError(f"img_meta's transformation_3d_flow holds {step!r} but not {parameter!r}: add it to "
                       f"Collect3D's meta_keys (the ghost boxes are moved as the scene was)")
    if step == 'R':
        boxes.rotate(torch.as_tensor(img_meta['pcd_rotation'], dtype=torch.float32))
    elif step == 'S':
        boxes.scale(float(img_meta['pcd_scale_factor']))
    elif step == 'T':
        boxes.translate(torch.as_tensor(img_meta['pcd_trans'], dtype=torch.float32))
    elif step in ('HF', 'VF'):
        boxes.flip('horizontal' if step == 'HF' else 'vertical')
    else:
        raise ValueError(f"unknown transformation_3d_flow step {step!r}; expected 'R', 'S', 'T', 'HF' or 'VF'")


def yawed_views(img_meta: Mapping) -> Sequence[int]:
    """The camera views whose calibration the corruption yawed (``corruption['yawed_views']``; none if absent)."""
    return list(_record(img_meta).get('yawed_views') or ())


def lidar_misaligned(img_meta: Mapping) -> bool:
    """Whether the corruption moved the whole point cloud against the cameras (``corruption['misaligned']``)."""
    return bool(_record(img_meta).get('misaligned', False))


def lying_modalities(img_meta: Mapping) -> Set[str]:
    """The modalities whose evidence the corruption falsified somewhere in the sample: ``'points'`` with ghosts or
    a misaligned point cloud, ``'image'`` with yawed views (the names of ``ModalMask3D``'s ``mask_modal``)."""
    record = _record(img_meta)
    lying = {'points'} if record.get('ghost_boxes') or lidar_misaligned(img_meta) else set()
    return lying | ({'image'} if yawed_views(img_meta) else set())


def near_boxes(xy: Tensor, boxes: Tensor, margin: float = GHOST_MARGIN_M) -> Tensor:
    """Which points lie within ``margin`` of any box in bird's eye view (inside the box grown by ``margin``).

    Args:
        xy (Tensor): ``[P, >=2]`` points (``x, y`` first) in the LiDAR frame.
        boxes (Tensor): ``[G, >=7]`` LiDAR boxes (``x, y, z, x_size, y_size, z_size, yaw``).
        margin (float): metres added to each half size.

    Returns:
        Tensor: ``[P]`` bool.
    """
    if boxes.dim() != 2 or boxes.shape[1] < BOX_COLUMNS:
        raise ValueError(f'boxes must be [G, >=7] (x, y, z, x_size, y_size, z_size, yaw), got {tuple(boxes.shape)}')
    along, across, _ = box_frame_offsets(xy[:, :2], boxes).unbind(-1)  # [P, G] each
    near = (along.abs() <= boxes[:, 3] / 2 + margin) & (across.abs() <= boxes[:, 4] / 2 + margin)
    return near.any(dim=1)
