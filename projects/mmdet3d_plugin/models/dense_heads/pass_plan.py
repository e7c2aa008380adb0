"""``PassPlan``: which keys each decoding pass of ``CmtHead`` attends to, with which decoder, for which samples.

A head's ``modalities`` are the tokens it has: ``('lidar', 'camera')`` for fusion (``CmtHead``), ``('lidar',)``
for ``CmtLidarHead``, ``('camera',)`` for ``CmtImageHead`` (registry aliases that set only this). Its fused pass
attends to all of them; with ``modality_passes=('fused', 'lidar', 'camera')`` (MEFormer / MoME stage 1: "cameras
that see") training also decodes the same queries against the BEV tokens only and the camera tokens only, each
with its own matching, DN and losses (``lidar.loss_cls``, ``camera.d0.dn_loss_bbox``, ...; the fused pass keeps
CMT's names). Inference decodes the fused pass. The default ``('fused',)`` is plain CMT.

Inputs and outputs of :meth:`PassPlan.memory_of` (``bs`` samples, ``C`` channels, ``P`` queries,
``K = H * W + N * h * w`` fused keys)::

    DecoderMemory(bev_feat [bs, C, H, W], bev_pos [H * W, C], img_feat [bs * N, C, h, w],
                  rv_pos [bs * N, h, w, C], cross_attn_bias over [P, K])
      -> the same with the other modality's features and positions None (left out, not zeroed)
         and the bias restricted to the pass's keys (``AttentionBias.restrict_keys``), or, for a pass
         that decodes camera tokens only, the ``camera_only_bias`` given (``camera_window_prior``)

``pass_decoders='separate'`` gives each single-modality pass its own transformer and task heads
(``separate_decoders.<pass>.*``, MoME's experts). At inference ``lidar_free_pass='camera'`` decodes the samples
whose point cloud is empty with the camera pass, ``camera_free_pass='lidar'`` those whose camera images are all
blank with the LiDAR pass (:meth:`PassPlan.inference_passes`, :func:`merge_sample_predictions`); a sample
without either keeps the fused pass. A single-modality pass learns only from the samples whose input for it
arrived whole: not dropped by ``ModalMask3D``, not changed by a training corruption (:func:`trained_samples`).
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import torch
from mmcv.runner import ModuleDict
from torch import Tensor, nn

from ...attention import DecoderBias, restrict_keys
from ...datasets.pipelines.corruption import CORRUPTION_KEY
from ...datasets.pipelines.corruption_spec import corruption_mode
from ...datasets.pipelines.modal_mask_3d import MODALITY_RESULTS_KEYS
from ..aqr.aux_loss import dropped_modalities
from ..utils.img_meta_keys import BLANK_VIEWS_KEY, LIDAR_POINTS_KEY

#: the token sets a head can have, in key order
MODALITIES = ('lidar', 'camera')
#: ``pass_decoders``: the single-modality passes use the fused pass's decoder, or each its own
PASS_DECODERS = ('shared', 'separate')


@dataclass(frozen=True)
class ModalityPass:
    """One decoding pass.

    Attributes:
        name (str): ``'fused'``, ``'lidar'`` or ``'camera'``.
        uses_lidar (bool): the BEV tokens are keys of the pass (if the head has them).
        uses_camera (bool): the camera tokens are keys of the pass (if the head has them).
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


