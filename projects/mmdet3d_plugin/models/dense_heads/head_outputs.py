"""``HeadOutputs``: what ``CmtHead.forward`` returns, read by ``loss`` and ``get_bboxes`` by attribute.

Shapes (``L`` decoder layers, ``bs`` samples, ``Q`` anchor queries, ``pad``
DN query slots, ``C_t`` the classes of a task):

* ``tasks``: per task a one-element list (one feature level) holding a dict
  of ``center [L, bs, Q, 2]`` and ``height [L, bs, Q, 1]`` (metres),
  ``dim [L, bs, Q, 3]``, ``rot [L, bs, Q, 2]``, ``vel [L, bs, Q, 2]``,
  ``cls_logits [L, bs, Q, C_t]`` and, in training with DN queries, the same
  six prefixed ``dn_`` (``[L, bs, pad, .]``). This is upstream CMT's
  ``preds_dicts`` layout (what ``MultiTaskBBoxCoder.decode`` reads), and a
  ``HeadOutputs`` is that sequence too: ``outputs[task][0]['cls_logits']``.
  The dicts hold the predictions only.
* ``dn_queries``: the batch's :class:`DenoisingQueries` (training), else None.
* ``routing``: AQR's :class:`QueryRouting` (``lidar_weights`` /
  ``camera_weights [bs, Q]``, ``projection_info``), None without AQR.
* ``passes``: in training, ``{pass name: PassOutputs}`` of the
  single-modality decoding passes (same layout; ``trained_samples`` per sample).
* ``image_aux``: in training with an ``ImageAuxHead``, its :class:`ImageAuxOutputs`.
* ``bev_aux``: in training with a ``BevAuxHead`` (at inference with its ``heading_at_inference`` or
  ``velocity_at_inference``), its
  :class:`BevAuxOutputs`.
* ``fused_black_samples``: with ``fused_image_drop_prob``, per sample whether
  the fused pass saw black camera views.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch import Tensor

from ..utils.denoising import DenoisingQueries
from .bev_aux_head import BevAuxOutputs
from .image_aux_head import ImageAuxOutputs
from .query_router import QueryRouting

#: per task, a one-element list of the prediction dict (upstream CMT's ``preds_dicts``)
TaskPredictions = Tuple[List[Dict[str, Tensor]], ...]


def fp32_predictions(tasks: Sequence[List[Dict[str, Tensor]]]) -> TaskPredictions:
    """``tasks`` with every floating-point tensor in fp32 (unchanged, not copied, where it already is)."""
    return tuple([{key: value.float() if value.is_floating_point() else value for key, value in level.items()}
                  for level in task] for task in tasks)


@dataclass(frozen=True)
class PassOutputs:
    """One single-modality decoding pass's predictions.

    Attributes:
        tasks (tuple[list[dict]]): per task, as :attr:`HeadOutputs.tasks`.
        trained_samples (tuple[bool, ...]): per sample, whether the pass's
            input was there (not dropped by ``ModalMask3D``); the others take
            no part in its losses.
    """

    tasks: TaskPredictions
    trained_samples: Tuple[bool, ...]


@dataclass(frozen=True)
class HeadOutputs(Sequence):
    """The head's outputs (see the module docstring); as a sequence, the decoded pass's per-task predictions."""

    tasks: TaskPredictions
    dn_queries: Optional[DenoisingQueries] = None
    routing: Optional[QueryRouting] = None
    passes: Mapping[str, PassOutputs] = field(default_factory=dict)
    image_aux: Optional[ImageAuxOutputs] = None
    fused_black_samples: Optional[Tuple[bool, ...]] = None
    bev_aux: Optional[BevAuxOutputs] = None

    def __getitem__(self, task: int) -> List[Dict[str, Tensor]]:
        return self.tasks[task]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[List[Dict[str, Tensor]]]:
        return iter(self.tasks)

    def float(self) -> 'HeadOutputs':
        """A copy whose predictions (every pass's) are fp32, as mmcv's ``force_fp32`` makes a loss's inputs."""
        passes = {name: dataclasses.replace(outputs, tasks=fp32_predictions(outputs.tasks))
                  for name, outputs in self.passes.items()}
        return dataclasses.replace(self, tasks=fp32_predictions(self.tasks), passes=passes)

    def decoding_passes(self) -> Iterator[Tuple[str, TaskPredictions, Optional[Tuple[bool, ...]]]]:
        """``(pass name, predictions, trained samples)`` of every decoded pass, the fused pass first (its
        trained samples None: every sample)."""
        yield 'fused', self.tasks, None
        for name, outputs in self.passes.items():
            yield name, outputs.tasks, outputs.trained_samples
