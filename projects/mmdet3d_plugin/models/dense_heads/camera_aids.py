"""``CameraAids``: the camera learning aids of ``CmtHead`` (the camera keys of its ``aids``; all off by default).

* ``image_aux_config``: an :class:`ImageAuxHead` on the camera map
  ``[bs * N, C, h, w]`` (heatmap ``[bs * N, K, h, w]``, depth ``[bs * N, 1, h, w]``),
  training losses ``image_aux.loss_heatmap`` / ``image_aux.loss_depth``.
* ``camera_depth_position``: each camera token's position ``[bs * N, h, w, C]``
  also embeds its pixel centre lifted to the aux head's detached depth.
* ``camera_window_prior``: the fixed camera window bias (:class:`CameraWindowPrior`,
  an ``AttentionBias`` over ``[P, N * h * w]``) of the passes that decode camera tokens only.
* ``fused_image_drop_prob``: in training, the fraction of samples whose fused
  pass and routing see black camera views (``FusedBlankViews``: the drawn
  samples and their views' features ``[k * N, C, h, w]``) while the other
  passes and the aux head see the real ones.

:meth:`CameraAids.cameras` turns the camera map, metas and geometry into
:class:`CameraInputs`: the camera memory ``img_feat [bs * N, C, h, w]`` and
positions ``rv_pos [bs * N, h, w, C]`` of the single-modality passes, those of
the fused pass and routing (with the black views swapped in) and its metas,
and the aux head's training outputs. Not an ``nn.Module``: the head registers
``image_aux_head`` / ``camera_window_prior`` under those names.
"""
from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch
from mmdet.models.builder import build_head
from torch import Tensor, nn

from ...attention import AttentionBias
from ..aqr.aux_loss import dropped_modalities
from ..utils.camera_blanking import FusedBlankViews, replace_sample_views, with_dropped_images
from ..utils.camera_geometry import CameraGeometry
from .camera_window_prior import CameraWindowPrior
from .image_aux_head import IMAGE_AUX_PREFIX, ImageAuxOutputs
from .pass_plan import DecoderMemory, PassPlan
from .position_embedding import PositionEmbedding


class CameraInputs(NamedTuple):
    """The camera memory of a forward pass (None without a camera; see the module docstring)."""

    img_feat: Optional[Tensor]
    rv_pos: Optional[Tensor]
    fused_img_feat: Optional[Tensor]
    fused_rv_pos: Optional[Tensor]
    fused_metas: Sequence[dict]
    image_aux: Optional[ImageAuxOutputs] = None
    fused_black_samples: Optional[Tuple[bool, ...]] = None

    def single_modality(self, fused: DecoderMemory) -> DecoderMemory:
        """The memory of the single-modality passes: ``fused`` with the real camera views."""
        if self.fused_black_samples is None:
            return fused
        return fused._replace(img_feat=self.img_feat, rv_pos=self.rv_pos)