class DecoderMemory(NamedTuple):
    """What a decoding pass attends to (see the module docstring for the shapes); None: not in the pass."""

    bev_feat: Optional[Tensor]
    bev_pos: Optional[Tensor]
    img_feat: Optional[Tensor]
    rv_pos: Optional[Tensor]
    cross_attn_bias: Optional[DecoderBias] = None

    def grid_shapes(self) -> Tuple[Tuple[int, int], Tuple[int, int, int]]:
        """``(H, W)`` of the BEV tokens and ``(N, h, w)`` of the camera tokens (a memory with both)."""
        bev_feat, img_feat = self.bev_feat, self.img_feat
        return tuple(bev_feat.shape[-2:]), (img_feat.size(0) // bev_feat.size(0), *img_feat.shape[-2:])


class PassPlan:
    """The passes of a head and how each one decodes.

    Args:
        modalities (Sequence[str]): the head's tokens, of :data:`MODALITIES`.
        modality_passes (Sequence[str]): the passes of a training step,
            ``'fused'`` and optionally ``'lidar'`` / ``'camera'`` (fusion heads only).
        pass_decoders (str): one of :data:`PASS_DECODERS`.
        lidar_free_pass (str, optional): a trained pass without BEV keys that
            decodes, at inference, the samples without LiDAR points.
        camera_free_pass (str, optional): a trained pass without camera keys
            that decodes, at inference, the samples whose camera images are all blank.
        head_name (str): for the error messages.
    """

    def __init__(self, modalities: Sequence[str] = MODALITIES, modality_passes: Sequence[str] = ('fused', ),
                 pass_decoders: str = 'shared', lidar_free_pass: Optional[str] = None,
                 camera_free_pass: Optional[str] = None, head_name: str = 'CmtHead') -> None:
        if isinstance(modalities, str) or not set(modalities) or set(modalities) - set(MODALITIES):
            raise ValueError(f'{head_name}: modalities must be a non-empty subset of {MODALITIES}, got {modalities!r}')
        self.uses_lidar, self.uses_camera = 'lidar' in modalities, 'camera' in modalities
        self.modalities = tuple(modality for modality in MODALITIES if modality in modalities)
        self.head_name = head_name if len(self.modalities) == 2 else f'{head_name}(modalities={self.modalities})'
        self.passes = self._check_passes(modality_passes)
        self.lidar_free_pass, self.camera_free_pass = self._check_options(pass_decoders, lidar_free_pass,
                                                                          camera_free_pass)
        self.separate = pass_decoders == 'separate'
        self.decoders: Mapping[str, nn.Module] = {}

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(modality_pass.name for modality_pass in self.passes)

    def _check_passes(self, names: Sequence[str]) -> Tuple[ModalityPass, ...]:
        """The passes of ``modality_passes``, fused first."""
        name = self.head_name
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(f"{name}: modality_passes must be a list or tuple of pass names, e.g. "
                            f"('fused', 'lidar', 'camera'), got {names!r}")
        unknown = [pass_name for pass_name in names if pass_name not in MODALITY_PASSES]
        if unknown:
            raise ValueError(f'{name}: unknown modality_passes {unknown}; the passes are {tuple(MODALITY_PASSES)}')
        if len(set(names)) != len(names):
            raise ValueError(f'{name}: modality_passes {tuple(names)} names a pass twice')
        if 'fused' not in names:
            raise ValueError(f"{name}: modality_passes {tuple(names)} lacks 'fused', the pass inference decodes")
        if len(names) > 1 and not self.fusion:
            tokens = 'BEV' if self.uses_lidar else 'camera'
            raise ValueError(f"{name} decodes {tokens} tokens only: its fused pass is its only pass, so "
                             f"modality_passes must be ('fused',), got {tuple(names)}")
        return (FUSED, ) + tuple(MODALITY_PASSES[pass_name] for pass_name in names if pass_name != 'fused')

    def _check_options(self, pass_decoders: str, lidar_free_pass: Optional[str],
                       camera_free_pass: Optional[str]) -> Tuple[Optional[ModalityPass], ...]:
        """Check ``pass_decoders`` and the fallback passes against the trained passes; return the fallbacks."""
        name, names = self.head_name, self.names
        if pass_decoders not in PASS_DECODERS:
            raise ValueError(f'{name}: pass_decoders must be one of {PASS_DECODERS}, got {pass_decoders!r}')
        if pass_decoders == 'separate' and len(self.passes) == 1:
            raise ValueError(f"{name}: pass_decoders='separate' gives each single-modality pass its own decoder, "
                             f"but modality_passes {names} has none; add e.g. 'camera'")
        chosen = []
        for option, pass_name, lost, kept in (('lidar_free_pass', lidar_free_pass, 'lidar', 'camera'),
                                              ('camera_free_pass', camera_free_pass, 'camera', 'lidar')):
            if pass_name is not None and pass_name not in names[1:]:
                raise ValueError(f'{name}: {option}={pass_name!r} must be one of the trained single-modality '
                                 f'passes, modality_passes={names}')
            if pass_name is not None and pass_name != kept:
                raise ValueError(f'{name}: {option}={pass_name!r} decodes {lost} tokens; a sample without {lost} '
                                 f'input needs a pass without them ({kept!r})')
            chosen.append(None if pass_name is None else MODALITY_PASSES[pass_name])
        return tuple(chosen)

    @property
    def fusion(self) -> bool:
        """Whether the head has both BEV and camera tokens."""
        return self.uses_lidar and self.uses_camera

    def decodes_camera_only(self, modality_pass: ModalityPass) -> bool:
        """Whether ``modality_pass`` of this head attends to camera tokens and no BEV tokens."""
        return self.uses_camera and modality_pass.uses_camera and not (self.uses_lidar and modality_pass.uses_lidar)

    @property
    def camera_only_passes(self) -> Tuple[ModalityPass, ...]:
        return tuple(modality_pass for modality_pass in self.passes if self.decodes_camera_only(modality_pass))

    @property
    def needs_points_in_metas(self) -> bool:
        """Whether inference reads each sample's LiDAR points in its img_meta (``lidar_free_pass``)."""
        return self.lidar_free_pass is not None

    @property
    def needs_blank_views_in_metas(self) -> bool:
        """Whether inference reads which camera images are blank in each img_meta (``camera_free_pass``)."""
        return self.camera_free_pass is not None

    def build_separate_decoders(self, build_decoder: Callable[[], Tuple[nn.Module, nn.Module]]) -> ModuleDict:
        """``{pass: ModuleDict(transformer, task_heads)}`` of the single-modality passes with
        ``pass_decoders='separate'`` (empty otherwise), each from ``build_decoder()``; kept for :meth:`decoder_of`.

        mmcv's ``ModuleDict``, so that ``init_weights()`` reaches every transformer and task head.
        """
        decoders = ModuleDict()
        for modality_pass in self.passes[1:] if self.separate else ():
            transformer, task_heads = build_decoder()
            decoders[modality_pass.name] = ModuleDict(dict(transformer=transformer, task_heads=task_heads))
        self.decoders = decoders
        return decoders

    def decoder_of(self, modality_pass: ModalityPass, shared: Tuple[nn.Module, nn.Module]) -> Tuple[nn.Module, ...]:
        """``(transformer, task_heads)`` of the pass: its own with ``pass_decoders='separate'``, else ``shared``."""
        if modality_pass.name in self.decoders:
            own = self.decoders[modality_pass.name]
            return own['transformer'], own['task_heads']
        return shared

    def memory_of(self, modality_pass: ModalityPass, memory: DecoderMemory,
                  camera_only_bias: Optional[Callable[[], DecoderBias]] = None) -> DecoderMemory:
        """What ``modality_pass`` attends to (see the module docstring).

        Args:
            modality_pass (ModalityPass): one of :attr:`passes`.
            memory (DecoderMemory): the head's tokens and the fused bias over them.
            camera_only_bias (callable, optional): makes the bias of a pass
                that decodes camera tokens only, instead of the fused bias
                restricted to its keys.
        """
        if camera_only_bias is not None and self.decodes_camera_only(modality_pass):
            memory = memory._replace(cross_attn_bias=camera_only_bias())
        elif modality_pass is not FUSED:
            num_bev = memory.bev_pos.size(0)
            num_camera = memory.rv_pos.shape[:3].numel() // memory.bev_feat.size(0)  # N * h * w
            memory = memory._replace(cross_attn_bias=restrict_keys(memory.cross_attn_bias,
                                                                   *modality_pass.key_range(num_bev, num_camera)))
        if not modality_pass.uses_lidar:
            memory = memory._replace(bev_feat=None, bev_pos=None)
        if not modality_pass.uses_camera:
            memory = memory._replace(img_feat=None, rv_pos=None)
        return memory

    def inference_passes(self, img_metas: Sequence[Mapping]) -> Tuple[Tuple[ModalityPass, Optional[Tuple[bool]]]]:
        """The fused pass (every sample), then the fallback passes that take a sample, each with its samples:
        ``lidar_free_pass`` those without LiDAR points, ``camera_free_pass`` those whose camera images are all
        blank; a sample without either keeps the fused pass."""
        nothing = (False, ) * len(img_metas)
        lidar_free = nothing if self.lidar_free_pass is None else lidar_free_samples(img_metas)
        camera_free = nothing if self.camera_free_pass is None else camera_free_samples(img_metas)
        passes = [(FUSED, None)]
        for modality_pass, lost, other in ((self.lidar_free_pass, lidar_free, camera_free),
                                           (self.camera_free_pass, camera_free, lidar_free)):
            samples = tuple(free and not both for free, both in zip(lost, other))
            if modality_pass is not None and any(samples):
                passes.append((modality_pass, samples))
        return tuple(passes)


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


def corrupted_modalities(meta: Mapping) -> Set[str]:
    """The modalities (``'points'``, ``'image'``) that a sensor corruption changed in sample ``meta``
    (``meta['corruption']``: its mode's inputs, less those the model does not read)."""
    corruption = meta.get(CORRUPTION_KEY) or {}
    if 'mode' not in corruption:
        return set()
    changed = set(corruption_mode(corruption['mode']).input_keys) - set(corruption.get('unread_inputs', ()))
    return {modality for modality, key in MODALITY_RESULTS_KEYS.items() if key in changed}


def trained_samples(modality_pass: ModalityPass, img_metas: Sequence[Mapping]) -> Tuple[bool, ...]:
    """Per sample, whether the pass's input arrived whole: not dropped by ``ModalMask3D``, not changed by a sensor
    corruption of the training pipeline. A single-modality pass decodes the frames whose other sensor is gone,
    with this sensor intact; it does not learn to find objects its sensor no longer shows (black views, a cut
    sector, boxes without points). The fused pass trains on every sample."""
    return tuple(modality_pass.input_name not in dropped_modalities(meta, i) | corrupted_modalities(meta)
                 for i, meta in enumerate(img_metas))
