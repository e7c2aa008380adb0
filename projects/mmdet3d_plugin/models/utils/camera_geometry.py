"""Pure camera geometry used by CMT's position encodings: lidar2img stacks and query projection."""
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ...utils.host_data import host_to_device


def _lidar2img_matrices(img_metas: Sequence[dict]) -> np.ndarray:
    """``[bs, N, 4, 4]`` float32 ``lidar2img`` matrices of a batch, read and checked on the host."""
    matrices: List[np.ndarray] = []
    for index, meta in enumerate(img_metas):
        if 'lidar2img' not in meta:
            raise KeyError(f"img_metas[{index}] has no 'lidar2img'; camera position encodings need the "
                           f"per-view lidar-to-image matrices (keep 'lidar2img' in Collect3D meta_keys)")
        matrix = np.asarray(meta['lidar2img'], dtype=np.float64)
        if matrix.ndim != 3 or matrix.shape[1:] != (4, 4):
            raise ValueError(f"img_metas[{index}]['lidar2img'] must be N 4x4 matrices, got shape {matrix.shape}")
        matrices.append(matrix)
    num_views = {m.shape[0] for m in matrices}
    if len(num_views) != 1:
        raise ValueError(f'every sample must have the same number of camera views, got {sorted(num_views)}')
    return np.stack(matrices).astype(np.float32)


def stack_lidar2img(img_metas: Sequence[dict], device: torch.device = None) -> torch.Tensor:
    """Read the per-view ``lidar2img`` matrices of a batch.

    Args:
        img_metas (Sequence[dict]): one dict per sample, each with
            ``'lidar2img'``: a list of ``N`` ``4x4`` arrays (or an ``[N, 4, 4]``
            array), the same ``N`` for every sample.
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[bs, N, 4, 4]`` float32.
    """
    return host_to_device(_lidar2img_matrices(img_metas), device)


def stack_img2lidar(img_metas: Sequence[dict], device: torch.device = None) -> torch.Tensor:
    """The inverses of :func:`stack_lidar2img`'s matrices, ``[bs, N, 4, 4]`` float32.

    Inverted on the host (CPU tensors), in float64, from the float32 matrices
    the device gets: ``torch.linalg.inv`` on CUDA checks its result on the
    host, a synchronisation per call.
    """
    return host_to_device(invert_lidar2img(torch.from_numpy(_lidar2img_matrices(img_metas))), device)


def invert_lidar2img(lidar2img: torch.Tensor) -> torch.Tensor:
    """``img2lidar`` of ``[..., 4, 4]`` matrices, inverted in float64 and returned in their dtype (call it on host
    data: on CUDA the inversion waits for the device)."""
    return torch.linalg.inv(lidar2img.double()).to(lidar2img.dtype)


def pad_shape_hw(img_metas: Sequence[dict]) -> Tuple[float, float]:
    """Padded image size ``(pad_h, pad_w)`` of the first view of the first sample.

    ``PadMultiViewImage`` pads every view of a batch to the same size, so one
    value describes the whole batch.
    """
    if not img_metas or 'pad_shape' not in img_metas[0]:
        raise KeyError("img_metas need 'pad_shape' (one (h, w, c) per view) for camera position encodings")
    pad_shape = img_metas[0]['pad_shape']
    first = pad_shape[0] if isinstance(pad_shape[0], (tuple, list, np.ndarray)) else pad_shape
    return float(first[0]), float(first[1])


def project_to_views(points: torch.Tensor, lidar2img: torch.Tensor,
                     pad_hw: Tuple[float, float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Project LiDAR points into every camera view.

    The perspective division uses the *detached* depth (``+-1e-6`` away from
    zero, with its sign), as upstream CMT does, so gradients reach the points
    only through the numerator.

    Args:
        points (Tensor): ``[bs, Q, 3]`` metric LiDAR coordinates.
        lidar2img (Tensor): ``[bs, N, 4, 4]``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.

    Returns:
        tuple[Tensor, Tensor]:
            - ``image_points`` ``[bs, N, Q, 3]``: ``(u, v, 1)`` in pixels (the
              third value is ``z / detached z``, 1 up to ``1e-6``, carrying
              the depth gradient as upstream does).
            - ``visible`` ``[bs, N, Q]`` bool: in front of the camera and
              inside the padded image.
    """
    homogeneous = torch.cat((points, torch.ones_like(points[..., :1])), dim=-1)
    projected = torch.einsum('bqd,bncd->bnqc', homogeneous, lidar2img)
    depth = projected[..., 2:3].detach()
    in_front = depth > 0
    denominator = depth + torch.where(in_front, 1e-6, -1e-6)
    image_points = projected[..., :3] / denominator
    u, v = image_points[..., 0], image_points[..., 1]
    pad_h, pad_w = pad_hw
    visible = in_front.squeeze(-1) & (u >= 0) & (u < pad_w) & (v >= 0) & (v < pad_h)
    return image_points, visible


def lift_pixels(image_points: torch.Tensor, depths: torch.Tensor, img2lidar: torch.Tensor) -> torch.Tensor:
    """Back-project pixels to LiDAR points at several depths.

    ``(u, v, 1)`` becomes ``(u * d, v * d, d, 1)`` for every depth ``d``, then
    is multiplied by ``img2lidar``.

    Args:
        image_points (Tensor): ``[bs, N, Q, 3]`` ``(u, v, 1)`` from
            :func:`project_to_views`.
        depths (Tensor): ``[D]`` depths in metres.
        img2lidar (Tensor): ``[bs, N, 4, 4]``.

    Returns:
        Tensor: ``[bs, N, Q, D, 3]`` metric LiDAR coordinates.
    """
    scaled = image_points[..., None, :] * depths[:, None]
    homogeneous = torch.cat((scaled, torch.ones_like(scaled[..., :1])), dim=-1)
    return torch.einsum('bnqdo,bnco->bnqdc', homogeneous, img2lidar)[..., :3]
