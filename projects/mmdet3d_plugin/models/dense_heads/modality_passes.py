"""Per-modality decoding passes of :class:`CmtHead` (MEFormer / MoME stage 1: "cameras that see").

With ``modality_passes=('fused', 'lidar', 'camera')`` the head's one decoder
decodes the same queries (the 900 anchors and the batch's DN queries, with
the same position embeddings) three times per training step:

* ``fused``: against ``[BEV tokens ; camera tokens]``, as plain CMT;
* ``lidar``: against the BEV tokens only;
* ``camera``: against the camera tokens only.

The other modality's tokens are left out of the memory, not zeroed. With AQR,
the routing weights are computed once and each pass's cross-attention bias is
the fused bias restricted to the pass's keys (``key_range_bias.py``). Each
pass has its own Hungarian matching, DN loss and loss names: the fused pass
keeps CMT's (``loss_cls``, ``d0.loss_cls``, ``dn_loss_cls``, ...), the
others are prefixed with their name (``lidar.loss_cls``,
``camera.d0.dn_loss_bbox``, ...). Inference decodes the fused pass only.
The default ``('fused',)`` is plain CMT: same parameters, same outputs.

With ``pass_decoders='separate'`` each single-modality pass has its own
transformer and task heads (``separate_decoders.<pass>.*``, MoME's
per-modality experts) instead of sharing the fused pass's; the queries, their
position embeddings, the token embeddings and the routing stay shared. With
``lidar_free_pass='camera'`` inference decodes a sample whose point cloud is
empty (``lidar_free_samples``) with the camera pass instead of the fused one
(:func:`merge_sample_predictions`): a frame without LiDAR is a camera frame.
Symmetrically, ``camera_free_pass='lidar'`` decodes a sample whose every camera
image is blank (``camera_free_samples``: all pixels of the view equal, as a
black frame) with the LiDAR pass. A sample without either keeps the fused pass.

A single-modality pass learns nothing from a sample whose input for that
modality was dropped by ``ModalMask3D`` (``img_metas[i]['dropped_modalities']``):
such samples take no part in that pass's losses (no target, weight 0), and
``<pass>.num_samples`` logs how many samples each pass trained on (its
losses are 0 when none did). ``CmtHead``'s ``fused_image_drop_prob`` instead
blacks out a sample's cameras for the fused pass and the routing only
(:func:`black_camera_images`, :class:`FusedBlankViews`): the fused pass learns
to do without cameras while the camera pass keeps the sample's real images.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ...core.host_data import host_to_device
from ..aqr.aux_loss import DROPPED_MODALITIES_KEY
from ..aqr.projection import image_sizes_from_metas

#: key of the fused pass's first task dict holding ``{pass name: predictions}`` of the other passes
PASS_PREDICTIONS_KEY = 'modality_passes'
#: key of a pass's first task dict holding the per-sample bools of :func:`trained_samples`
TRAINED_SAMPLES_KEY = 'trained_samples'
#: key of the fused pass's first task dict holding :class:`FusedBlankViews`' ``samples`` in training
FUSED_BLACK_SAMPLES_KEY = 'fused_black_samples'
#: ``pass_decoders``: the single-modality passes use the fused pass's decoder, or each its own
PASS_DECODERS = ('shared', 'separate')
#: key of an img_meta holding the sample's LiDAR points ``[P, >=3]`` at test time (``CmtDetector.simple_test``
#: puts them there when the head's ``needs_points_in_metas``)
LIDAR_POINTS_KEY = 'lidar_points'
#: key of an img_meta holding ``[N]`` bools at test time, per camera view whether its image is blank
#: (``CmtDetector.simple_test`` puts them there when the head's ``needs_blank_views_in_metas``)
BLANK_VIEWS_KEY = 'blank_views'


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


@dataclass(frozen=True)
class ModalityPass:
    """One decoding pass.

    Attributes:
        name (str): ``'fused'``, ``'lidar'`` or ``'camera'``.
        uses_lidar (bool): the BEV tokens are keys of the pass.
        uses_camera (bool): the camera tokens are keys of the pass.
        input_name (str, optional): ``ModalMask3D``'s name of the one input
            the pass needs (``'points'`` / ``'image'``); None for the fused pass.
    """

    name: str
    uses_lidar: bool
    uses_camera: bool
    input_name: Optional[str]

    @property
    def loss_prefix(self) -> str:
        """Prefix of the pass's loss names: none for the fused pass, ``'<name>.'`` otherwise."""
        return '' if self.input_name is None else f'{self.name}.'

    def key_range(self, num_bev: int, num_camera: int) -> Tuple[int, int]:
        """``[start, end)`` of the pass's keys among the fused keys ``[num_bev BEV ; num_camera camera]``."""
        start = 0 if self.uses_lidar else num_bev
        end = num_bev + num_camera if self.uses_camera else num_bev
        return start, end


