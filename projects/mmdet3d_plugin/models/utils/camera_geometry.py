"""The camera geometry of a batch, read from its ``img_metas`` once per forward, and the projections that use it.

:class:`CameraGeometry` is what ``CmtHead.forward`` builds from ``img_metas``
(``bs`` samples, ``N`` views) and hands to its parts (position embeddings,
router, camera window prior, image aux head): ``lidar2img`` and its inverse
``[bs, N, 4, 4]``, the per-view image and padded sizes ``[bs, N, 2]`` and the
batch's padded size. The matrices are read and inverted on the host and copied
to the device without blocking: ``torch.linalg.inv`` on CUDA synchronises.

:func:`project_to_views` and :func:`lift_pixels` map LiDAR points to pixels
and pixels back to LiDAR points at given depths.
"""
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

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


def _per_view_hw(shape_value, num_views: int, key: str) -> List[Tuple[float, float]]:
    """``img_shape``/``pad_shape`` of one sample -> ``num_views`` ``(h, w)`` pairs."""
    if len(shape_value) > 0 and isinstance(shape_value[0], (list, tuple, np.ndarray)):
        views = [tuple(v) for v in shape_value]
    else:
        views = [tuple(shape_value)] * num_views
    if len(views) != num_views:
        raise ValueError(f"img_metas['{key}'] has {len(views)} views, but lidar2img has {num_views}")
    return [(float(v[0]), float(v[1])) for v in views]


def image_sizes_from_metas(img_metas: Sequence[Mapping], num_views: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    """Read the un-padded and padded input image sizes of a batch.

    Args:
        img_metas (Sequence[Mapping]): one dict per sample with ``img_shape``
            and ``pad_shape``, each either one ``(h, w, c)`` for all views or a
            list of ``num_views`` of them. A missing ``img_shape`` falls back to
            ``pad_shape`` and vice versa.
        num_views (int): number of camera views N.
        device (torch.device): device of the returned tensors.

    Returns:
        tuple[Tensor, Tensor]: ``img_hw [bs, N, 2]`` and ``pad_hw [bs, N, 2]``
        float32 (height, width).
    """
    img_hw, pad_hw = [], []
    for i, meta in enumerate(img_metas):
        if 'img_shape' not in meta and 'pad_shape' not in meta:
            raise KeyError(f"img_metas[{i}] has neither 'img_shape' nor 'pad_shape'")
        img_hw.append(_per_view_hw(meta.get('img_shape', meta.get('pad_shape')), num_views, 'img_shape'))
        pad_hw.append(_per_view_hw(meta.get('pad_shape', meta.get('img_shape')), num_views, 'pad_shape'))
    return host_to_device(img_hw, device, torch.float32), host_to_device(pad_hw, device, torch.float32)


@dataclass(frozen=True, eq=False)
class CameraGeometry:
    """The camera geometry of a batch of ``bs`` samples with ``N`` views each, built once per forward.

    Attributes:
        lidar2img (Tensor): ``[bs, N, 4, 4]`` float32, LiDAR points to ``(u * d, v * d, d, 1)`` in the input image.
        img2lidar (Tensor): ``[bs, N, 4, 4]`` float32, the float64 inverses of
            the float32 ``lidar2img``, computed on the host.
        view_img_hw (Tensor): ``[bs, N, 2]`` float32 un-padded input image ``(h, w)`` of every view.
        view_pad_hw (Tensor): ``[bs, N, 2]`` float32 padded input image ``(h, w)`` of every view.
        pad_hw (tuple[float, float]): the batch's padded size, that of its
            first view (``PadMultiViewImage`` pads every view of a batch alike).
    """

    lidar2img: Tensor
    img2lidar: Tensor
    view_img_hw: Tensor
    view_pad_hw: Tensor
    pad_hw: Tuple[float, float]

    @classmethod
    def from_metas(cls, img_metas: Sequence[dict], device: Optional[torch.device] = None) -> 'CameraGeometry':
        """Read a batch's geometry.

        Args:
            img_metas (Sequence[dict]): one dict per sample with ``lidar2img``
                (``N`` ``4x4`` arrays, the same ``N`` for every sample),
                ``pad_shape`` and ``img_shape`` (one ``(h, w, c)`` or one per
                view; see :func:`image_sizes_from_metas`).
            device (torch.device, optional): device of the tensors (default CPU).

        Returns:
            CameraGeometry: the batch's geometry.
        """
        matrices = _lidar2img_matrices(img_metas)
        pad_hw = pad_shape_hw(img_metas)
        view_img_hw, view_pad_hw = image_sizes_from_metas(img_metas, matrices.shape[1], device)
        return cls(lidar2img=host_to_device(matrices, device),
                   img2lidar=host_to_device(invert_lidar2img(torch.from_numpy(matrices)), device),
                   view_img_hw=view_img_hw, view_pad_hw=view_pad_hw, pad_hw=pad_hw)

    @property
    def batch_size(self) -> int:
        return self.lidar2img.size(0)

    @property
    def num_views(self) -> int:
        return self.lidar2img.size(1)

    def select(self, samples: Sequence[int]) -> 'CameraGeometry':
        """The geometry of the batch's ``samples`` (host indices, repeats allowed), in that order."""
        index = host_to_device(list(samples), self.lidar2img.device, torch.long)
        return CameraGeometry(*(tensor.index_select(0, index) for tensor in (
            self.lidar2img, self.img2lidar, self.view_img_hw, self.view_pad_hw)), pad_hw=self.pad_hw)


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
