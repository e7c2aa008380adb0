"""Per-query routing targets: which sensor still sees the object a query is matched to.

MoME's one label per *sample* (:mod:`.aux_loss`) can learn "which sensor is dead", never
"which sensor sees *this* object". Here every ground-truth object gets two truths, from the input itself:

* LiDAR: the object's box still holds at least ``min_points`` points;
* camera: the object's centre projects into a live camera view (in front of
  it, inside its image, the view not blacked out).

A query matched to an object by the detection loss's Hungarian assignment
takes that object's truths as targets of its ``lidar`` / ``camera`` weights
(binary cross-entropy). Opt-in (``AQRWeightGenerator``): an unmatched query,
where false positives are born, takes the input's truth at its reference
point (:func:`unmatched_query_targets`), and the truths know where a sensor
lies (``lie_targets``, :mod:`.sensor_lies`): a yawed view is no live view, a
misaligned point cloud and a ghost near the query no LiDAR truth.

The *oracle* routing (:func:`oracle_routing_weights`) gives every query, at
test time, the weights the corrupted input's truth implies: LiDAR 1 where its
BEV window holds points (``oracle_objects``: points standing at least
``OBJECT_MIN_HEIGHT`` above the local ground, so that the ground around a
dropped object does not count), camera 1 where a live view sees its reference point.
Pure functions of tensors and metas, testable without a model.
"""
from typing import Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...attention.bias.window_cells import window_offsets, window_token_index
from ...datasets.pipelines.corruption import CORRUPTION_KEY
from ...utils.host_data import host_to_device
from ..utils.box_frame import box_frame_offsets
from ..utils.camera_geometry import pad_shape_hw, project_to_views
from .aux_loss import DROPPED_MODALITIES_KEY, dropped_modalities
from .projection import bev_cells
from .sensor_lies import ghost_boxes, lidar_misaligned, near_boxes, yawed_views

#: boxes per block in :func:`count_points_in_boxes` (bounds its ``[points, block]`` temporaries).
BOX_BLOCK = 16
#: BEV cells on a side of the neighbourhood whose lowest point is the local ground (:func:`lidar_occupancy`).
GROUND_WINDOW = 3
#: ``oracle_objects``: metres above the local ground from which a point is an object's, not the ground's.
OBJECT_MIN_HEIGHT = 0.3


def count_points_in_boxes(points: Tensor, boxes: Tensor) -> Tensor:
    """How many points each box holds.

    Args:
        points (Tensor): ``[P, >=3]`` LiDAR points (``x, y, z`` first).
        boxes (Tensor): ``[n, >=7]`` LiDAR boxes ``(x, y, z_bottom, x_size,
            y_size, z_size, yaw)`` (mmdet3d's ``LiDARInstance3DBoxes.tensor``;
            yaw counter-clockwise from ``+x``, ``x_size`` along the heading).

    Returns:
        Tensor: ``[n]`` long, the points inside each box (surface included).
    """
    if points.dim() != 2 or points.shape[1] < 3:
        raise ValueError(f'points must be [P, >=3], got {tuple(points.shape)}')
    if boxes.dim() != 2 or boxes.shape[1] < 7:
        raise ValueError(f'boxes must be [n, >=7] (x, y, z, x_size, y_size, z_size, yaw), got {tuple(boxes.shape)}')
    counts = []
    for block in boxes.split(BOX_BLOCK):
        along, across, up = box_frame_offsets(points, block).unbind(-1)  # [P, b] each
        inside = ((along.abs() <= block[:, 3] / 2) & (across.abs() <= block[:, 4] / 2) & (up >= 0)
                  & (up <= block[:, 5]))
        counts.append(inside.sum(dim=0))
    return torch.cat(counts) if counts else boxes.new_zeros(0, dtype=torch.long)


def live_camera_views(img_meta: Mapping, num_views: int, device: torch.device, lies: bool = False) -> Tensor:
    """Which camera views of a sample show the scene.

    A view is dead when ``ModalMask3D`` dropped the images
    (``'image'`` in ``img_meta['dropped_modalities']``) or when
    ``SensorCorruption`` blacked it out (``img_meta['corruption']['views']``);
    with ``lies``, also when its calibration was yawed (``yawed_views``).

    Returns:
        Tensor: ``[num_views]`` bool.
    """
    live = [True] * num_views
    if 'image' in img_meta.get(DROPPED_MODALITIES_KEY, ()):
        live = [False] * num_views
    lying = yawed_views(img_meta) if lies else ()
    for view in (*(img_meta.get(CORRUPTION_KEY) or {}).get('views', ()), *lying):
        if not 0 <= view < num_views:
            raise ValueError(f"img_meta['{CORRUPTION_KEY}']['views'] names view {view}, the sample has {num_views}")
        live[view] = False
    return host_to_device(live, device, torch.bool)


