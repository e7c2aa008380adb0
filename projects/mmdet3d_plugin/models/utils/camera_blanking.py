"""Blank and black camera views: which views a camera-free frame has, and what a dropped camera feeds the model.

* :func:`blank_camera_views`: images ``[bs, N, C, H, W]`` -> ``[bs, N]`` bool,
  the views whose pixels (inside ``img_shape``) are all equal (a black frame).
* :func:`black_camera_images`: images ``[bs, N, C, H, W]`` -> the same shape
  with every pixel inside ``img_shape`` at ``-mean / std`` and the padding 0
  (``ModalMask3D``'s image drop, the ``camera_drop`` corruption).
* :func:`replace_sample_views`: per-view maps ``[bs * N, ...]`` with the views
  of some samples replaced by ``[k * N, ...]``.
* :func:`with_dropped_images`: copies of img_metas marking samples' images dropped.
* :class:`FusedBlankViews`: what ``CmtDetector`` hands ``CmtHead`` in training
  with ``fused_image_drop_prob``: the drawn samples and their black views'
  features ``[k * N, C, h, w]``.
"""
from typing import List, Mapping, NamedTuple, Sequence, Tuple

import torch
from torch import Tensor

from ...utils.host_data import host_to_device
from ..aqr.aux_loss import DROPPED_MODALITIES_KEY
from .camera_geometry import image_sizes_from_metas


class FusedBlankViews(NamedTuple):
    """What ``CmtHead`` needs in training to black out the fused pass's cameras (``fused_image_drop_prob``).

    Attributes:
        samples (tuple[bool, ...]): per sample, whether its fused pass sees black views.
        img_feat (Tensor): ``[k * N, C, h, w]`` camera features of the black
            views of the ``k`` drawn samples, in batch order (from the same
            image-backbone batch as the real views).
    """

    samples: Tuple[bool, ...]
    img_feat: Tensor


def _views_and_inside(img: Tensor, img_metas: Sequence[Mapping]) -> Tuple[Tensor, Tensor]:
    """``img`` as ``[bs, N, C, H, W]`` and its ``[bs, N, H, W]`` bools: the pixels inside ``img_shape`` (not padding).

    ``img_shape`` is ``(h, w, ...)`` or one such tuple per view, read as
    :func:`image_sizes_from_metas` reads it.
    """
    views = img.reshape(len(img_metas), -1, *img.shape[-3:])
    img_hw, _ = image_sizes_from_metas(img_metas, views.size(1), img.device)
    height, width = views.shape[-2:]
    inside_rows = torch.arange(height, device=img.device) < img_hw[..., 0, None]  # [bs, N, H]
    inside_cols = torch.arange(width, device=img.device) < img_hw[..., 1, None]  # [bs, N, W]
    return views, inside_rows[..., :, None] & inside_cols[..., None, :]


def blank_camera_views(img: Tensor, img_metas: Sequence[Mapping]) -> Tensor:
    """Per sample and view, whether the image is blank: all its pixels (inside ``img_shape``, before padding) equal.

    Args:
        img (Tensor): ``[bs, N, C, H, W]`` (or ``[bs * N, C, H, W]``) camera images.
        img_metas (Sequence[Mapping]): per sample; ``img_shape`` ``(h, w, ...)``
            or one such tuple per view (the area of the view that is not padding).

    Returns:
        Tensor: ``[bs, N]`` bool, on ``img``'s device.
    """
    views, inside = _views_and_inside(img, img_metas)
    same_as_corner = views == views[..., :1, :1]  # the top-left pixel is always inside img_shape
    return (same_as_corner | ~inside[:, :, None]).flatten(2).all(-1)


def black_camera_images(img: Tensor, img_metas: Sequence[Mapping]) -> Tensor:
    """The input images of black camera views, as the pipeline makes them: what a dropped camera feeds the model.

    ``ModalMask3D``'s image drop and the ``camera_drop`` corruption zero the
    pixels before ``NormalizeMultiviewImage`` and ``PadMultiViewImage``: a
    pixel inside ``img_shape`` becomes ``-mean / std`` of its channel, the
    padding stays 0.

    Args:
        img (Tensor): ``[bs, N, C, H, W]`` normalised, padded images (their
            shape, dtype and device are taken).
        img_metas (Sequence[Mapping]): per sample ``img_norm_cfg``
            (``mean`` and ``std`` per channel, as ``NormalizeMultiviewImage``
            records them) and ``img_shape``.

    Returns:
        Tensor: ``[bs, N, C, H, W]``.
    """
    black = []
    for index, meta in enumerate(img_metas):
        if 'img_norm_cfg' not in meta:
            raise KeyError(f"img_metas[{index}] has no 'img_norm_cfg': black camera views are -mean / std of the "
                           f"image normalisation; add 'img_norm_cfg' to Collect3D's meta_keys")
        norm = meta['img_norm_cfg']
        black.append([-float(mean) / float(std) for mean, std in zip(norm['mean'], norm['std'])])
    black = host_to_device(black, img.device, img.dtype)  # [bs, C]
    if black.size(1) != img.size(-3):
        raise ValueError(f'img_norm_cfg has {black.size(1)} channels but the images have {img.size(-3)}')
    _, inside = _views_and_inside(img, img_metas)
    return torch.where(inside[:, :, None], black[:, None, :, None, None], img.new_zeros(()))


def replace_sample_views(img_feat: Tensor, samples: Sequence[bool], replacement: Tensor) -> Tensor:
    """``img_feat`` with the camera views of some samples replaced.

    Args:
        img_feat (Tensor): ``[bs * N, ...]`` per-view maps (features ``[bs * N, C, h, w]``, depths).
        samples (Sequence[bool]): ``bs`` flags (host data), the samples to replace.
        replacement (Tensor): ``[k * N, ...]``, the views of the ``k``
            samples flagged in ``samples``, in batch order.

    Returns:
        Tensor: ``[bs * N, ...]`` (a new tensor; gradients reach both inputs).
    """
    batch_size, replaced = len(samples), [index for index, flag in enumerate(samples) if flag]
    if img_feat.size(0) % batch_size or replacement.shape != (len(replaced) * (img_feat.size(0) // batch_size),
                                                              *img_feat.shape[1:]):
        raise ValueError(f'cannot replace the views of {len(replaced)} of {batch_size} samples in '
                         f'{tuple(img_feat.shape)} by {tuple(replacement.shape)}')
    views = img_feat.unflatten(0, (batch_size, -1)).clone()
    views[host_to_device(replaced, img_feat.device, torch.long)] = replacement.unflatten(0, (-1, views.size(1)))
    return views.flatten(0, 1)


def with_dropped_images(img_metas: Sequence[dict], samples: Sequence[bool]) -> List[dict]:
    """Copies of ``img_metas`` in which the ``samples`` have ``'image'`` among their ``dropped_modalities``."""
    metas = []
    for meta, dropped in zip(img_metas, samples):
        if dropped and 'image' not in meta.get(DROPPED_MODALITIES_KEY, ()):
            meta = dict(meta, **{DROPPED_MODALITIES_KEY: list(meta.get(DROPPED_MODALITIES_KEY, ())) + ['image']})
        metas.append(meta)
    return metas