FUSED = ModalityPass('fused', uses_lidar=True, uses_camera=True, input_name=None)
MODALITY_PASSES: Dict[str, ModalityPass] = {
    'fused': FUSED,
    'lidar': ModalityPass('lidar', uses_lidar=True, uses_camera=False, input_name='points'),
    'camera': ModalityPass('camera', uses_lidar=False, uses_camera=True, input_name='image'),
}


def build_modality_passes(names: Sequence[str], head_name: str, uses_lidar: bool,
                          uses_camera: bool) -> Tuple[ModalityPass, ...]:
    """Check a head's ``modality_passes`` option and return the passes, fused first.

    Args:
        names (Sequence[str]): pass names, each of ``MODALITY_PASSES`` at most
            once, ``'fused'`` included (inference decodes it).
        head_name (str): the head's class name, for the error messages.
        uses_lidar (bool): whether the head has BEV tokens.
        uses_camera (bool): whether the head has camera tokens.

    Returns:
        tuple[ModalityPass, ...]: the fused pass, then the others in the given order.
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"{head_name}: modality_passes must be a list or tuple of pass names, e.g. "
                        f"('fused', 'lidar', 'camera'), got {names!r}")
    unknown = [name for name in names if name not in MODALITY_PASSES]
    if unknown:
        raise ValueError(f'{head_name}: unknown modality_passes {unknown}; the passes are {tuple(MODALITY_PASSES)}')
    if len(set(names)) != len(names):
        raise ValueError(f'{head_name}: modality_passes {tuple(names)} names a pass twice')
    if 'fused' not in names:
        raise ValueError(f"{head_name}: modality_passes {tuple(names)} lacks 'fused', the pass inference decodes")
    if len(names) > 1 and not (uses_lidar and uses_camera):
        tokens = 'BEV' if uses_lidar else 'camera'
        raise ValueError(f"{head_name} decodes {tokens} tokens only: its fused pass is its only pass, so "
                         f"modality_passes must be ('fused',), got {tuple(names)}")
    return (FUSED, ) + tuple(MODALITY_PASSES[name] for name in names if name != 'fused')


def check_pass_options(passes: Sequence[ModalityPass], pass_decoders: str, lidar_free_pass: Optional[str],
                       camera_free_pass: Optional[str], head_name: str) -> Tuple[Optional[ModalityPass], ...]:
    """Check ``pass_decoders`` and the fallback passes against the trained passes; return the fallback passes.

    Args:
        passes (Sequence[ModalityPass]): the head's passes, fused first.
        pass_decoders (str): one of :data:`PASS_DECODERS`.
        lidar_free_pass (str, optional): the pass that decodes samples
            without LiDAR points at inference (a trained pass without BEV keys).
        camera_free_pass (str, optional): the pass that decodes samples whose
            camera images are all blank (a trained pass without camera keys).
        head_name (str): the head's class name, for the error messages.

    Returns:
        tuple[ModalityPass | None, ModalityPass | None]: the passes named by
        ``lidar_free_pass`` and ``camera_free_pass``.
    """
    names = tuple(modality_pass.name for modality_pass in passes)
    if pass_decoders not in PASS_DECODERS:
        raise ValueError(f'{head_name}: pass_decoders must be one of {PASS_DECODERS}, got {pass_decoders!r}')
    if pass_decoders == 'separate' and len(passes) == 1:
        raise ValueError(f"{head_name}: pass_decoders='separate' gives each single-modality pass its own decoder, "
                         f"but modality_passes {names} has none; add e.g. 'camera'")
    chosen = []
    for option, name, lost, kept in (('lidar_free_pass', lidar_free_pass, 'lidar', 'camera'),
                                     ('camera_free_pass', camera_free_pass, 'camera', 'lidar')):
        if name is None:
            chosen.append(None)
            continue
        if name not in names[1:]:
            raise ValueError(f'{head_name}: {option}={name!r} must be one of the trained single-modality passes, '
                             f'modality_passes={names}')
        if name != kept:
            raise ValueError(f'{head_name}: {option}={name!r} decodes {lost} tokens; a sample without {lost} '
                             f'input needs a pass without them ({kept!r})')
        chosen.append(MODALITY_PASSES[name])
    return tuple(chosen)


def _samples_without(img_metas: Sequence[Mapping], key: str, option: str, what: str,
                     is_missing: Callable[[object], bool]) -> Tuple[bool, ...]:
    """Per sample, ``is_missing(img_metas[i][key])``; a ``KeyError`` naming ``option`` where ``key`` is absent."""
    missing = []
    for index, meta in enumerate(img_metas):
        if key not in meta:
            raise KeyError(f"img_metas[{index}] has no '{key}': {option} reads {what} there "
                           f"(CmtDetector.simple_test puts them when the head asks)")
        missing.append(bool(is_missing(meta[key])))
    return tuple(missing)


def lidar_free_samples(img_metas: Sequence[Mapping]) -> Tuple[bool, ...]:
    """Per sample, whether its point cloud (``img_metas[i][LIDAR_POINTS_KEY]``) is empty."""
    return _samples_without(img_metas, LIDAR_POINTS_KEY, 'lidar_free_pass', "the sample's LiDAR points",
                            lambda points: len(points) == 0)


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


def camera_free_samples(img_metas: Sequence[Mapping]) -> Tuple[bool, ...]:
    """Per sample, whether every camera image is blank (``img_metas[i][BLANK_VIEWS_KEY]``)."""
    return _samples_without(img_metas, BLANK_VIEWS_KEY, 'camera_free_pass', 'which camera images are blank',
                            lambda blank: torch.as_tensor(blank).all())


def merge_sample_predictions(fused: Sequence[List[dict]], other: Sequence[List[dict]],
                             take_other: Tensor) -> Tuple[List[dict], ...]:
    """The fused pass's predictions with some samples' taken from another pass.

    Args:
        fused (Sequence[list[dict]]): per task ``[dict]`` of ``[L, bs, Q, .]`` tensors.
        other (Sequence[list[dict]]): the other pass's, same layout.
        take_other (Tensor): ``[bs]`` bool, the samples to take from ``other``.

    Returns:
        tuple[list[dict]]: per task ``[dict]``: ``other``'s tensors where
        ``take_other``, the fused ones elsewhere; the fused dict's other entries.
    """
    merged = []
    for fused_task, other_task in zip(fused, other):
        task = dict(fused_task[0])
        for key, value in other_task[0].items():
            if isinstance(value, Tensor):
                take = take_other.view(1, -1, *([1] * (value.dim() - 2)))
                task[key] = torch.where(take, value, task[key])
        merged.append([task])
    return tuple(merged)


def trained_samples(modality_pass: ModalityPass, img_metas: Sequence[Mapping]) -> Tuple[bool, ...]:
    """Per sample, whether the pass's input was there (not dropped by ``ModalMask3D``)."""
    return tuple(modality_pass.input_name not in meta.get(DROPPED_MODALITIES_KEY, ()) for meta in img_metas)


def decoding_passes(preds_dicts: Sequence[List[dict]]) -> Iterator[Tuple[str, Sequence[List[dict]]]]:
    """``(loss prefix, predictions)`` of every pass a training forward decoded, the fused pass first."""
    yield FUSED.loss_prefix, preds_dicts
    for name, pass_preds in preds_dicts[0][0].get(PASS_PREDICTIONS_KEY, {}).items():
        yield MODALITY_PASSES[name].loss_prefix, pass_preds
