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

A single-modality pass learns nothing from a sample whose input for that
modality was dropped by ``ModalMask3D`` (``img_metas[i]['dropped_modalities']``):
such samples take no part in that pass's losses (no target, weight 0), and
``<pass>.num_samples`` logs how many samples each pass trained on (its
losses are 0 when none did).
"""
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..aqr.aux_loss import DROPPED_MODALITIES_KEY

#: key of the fused pass's first task dict holding ``{pass name: predictions}`` of the other passes
PASS_PREDICTIONS_KEY = 'modality_passes'
#: key of a pass's first task dict holding the per-sample bools of :func:`trained_samples`
TRAINED_SAMPLES_KEY = 'trained_samples'


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


def trained_samples(modality_pass: ModalityPass, img_metas: Sequence[Mapping]) -> Tuple[bool, ...]:
    """Per sample, whether the pass's input was there (not dropped by ``ModalMask3D``)."""
    return tuple(modality_pass.input_name not in meta.get(DROPPED_MODALITIES_KEY, ()) for meta in img_metas)


def decoding_passes(preds_dicts: Sequence[List[dict]]) -> Iterator[Tuple[str, Sequence[List[dict]]]]:
    """``(loss prefix, predictions)`` of every pass a training forward decoded, the fused pass first."""
    yield FUSED.loss_prefix, preds_dicts
    for name, pass_preds in preds_dicts[0][0].get(PASS_PREDICTIONS_KEY, {}).items():
        yield MODALITY_PASSES[name].loss_prefix, pass_preds
