"""Record what each test sample gave a CMT detector and what it detected, while an evaluation runs.

:func:`record_samples` wraps the detector's ``simple_test`` for the
duration of a block, so ``single_gpu_test`` (and everything around it) runs
unchanged; each tested sample leaves a
:class:`~.object_metrics.SampleObservation` (its ground truth with the LiDAR
points of the model's input in each box, the camera views it had, the
detections, and for CMT-AQR every query's predictions and routing weights)::

    with record_samples(model, dataset) as observations:
        outputs = single_gpu_test(model, loader)
    object_metrics(clean_observations, observations)
"""
import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..models.aqr.routing_targets import count_points_in_boxes
from ..models.dense_heads.query_router import routing_of
from ..models.utils.camera_geometry import stack_lidar2img
from .attention_mass import CameraMass, record_camera_mass
from .decoder_capture import capture_decoder
from .object_metrics import SampleObservation, camera_meta_of

#: img_meta key of the sample token (mmdet3d's ``Collect3D`` meta key).
TOKEN_KEY = 'sample_idx'


def query_predictions(preds_dicts: Sequence[List[dict]], sample: int) -> Tuple[Tensor, Tensor]:
    """Every query's BEV centre and score per class in the last decoder layer, for one sample.

    Args:
        preds_dicts (Sequence[list[dict]]): a CMT head's output; per task
            ``center [L, bs, Q, 2]`` (metres) and ``cls_logits [L, bs, Q, C_t]``.
        sample (int): index in the batch.

    Returns:
        tuple[Tensor, Tensor]: ``centres [C, Q, 2]`` (class ``c``'s centre is
        its task head's) and ``scores [Q, C]`` (sigmoid), over the tasks' classes in order.
    """
    centres, scores = [], []
    for task in preds_dicts:
        logits = task[0]['cls_logits'][-1][sample].float()  # [Q, C_t]
        scores.append(logits.sigmoid())
        centres += [task[0]['center'][-1][sample].float()] * logits.shape[-1]
    return torch.stack(centres), torch.cat(scores, dim=-1)


def sample_indices(dataset: Dataset) -> Dict[str, int]:
    """``{token: index}`` of an mmdet3d nuScenes dataset's samples (``data_infos``)."""
    return {info['token']: index for index, info in enumerate(dataset.data_infos)}


def observe_batch(dataset: Dataset, indices: Dict[str, int], points: Optional[Sequence[Tensor]],
                  img_metas: Sequence[dict], results: Sequence[dict], preds_dicts: Sequence[List[dict]],
                  camera_mass: Optional[Tensor] = None) -> List[SampleObservation]:
    """The observations of one tested batch.

    Args:
        dataset (Dataset): an mmdet3d nuScenes dataset holding the samples
            (``get_ann_info``): the ground truth.
        indices (dict[str, int]): its :func:`sample_indices`.
        points (Sequence[Tensor], optional): per sample ``[P, >=3]`` the model's LiDAR input.
        img_metas (Sequence[dict]): per sample, with ``sample_idx`` (the token), ``lidar2img``, ``pad_shape``.
        results (Sequence[dict]): per sample ``dict(pts_bbox=dict(boxes_3d, scores_3d, labels_3d))``.
        preds_dicts (Sequence[list[dict]]): the head's output for the batch.
        camera_mass (Tensor, optional): ``[bs, Q]`` the fused pass's cross-attention mass on the camera keys
            (:func:`.attention_mass.record_camera_mass`).

    Returns:
        list[SampleObservation]: one per sample, on the CPU.
    """
    routing = routing_of(preds_dicts)
    lidar2img = stack_lidar2img(img_metas, torch.device('cpu'))
    observations = []
    for sample, (meta, result) in enumerate(zip(img_metas, results)):
        token = meta.get(TOKEN_KEY)
        if token not in indices:
            raise KeyError(f"img_metas[{sample}]['{TOKEN_KEY}'] is {token!r}, not a sample of the dataset: keep "
                           f"'{TOKEN_KEY}' in Collect3D's meta_keys and record over the dataset that is tested")
        ann = dataset.get_ann_info(indices[token])
        labels = torch.as_tensor(ann['gt_labels_3d'], dtype=torch.long)
        known = labels >= 0  # -1: a class the model does not detect
        boxes = ann['gt_bboxes_3d'].tensor[known].float()
        sample_points = points[sample].cpu() if points is not None else boxes.new_zeros(0, 3)
        detections = result['pts_bbox']
        observation = SampleObservation(
            token=token, gt_boxes=boxes, gt_labels=labels[known],
            gt_points=count_points_in_boxes(sample_points, boxes), lidar2img=lidar2img[sample],
            camera_meta=camera_meta_of(meta), det_centres=detections['boxes_3d'].tensor[:, :2].cpu(),
            det_labels=detections['labels_3d'].cpu(), det_scores=detections['scores_3d'].cpu())
        if routing is not None:
            observation.query_centres, observation.query_scores = (
                tensor.cpu() for tensor in query_predictions(preds_dicts, sample))
            observation.lidar_weights = routing.lidar_weights[sample].detach().float().cpu()
            observation.camera_weights = routing.camera_weights[sample].detach().float().cpu()
        if camera_mass is not None:
            observation.camera_mass = camera_mass[sample].float().cpu()
        observations.append(observation)
    return observations


@contextlib.contextmanager
def record_samples(model: nn.Module, dataset: Dataset,
                   attention_mass: bool = False) -> Iterator[List[SampleObservation]]:
    """Within the block, every sample the detector tests adds its :class:`SampleObservation` to the yielded list.

    Args:
        model (nn.Module): a CMT detector, bare or wrapped (``MMDataParallel``, ...), whose
            ``forward_test`` calls ``simple_test``.
        dataset (Dataset): the dataset whose samples are tested (the ground truth; any
            corruption of its pipeline does not matter, the tokens do).
        attention_mass (bool): also each query's cross-attention mass on the camera keys in the fused pass
            (:func:`.attention_mass.record_camera_mass`; dense attention probabilities, slower).

    Yields:
        list[SampleObservation]: in test order.
    """
    detector = getattr(model, 'module', model)
    head = detector.pts_bbox_head
    simple_test = detector.simple_test
    indices = sample_indices(dataset)
    observations: List[SampleObservation] = []

    def recording_simple_test(points: Optional[Sequence[Tensor]], img_metas: Sequence[dict],
                              img: Optional[Tensor] = None, rescale: bool = False) -> List[dict]:
        with capture_decoder(head) as snapshot, (record_camera_mass(head) if attention_mass
                                                 else contextlib.nullcontext(CameraMass())) as mass:
            results = simple_test(points, img_metas, img=img, rescale=rescale)
        observations.extend(observe_batch(dataset, indices, points, img_metas, results, snapshot.preds_dicts,
                                          mass.latest))
        return results

    detector.simple_test = recording_simple_test
    try:
        yield observations
    finally:
        del detector.simple_test
