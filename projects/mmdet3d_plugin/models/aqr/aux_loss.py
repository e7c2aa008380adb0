"""Optional auxiliary routing loss from modality-drop augmentation (``ModalMask3D``).

When the pipeline zeroed a sample's LiDAR points or camera images, the weight
of that modality should be 0 for every query of the sample: the loss is the
binary cross-entropy ``-log(1 - w)`` of the dropped modality's weights,
averaged over queries and over the dropped ``(sample, modality)`` pairs.
Samples with nothing dropped carry no target. The flags are read from
``img_meta[DROPPED_MODALITIES_KEY]``, a collection of ``ModalMask3D``'s
``mask_modal`` names (``'points'``, ``'image'``); a missing key means nothing
was dropped. A whole-sensor ``SensorCorruption`` (``lidar_drop``,
``camera_drop`` in ``img_meta['corruption']``, e.g. from the training
pipeline's ``RandomSensorCorruption``) drops its modality just the same.
With ``lies``, a modality that lies somewhere in the sample (ghosts or a
misaligned cloud: LiDAR; yawed views: camera; ``sensor_lies.lying_modalities``)
is labelled as lost too: MoME's per-sample label for sensors that lie.
"""
from typing import Mapping, Sequence, Set, Tuple

import torch
from torch import Tensor

from ...datasets.pipelines.corruption import CORRUPTION_KEY
from ...datasets.pipelines.modal_mask_3d import DROPPED_MODALITIES_KEY, MODALITIES as MODALITY_NAMES
from ...utils.host_data import host_to_device
from .sensor_lies import lying_modalities

#: The ``SensorCorruption`` modes that remove a whole modality, and the modality each removes.
DROPPING_CORRUPTIONS = {'lidar_drop': 'points', 'camera_drop': 'image'}


def dropped_modalities(meta: Mapping, index: int = 0) -> Set[str]:
    """The modalities (``'points'``, ``'image'``) sample ``meta`` lost: to ``ModalMask3D``
    (``meta[DROPPED_MODALITIES_KEY]``) or to a whole-sensor corruption (``meta['corruption']``).

    Args:
        meta (Mapping): the sample's img_meta.
        index (int): its index in the batch, for the error message.

    Raises:
        ValueError: ``meta[DROPPED_MODALITIES_KEY]`` names an unknown modality.
    """
    dropped = set(meta.get(DROPPED_MODALITIES_KEY, ()))
    unknown = dropped - set(MODALITY_NAMES)
    if unknown:
        raise ValueError(f"img_metas[{index}]['{DROPPED_MODALITIES_KEY}'] has unknown modalities {sorted(unknown)}; "
                         f'expected a subset of {MODALITY_NAMES}')
    corruption = meta.get(CORRUPTION_KEY) or {}
    if corruption.get('mode') in DROPPING_CORRUPTIONS:
        dropped.add(DROPPING_CORRUPTIONS[corruption['mode']])
    return dropped


def modality_drop_flags(img_metas: Sequence[Mapping], device: torch.device,
                        lies: bool = False) -> Tuple[Tensor, Tensor]:
    """Which samples had their LiDAR / camera input dropped (by ``ModalMask3D`` or a whole-sensor corruption).

    Args:
        img_metas (Sequence[Mapping]): one dict per sample.
        device (torch.device): device of the result.
        lies (bool): a modality that lies somewhere in the sample counts as dropped.

    Returns:
        tuple[Tensor, Tensor]: ``lidar_dropped [bs]`` and ``camera_dropped [bs]`` bool.
    """
    dropped = [dropped_modalities(meta, i) | (lying_modalities(meta) if lies else set())
               for i, meta in enumerate(img_metas)]
    return (host_to_device(['points' in lost for lost in dropped], device, torch.bool),
            host_to_device(['image' in lost for lost in dropped], device, torch.bool))


def routing_loss(lidar_weights: Tensor, camera_weights: Tensor, lidar_dropped: Tensor, camera_dropped: Tensor,
                 eps: float = 1e-6) -> Tensor:
    """BCE towards 0 of the weights of dropped modalities.

    Args:
        lidar_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.
        camera_weights (Tensor): ``[bs, Q]`` in ``[0, 1]``.
        lidar_dropped (Tensor): ``[bs]`` bool.
        camera_dropped (Tensor): ``[bs]`` bool.
        eps (float): ``w`` is clamped to ``[0, 1 - eps]`` before the log.

    Returns:
        Tensor: scalar float32 loss; 0 (still attached to the graph) when nothing was dropped.
    """
    weights = torch.stack([lidar_weights, camera_weights], dim=-1).float()  # [bs, Q, 2]
    dropped = torch.stack([lidar_dropped, camera_dropped], dim=-1).to(weights.dtype)  # [bs, 2]
    if dropped.shape[0] != weights.shape[0]:
        raise ValueError(f'{dropped.shape[0]} drop flags for a batch of {weights.shape[0]}')
    bce = -torch.log1p(-weights.clamp(0.0, 1.0 - eps)).mean(dim=1)  # [bs, 2]
    return (bce * dropped).sum() / dropped.sum().clamp(min=1.0)