def camera_visible_objects(centres: Tensor, lidar2img: Tensor, img_meta: Mapping, lies: bool = False) -> Tensor:
    """Whether each object's centre projects into a live camera view.

    Args:
        centres (Tensor): ``[n, 3]`` object (gravity) centres in the LiDAR frame.
        lidar2img (Tensor): ``[N, 4, 4]`` the sample's projections.
        img_meta (Mapping): ``pad_shape`` (the image extent the camera tokens
            cover), ``dropped_modalities`` / ``corruption`` (dead views).
        lies (bool): a yawed view is no live view (:func:`live_camera_views`).

    Returns:
        Tensor: ``[n]`` bool.
    """
    if lidar2img.dim() != 3 or lidar2img.shape[1:] != (4, 4):
        raise ValueError(f'lidar2img must be [N, 4, 4], got {tuple(lidar2img.shape)}')
    live = live_camera_views(img_meta, lidar2img.shape[0], centres.device, lies)
    _, in_view = project_to_views(centres[None].to(lidar2img.dtype), lidar2img[None], pad_shape_hw([img_meta]))
    return (in_view[0] & live[:, None]).any(dim=0)


def matched_object_targets(assignments: Sequence[Tensor], lidar_visible: Tensor,
                           camera_visible: Tensor) -> Sequence[Tensor]:
    """Routing targets of one sample's queries from their matches.

    Args:
        assignments (Sequence[Tensor]): one ``[Q]`` long tensor per matching
            (e.g. per task): the matched object's index in the sample, ``-1``
            where the query is unmatched.
        lidar_visible (Tensor): ``[n]`` bool per object.
        camera_visible (Tensor): ``[n]`` bool per object.

    Returns:
        tuple[Tensor, Tensor]: ``targets [Q, 2]`` float (LiDAR, camera; the
        mean over the matchings that matched the query) and ``matched [Q]`` bool.
    """
    if not assignments:
        raise ValueError('matched_object_targets needs at least one assignment')
    truths = torch.stack([lidar_visible, camera_visible], dim=-1).float()  # [n, 2]
    total = truths.new_zeros(assignments[0].numel(), 2)
    count = truths.new_zeros(assignments[0].numel())
    for assigned in assignments:
        matched = assigned >= 0
        total[matched] += truths[assigned[matched]]
        count += matched.float()
    matched = count > 0
    return total / count.clamp(min=1.0)[:, None], matched


def query_target_loss(lidar_weights: Tensor, camera_weights: Tensor, targets: Tensor, matched: Tensor,
                      eps: float = 1e-6) -> Tensor:
    """Binary cross-entropy of the routing weights of matched queries against their targets.

    Args:
        lidar_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.
        camera_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.
        targets (Tensor): ``[bs, Q, 2]`` (LiDAR, camera) in ``[0, 1]``.
        matched (Tensor): ``[bs, Q]`` bool; only these queries count.
        eps (float): the weights are clamped to ``[eps, 1 - eps]``.

    Returns:
        Tensor: scalar float32 mean over matched queries and both weights; 0
        (still attached to the graph) when no query is matched.
    """
    weights = torch.stack([lidar_weights, camera_weights], dim=-1).float().clamp(eps, 1.0 - eps)
    if targets.shape != weights.shape or matched.shape != weights.shape[:2]:
        raise ValueError(f'targets {tuple(targets.shape)} / matched {tuple(matched.shape)} do not match the weights '
                         f'{tuple(weights.shape)}')
    bce = -(targets * weights.log() + (1 - targets) * torch.log1p(-weights))  # [bs, Q, 2]
    mask = matched.to(bce.dtype)[..., None]
    return (bce * mask).sum() / (2 * mask.sum()).clamp(min=1.0)


