"""Denoising (DN) queries of CMT's training: noisy copies of the ground-truth boxes.

During training, CMT adds ``groups`` noisy copies of every ground-truth box
centre to the 900 learned anchor queries (DN-DETR, Li et al., CVPR 2022).
Each copy must reconstruct its box; copies moved farther than ``split`` (in
units of half the box size) must be classified as background. The decoder's
self-attention gets a mask so that the matching queries never see the DN
queries and each DN group sees only itself and the matching queries.

Layout of the query axis (``pad_size = groups * group_size``,
``group_size`` = the largest number of ground-truth boxes of a sample)::

    [ group 0 | group 1 | ... | group groups-1 | Q matching queries ]

Slot ``g * group_size + j`` of sample ``b`` holds the ``j``-th box of ``b``;
slots beyond a sample's box count keep the reference point ``(0, 0, 0)`` and
take no part in the loss. Everything here is a pure function of its inputs
(plus the global torch RNG for the noise).
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from .positional_encoding import normalize_points


@dataclass
class DenoisingQueries:
    """The DN part of one training batch.

    Attributes:
        pad_size (int): DN query slots per sample, ``groups * group_size``.
        groups (int): number of noisy copies of every box.
        reference_points (Tensor): ``[bs, pad_size, 3]`` normalised noisy
            centres (zeros in unused slots).
        self_attn_mask (Tensor): ``[pad_size + Q, pad_size + Q]`` bool, True =
            blocked, for the decoder's self-attention.
        batch_index (Tensor): ``[M]`` sample of each DN target
            (``M = groups * total boxes``, group-major).
        query_index (Tensor): ``[M]`` slot of each DN target in ``[0, pad_size)``.
        labels (Tensor): ``[M]`` classification targets: the box's global class,
            or ``num_classes`` (background) for copies noised beyond ``split``.
        gt_labels (Tensor): ``[M]`` the box's global class (never background).
        gt_bboxes (Tensor): ``[M, 9]`` the clean boxes ``(x, y, z, w, l, h, yaw,
            vx, vy)``, ``(x, y, z)`` the gravity centre.
    """

    pad_size: int
    groups: int
    reference_points: Tensor
    self_attn_mask: Tensor
    batch_index: Tensor
    query_index: Tensor
    labels: Tensor
    gt_labels: Tensor
    gt_bboxes: Tensor


def dn_self_attn_mask(groups: int, group_size: int, num_queries: int, device: torch.device = None) -> Tensor:
    """Self-attention mask of DN training, True = blocked.

    Matching queries (the last ``num_queries`` rows) cannot see any DN query;
    a DN query sees its own group and the matching queries, not other groups.

    Args:
        groups (int): number of DN groups.
        group_size (int): slots per group.
        num_queries (int): matching (anchor) queries Q.
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[groups * group_size + Q, groups * group_size + Q]`` bool.
    """
    pad_size = groups * group_size
    group_of = torch.arange(pad_size, device=device) // max(group_size, 1)
    mask = torch.zeros(pad_size + num_queries, pad_size + num_queries, dtype=torch.bool, device=device)
    mask[:pad_size, :pad_size] = group_of[:, None] != group_of[None, :]
    mask[pad_size:, :pad_size] = True
    return mask


def num_dn_groups(max_groups: int, num_queries: int, max_boxes: int) -> int:
    """Groups of a batch: ``min(max_groups, num_queries // max_boxes)``, 0 without boxes."""
    if max_boxes == 0:
        return 0
    return min(max_groups, num_queries // max_boxes)


@dataclass(frozen=True)
class DenoisingConfig:
    """CMT's DN training options (``CmtHead``'s ``denoising`` sub-config; upstream configs' flat keys).

    Attributes:
        scalar (int): maximum number of DN groups; 0 disables DN training.
        noise_scale (float): DN centre noise scale.
        noise_trans (float): DN noise offset in metres.
        split (float): DN noise norm beyond which a copy is background.
        dn_weight (float): weight of the DN losses.
    """

    scalar: int = 10
    noise_scale: float = 1.0
    noise_trans: float = 0.0
    split: float = 0.75
    dn_weight: float = 1.0

    def queries(self, gt_bboxes: Sequence[Tensor], gt_labels: Sequence[Tensor], num_queries: int,
                pc_range: Sequence[float], num_classes: int) -> Optional[DenoisingQueries]:
        """:func:`build_dn_queries` with these options (None when ``scalar`` is 0 or there is no DN query)."""
        if self.scalar <= 0:
            return None
        return build_dn_queries(gt_bboxes, gt_labels, num_queries, self.scalar, self.noise_scale, self.noise_trans,
                                self.split, pc_range, num_classes)


def build_dn_queries(gt_bboxes: Sequence[Tensor],
                     gt_labels: Sequence[Tensor],
                     num_queries: int,
                     max_groups: int,
                     noise_scale: float,
                     noise_trans: float,
                     split: float,
                     pc_range: Sequence[float],
                     num_classes: int) -> Optional[DenoisingQueries]:
    """Noisy box-centre queries and their targets for one batch.

    Every centre is moved by ``u * (size / 2 + noise_trans) * noise_scale``
    with ``u ~ U(-1, 1)^3`` per axis, then normalised to ``[0, 1]`` in
    ``pc_range`` and clamped. A copy with ``||u||_2 > split`` gets the
    background label ``num_classes``. The number of groups is
    ``min(max_groups, num_queries // max boxes per sample)`` (upstream CMT's
    rule), so a batch whose largest sample has more boxes than queries, or a
    batch without any box, has no DN queries (None is returned; upstream CMT
    divided by zero here).

    Args:
        gt_bboxes (Sequence[Tensor]): per sample ``[n_i, 9]`` gravity-centre
            boxes ``(x, y, z, w, l, h, yaw, vx, vy)``.
        gt_labels (Sequence[Tensor]): per sample ``[n_i]`` global class indices.
        num_queries (int): matching queries Q.
        max_groups (int): upper bound on the groups (CMT's ``scalar``).
        noise_scale (float): scale of the centre noise (0 = no noise, no
            background copies).
        noise_trans (float): metres added to the half box size.
        split (float): noise norm beyond which a copy is background.
        pc_range (Sequence[float]): ``(x_min, y_min, z_min, x_max, y_max, z_max)``.
        num_classes (int): total classes (the background label).

    Returns:
        DenoisingQueries | None: None when there are no DN queries.
    """
    if len(gt_bboxes) != len(gt_labels):
        raise ValueError(f'{len(gt_bboxes)} box tensors but {len(gt_labels)} label tensors')
    counts: List[int] = [int(boxes.size(0)) for boxes in gt_bboxes]
    for index, (boxes, labels) in enumerate(zip(gt_bboxes, gt_labels)):
        if boxes.dim() != 2 or boxes.size(-1) != 9:
            raise ValueError(f'gt_bboxes[{index}] must be [n, 9] gravity-centre boxes with velocity, '
                             f'got {tuple(boxes.shape)}')
        if labels.numel() != boxes.size(0):
            raise ValueError(f'sample {index} has {boxes.size(0)} boxes but {labels.numel()} labels')
    group_size = max(counts, default=0)
    groups = num_dn_groups(max_groups, num_queries, group_size)
    if groups == 0:
        return None
    boxes = torch.cat(list(gt_bboxes), dim=0)
    labels = torch.cat(list(gt_labels), dim=0).long()
    device = boxes.device
    batch_size = len(counts)

    # counts are host numbers: filled on the device, nothing is copied to it or read from it
    sample_of_box = torch.cat([torch.full((n, ), sample, dtype=torch.long, device=device)
                               for sample, n in enumerate(counts)])
    slot_in_group = torch.cat([torch.arange(n, device=device) for n in counts])
    group_offsets = (torch.arange(groups, device=device) * group_size)[:, None]
    query_index = (slot_in_group[None, :] + group_offsets).reshape(-1)
    batch_index = sample_of_box.repeat(groups)
    dn_boxes = boxes.repeat(groups, 1)
    dn_gt_labels = labels.repeat(groups)
    dn_labels = dn_gt_labels.clone()

    centers = dn_boxes[:, :3]
    if noise_scale > 0:
        unit_noise = torch.rand_like(centers) * 2 - 1
        centers = centers + unit_noise * (dn_boxes[:, 3:6] / 2 + noise_trans) * noise_scale
        dn_labels = torch.where(unit_noise.norm(dim=1) > split, num_classes, dn_labels)
    centers = normalize_points(centers, pc_range).clamp(0.0, 1.0)

    pad_size = groups * group_size
    reference_points = centers.new_zeros(batch_size, pad_size, 3)
    reference_points[batch_index, query_index] = centers
    return DenoisingQueries(
        pad_size=pad_size,
        groups=groups,
        reference_points=reference_points,
        self_attn_mask=dn_self_attn_mask(groups, group_size, num_queries, device),
        batch_index=batch_index,
        query_index=query_index,
        labels=dn_labels,
        gt_labels=dn_gt_labels,
        gt_bboxes=dn_boxes)