class CameraAids:
    """The aids of the module docstring.

    Args:
        image_aux_config (dict, optional): ``ImageAuxHead`` config (its
            ``in_channels`` and ``num_classes`` come from the head).
        camera_depth_position (bool): lift camera tokens at the aux head's depth.
        camera_window_prior (dict, optional): :class:`CameraWindowPrior` arguments.
        fused_image_drop_prob (float): in ``[0, 1)``.
        hidden_dim (int): the head's width.
        num_classes (int): the head's classes (all tasks).
        pass_plan (PassPlan): the head's passes (the prior needs one that decodes camera tokens only).
        pc_range (Sequence[float]): the head's point-cloud range.
        modulates_features (bool): whether the head's AQR scales features (legacy), which
            ``fused_image_drop_prob`` cannot serve.
        head_name (str): for the error messages.
    """

    def __init__(self, image_aux_config: Optional[dict] = None, camera_depth_position: bool = False,
                 camera_window_prior: Optional[dict] = None, fused_image_drop_prob: float = 0.0, *,
                 hidden_dim: int, num_classes: int, pass_plan: PassPlan, pc_range: Sequence[float],
                 modulates_features: bool = False, head_name: str = 'CmtHead') -> None:
        self.image_aux_head = None
        if image_aux_config is not None:
            if not pass_plan.uses_camera:
                raise ValueError(f'{head_name} has no camera features: image_aux_config needs a head with a camera '
                                 f'(CmtHead or CmtImageHead)')
            self.image_aux_head = build_head(dict(image_aux_config, in_channels=hidden_dim, num_classes=num_classes))
        if camera_depth_position and not (self.image_aux_head is not None and self.image_aux_head.with_depth):
            raise ValueError(f'{head_name}: camera_depth_position=True lifts camera tokens at the depth ImageAuxHead '
                             f'predicts; give image_aux_config=dict(type=\'ImageAuxHead\', ...) with a depth branch '
                             f'(loss_depth not None)')
        self.camera_depth_position = camera_depth_position
        self.camera_window_prior = None
        if camera_window_prior is not None:
            if not pass_plan.camera_only_passes:
                raise ValueError(f"{head_name}: camera_window_prior biases the passes that decode camera tokens "
                                 f"only, but none of modality_passes {pass_plan.names} does; add 'camera'")
            self.camera_window_prior = CameraWindowPrior(**camera_window_prior)
        if not 0.0 <= fused_image_drop_prob < 1.0:
            raise ValueError(f'{head_name}: fused_image_drop_prob must be in [0, 1), got {fused_image_drop_prob}')
        if fused_image_drop_prob > 0 and not pass_plan.fusion:
            raise ValueError(f'{head_name}: fused_image_drop_prob blacks out the cameras of the fused pass of a '
                             f'fusion head; this head decodes one modality (use ModalMask3D for input drops)')
        if fused_image_drop_prob > 0 and modulates_features:
            raise ValueError(f"{head_name}: fused_image_drop_prob needs modulation='attention_bias' (the feature "
                             f"modulation would modulate the camera passes' features by the fused routing)")
        self.fused_image_drop_prob = fused_image_drop_prob
        self.pc_range = list(pc_range)

    @property
    def modules(self) -> Dict[str, Optional[nn.Module]]:
        """``{name on the head: module}`` in the order they were built (None: absent)."""
        return dict(image_aux_head=self.image_aux_head, camera_window_prior=self.camera_window_prior)

    def draw_fused_image_drops(self, img_metas: Sequence[dict]) -> Tuple[bool, ...]:
        """Per training sample, whether its fused pass sees black camera views (``fused_image_drop_prob``).

        Samples whose images are already gone (``ModalMask3D``, ``camera_drop``) are not drawn. Draws
        from torch's global generator only when ``fused_image_drop_prob > 0``.
        """
        if self.fused_image_drop_prob == 0:
            return (False, ) * len(img_metas)
        draws = (torch.rand(len(img_metas)) < self.fused_image_drop_prob).tolist()
        return tuple(draw and 'image' not in dropped_modalities(meta, i)
                     for i, (draw, meta) in enumerate(zip(draws, img_metas)))

    def cameras(self, img_feat: Optional[Tensor], img_metas: Sequence[dict], geometry: Optional[CameraGeometry],
                fused_blank_views: Optional[FusedBlankViews], positions: PositionEmbedding,
                training: bool) -> CameraInputs:
        """The camera memory, positions and aux outputs of a forward pass (see the module docstring);
        ``geometry`` is the batch's cameras (None without ``img_feat``)."""
        if img_feat is None:
            return CameraInputs(None, None, None, None, img_metas)
        image_aux = blank_depth = None
        if self.image_aux_head is not None and (training or self.camera_depth_position):
            image_aux, blank_depth = self._image_aux(img_feat, img_metas, geometry, fused_blank_views)
        token_depth = image_aux.depth.detach()[:, 0] if self.camera_depth_position else None
        frustum_pos = positions.frustum(img_feat, geometry)
        rv_pos = positions.camera(frustum_pos, token_depth, geometry)
        image_aux = image_aux if training else None
        if fused_blank_views is None:
            return CameraInputs(img_feat, rv_pos, img_feat, rv_pos, img_metas, image_aux)
        # the fused pass's views: the drawn samples' black ones, at the frustum embedding of the real views, with
        # their own depth term; their images marked dropped for the routing
        samples = fused_blank_views.samples
        fused_depth = None
        if token_depth is not None:
            fused_depth = replace_sample_views(token_depth[:, None], samples, blank_depth.detach())[:, 0]
        return CameraInputs(img_feat, rv_pos, replace_sample_views(img_feat, samples, fused_blank_views.img_feat),
                            positions.camera(frustum_pos, fused_depth, geometry),
                            with_dropped_images(img_metas, samples), image_aux, samples)

    def _image_aux(self, img_feat: Tensor, img_metas: Sequence[dict], geometry: CameraGeometry,
                   fused_blank_views: Optional[FusedBlankViews]) -> Tuple[ImageAuxOutputs, Optional[Tensor]]:
        """The aux head's outputs on ``img_feat`` and, with ``fused_blank_views``, its depth ``[k * N, 1, h, w]`` of
        the black views (one batch, as the image backbone ran them, so that BatchNorm sees what it sees there)."""
        if fused_blank_views is None:
            return self.image_aux_head(img_feat, img_metas, geometry), None
        blank = [index for index, drawn in enumerate(fused_blank_views.samples) if drawn]
        both = self.image_aux_head(torch.cat((img_feat, fused_blank_views.img_feat)),
                                   list(img_metas) + [img_metas[index] for index in blank],
                                   geometry.select(list(range(len(img_metas))) + blank))
        depth = None if both.depth is None else both.depth[img_feat.size(0):]
        return both.first_samples(len(img_metas)), depth

    def window_prior_bias(self, reference_points: Tensor, img_feat: Optional[Tensor],
                          geometry: Optional[CameraGeometry]) -> Optional[Callable[[], AttentionBias]]:
        """``camera_window_prior``'s bias maker for a pass that decodes camera tokens only (None without it).

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised, DN queries first.
            img_feat (Tensor, optional): ``[bs * N, C, h, w]`` camera memory
                (a head with the prior has a camera).
            geometry (CameraGeometry, optional): the batch's cameras (a head with the prior has them).

        Returns:
            callable: makes the ``AttentionBias`` over the ``P`` queries and ``N * h * w`` camera keys.
        """
        if self.camera_window_prior is None:
            return None
        camera_shape = (img_feat.size(0) // reference_points.size(0), *img_feat.shape[-2:])
        return lambda: self.camera_window_prior(reference_points, self.pc_range, camera_shape, geometry)

    def loss(self, image_aux: Optional[ImageAuxOutputs], fused_black_samples: Optional[Sequence[bool]],
             gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], device: torch.device) -> Dict[str, Tensor]:
        """``image_aux.*`` losses, and ``fused.num_black_camera_samples`` with ``fused_image_drop_prob`` (logged at
        every step, 0 when no sample was drawn)."""
        losses = {}
        if image_aux is not None:
            aux_losses = self.image_aux_head.loss(image_aux, gt_bboxes_3d, gt_labels_3d)
            losses.update({IMAGE_AUX_PREFIX + name: value for name, value in aux_losses.items()})
        if self.fused_image_drop_prob > 0:
            losses['fused.num_black_camera_samples'] = torch.full((), float(sum(fused_black_samples or ())),
                                                                  device=device)
        return losses