def lidar_occupancy(points: Tensor, pc_range: Sequence[float], bev_shape: Sequence[int],
                    min_height: Optional[float] = None) -> Tensor:
    """Which BEV cells hold at least one LiDAR point (with ``min_height``: one that is not ground).

    Args:
        points (Tensor): ``[P, >=3]`` one sample's points (LiDAR frame).
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        bev_shape (Sequence[int]): ``(H, W)``: rows along y, columns along x
            (the BEV memory's layout).
        min_height (float, optional): count only the points at least this many
            metres above the local ground: the lowest point within
            ``GROUND_WINDOW`` x ``GROUND_WINDOW`` cells around their own (None:
            every point counts).

    Returns:
        Tensor: ``[H, W]`` bool.
    """
    low = host_to_device([float(v) for v in pc_range[:3]], points.device, torch.float32)
    high = host_to_device([float(v) for v in pc_range[3:]], points.device, torch.float32)
    xyz = points[:, :3].float()
    xyz = xyz[((xyz >= low) & (xyz < high)).all(dim=1)]
    _, cells = bev_cells(((xyz - low) / (high - low))[None], bev_shape)
    cells = cells[0]
    height, width = (int(size) for size in bev_shape)
    if min_height is not None:
        lowest = xyz.new_full((height * width, ), float('inf')).scatter_reduce(0, cells, xyz[:, 2], 'amin')
        ground = -F.max_pool2d(-lowest.view(1, 1, height, width), GROUND_WINDOW, 1, GROUND_WINDOW // 2).flatten()
        cells = cells[xyz[:, 2] - ground[cells] >= min_height]
    occupancy = torch.zeros(height * width, dtype=torch.bool, device=points.device)
    occupancy[cells] = True
    return occupancy.view(height, width)


def oracle_routing_weights(projection_info: Mapping[str, Tensor], occupancy: Tensor, live_views: Tensor,
                           lidar_window: int) -> Sequence[Tensor]:
    """The routing weights the input's truth gives each query (the oracle of the robustness study).

    LiDAR: 1 where the query's LiDAR window (``lidar_window`` cells around its
    BEV cell) holds a point; camera: 1 where its reference point projects into
    a live view.

    Args:
        projection_info (Mapping[str, Tensor]): ``pts_bev [bs, Q, 2]``,
            ``pts_pers_idx [bs, Q, 3]``, ``visible [bs, Q]`` (``project_reference_points``).
        occupancy (Tensor): ``[bs, H, W]`` bool from :func:`lidar_occupancy`.
        live_views (Tensor): ``[bs, N]`` bool from :func:`live_camera_views`.
        lidar_window (int): odd window side in BEV cells.

    Returns:
        tuple[Tensor, Tensor]: ``lidar [bs, Q]`` and ``camera [bs, Q]``, 0. or 1.
    """
    bs, height, width = occupancy.shape
    index, valid = window_token_index(projection_info['pts_bev'], (height, width),
                                      window_offsets(lidar_window, occupancy.device))
    occupied = occupancy.flatten(1).gather(1, index.flatten(1)).view_as(index) & valid
    view = projection_info['pts_pers_idx'][..., 0].clamp(min=0)
    camera = projection_info['visible'] & live_views.gather(1, view)
    return occupied.any(dim=-1).float(), camera.float()


def lidar_untrusted(reference_xyz: Tensor, img_meta: Mapping, lies: bool) -> Tensor:
    """Where a sample's LiDAR gives a query no truth: dropped, and with ``lies`` misaligned or near a ghost.

    Args:
        reference_xyz (Tensor): ``[Q, >=2]`` the queries' reference points (LiDAR frame, metres).
        img_meta (Mapping): ``dropped_modalities`` / ``corruption`` (:mod:`.sensor_lies`).
        lies (bool): count the lies: a misaligned point cloud (every query), a ghost within
            ``GHOST_MARGIN_M`` of the reference point (BEV).

    Returns:
        Tensor: ``[Q]`` bool.
    """
    if 'points' in dropped_modalities(img_meta) or (lies and lidar_misaligned(img_meta)):
        return torch.ones(reference_xyz.shape[0], dtype=torch.bool, device=reference_xyz.device)
    if not lies:
        return torch.zeros(reference_xyz.shape[0], dtype=torch.bool, device=reference_xyz.device)
    return near_boxes(reference_xyz, ghost_boxes(img_meta, reference_xyz.device))


def unmatched_query_targets(oracle_lidar: Tensor, oracle_camera: Tensor, untrusted_lidar: Tensor) -> Tensor:
    """Routing targets of every query from the input's truth at its reference point (used for unmatched ones).

    LiDAR 1 where the query's LiDAR window holds a point and the LiDAR is not
    untrusted there (:func:`lidar_untrusted`); camera 1 where its reference
    point projects into a live view (:func:`oracle_routing_weights`, whose
    live views leave out the yawed ones when lies count).

    Args:
        oracle_lidar (Tensor): ``[bs, Q]`` 0. or 1. from :func:`oracle_routing_weights`.
        oracle_camera (Tensor): ``[bs, Q]`` 0. or 1.
        untrusted_lidar (Tensor): ``[bs, Q]`` bool.

    Returns:
        Tensor: ``[bs, Q, 2]`` float (LiDAR, camera), 0. or 1.
    """
    return torch.stack([oracle_lidar * ~untrusted_lidar, oracle_camera], dim=-1)
