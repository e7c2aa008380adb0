"""Object-level metrics of a robustness evaluation: where routing should matter, and whether the router is right.

Besides the devkit's mAP and NDS, each corruption is scored on what it did to
each ground-truth object, comparing a sample's corrupted input with its clean
input (:class:`SampleObservation` of both, recorded by :mod:`.sample_recorder`):

* **affected objects**: those whose LiDAR points the corruption removed (the
  box held ``>= min_lidar_points`` points clean and holds fewer now) and those
  whose centre only failed or dropped camera views see;
* **recall of the affected objects at 2 m**: the fraction with a detection of
  their class scoring ``>= score_threshold`` within ``max_distance`` (BEV);
* **false positives per sample**: detections scoring ``>= score_threshold`` with no ground-truth
  object of their class within ``max_distance``; and those within ``max_distance`` of a ghost's centre;
* **router accuracy**: per object, the query of its best-scoring prediction of
  its class within ``max_distance``; its LiDAR and camera weights against the
  object's routing targets with ``lie_targets`` (``models/aqr/routing_targets.py``:
  a yawed view or a misaligned cloud is no evidence): the fraction on the
  target's side of 0.5;
* **attention on the dead sensor** (with ``camera_mass``): for the same
  queries, the share of their fused cross-attention on the camera keys where
  no live view sees the object, and on the BEV keys where its box holds too
  few points: routing that mutes a dead sensor drives it towards 0.

Every function below is a pure function of tensors.
"""
from dataclasses import dataclass, field, fields
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from torch import Tensor

from ..datasets.pipelines.corruption import CORRUPTION_KEY
from ..models.aqr.aux_loss import DROPPED_MODALITIES_KEY
from ..models.aqr.routing_targets import camera_visible_objects
from ..models.aqr.sensor_lies import lidar_misaligned

#: Defaults: the devkit's 2 m centre distance and a score a detection is counted from.
MAX_DISTANCE_M = 2.0
SCORE_THRESHOLD = 0.3
MIN_LIDAR_POINTS = 5


@dataclass
class SampleObservation:
    """What one test sample gave the model and what the model made of it.

    Attributes:
        token (str): the sample token.
        gt_boxes (Tensor): ``[n, >=7]`` LiDAR boxes (bottom centre, ``LiDARInstance3DBoxes.tensor``).
        gt_labels (Tensor): ``[n]`` class indices.
        gt_points (Tensor): ``[n]`` LiDAR points of the model's input inside each box.
        lidar2img (Tensor): ``[N, 4, 4]`` the projections the model was given.
        camera_meta (dict): ``pad_shape`` and the dead views (``corruption``, ``dropped_modalities``).
        det_centres (Tensor): ``[m, 2]`` BEV centres of the detections.
        det_labels (Tensor): ``[m]`` their classes.
        det_scores (Tensor): ``[m]`` their scores.
        query_centres (Tensor, optional): ``[C, Q, 2]`` BEV centre each query predicts for class ``c`` (that of
            the class's task head); None without routing.
        query_scores (Tensor, optional): ``[Q, C]`` each query's score per class.
        lidar_weights (Tensor, optional): ``[Q]`` the routing weights the decoder used (AQR only).
        camera_weights (Tensor, optional): ``[Q]``.
        camera_mass (Tensor, optional): ``[Q]`` each query's cross-attention probability on the camera keys in
            the fused pass (the rest is on the BEV keys); recorded on request (``--attention-mass``).
    """

    token: str
    gt_boxes: Tensor
    gt_labels: Tensor
    gt_points: Tensor
    lidar2img: Tensor
    camera_meta: dict
    det_centres: Tensor
    det_labels: Tensor
    det_scores: Tensor
    query_centres: Optional[Tensor] = None
    query_scores: Optional[Tensor] = None
    lidar_weights: Optional[Tensor] = None
    camera_weights: Optional[Tensor] = None
    camera_mass: Optional[Tensor] = None

    @property
    def has_routing(self) -> bool:
        """Whether the model routed its queries (CMT-AQR): the router accuracy needs it."""
        return self.lidar_weights is not None


def centres_within(centres: Tensor, others: Tensor, max_distance: float = MAX_DISTANCE_M) -> Tensor:
    """Which of ``centres`` ``[n, >=2]`` lie within ``max_distance`` (BEV) of which of ``others`` ``[m, >=2]``:
    ``[n, m]`` bool."""
    return torch.cdist(centres[:, :2].double(), others[:, :2].double()) <= max_distance


def same_class_within(gt_centres: Tensor, gt_labels: Tensor, centres: Tensor, labels: Tensor,
                      max_distance: float = MAX_DISTANCE_M) -> Tensor:
    """Which predictions lie within ``max_distance`` (BEV) of which ground-truth object of their class.

    Args:
        gt_centres (Tensor): ``[n, 2]``.
        gt_labels (Tensor): ``[n]``.
        centres (Tensor): ``[m, 2]`` predicted centres.
        labels (Tensor): ``[m]`` their classes.
        max_distance (float): metres.

    Returns:
        Tensor: ``[n, m]`` bool.
    """
    if gt_centres.shape[:1] != gt_labels.shape or centres.shape[:1] != labels.shape:
        raise ValueError(f'{tuple(gt_centres.shape)} centres for {tuple(gt_labels.shape)} labels, or '
                         f'{tuple(centres.shape)} for {tuple(labels.shape)}')
    return centres_within(gt_centres, centres, max_distance) & (gt_labels[:, None] == labels[None, :])


def detection_outcomes(gt_centres: Tensor, gt_labels: Tensor, det_centres: Tensor, det_labels: Tensor,
                       det_scores: Tensor, score_threshold: float = SCORE_THRESHOLD,
                       max_distance: float = MAX_DISTANCE_M) -> Tuple[Tensor, Tensor]:
    """Which objects are found and which detections are false positives.

    Only detections scoring ``>= score_threshold`` count. An object is found
    when one of them of its class is within ``max_distance``; a detection is a
    false positive when no object of its class is (not a one-to-one matching:
    two detections of one object are both true, as for the recall).

    Args:
        gt_centres (Tensor): ``[n, 2]`` BEV centres.
        gt_labels (Tensor): ``[n]``.
        det_centres (Tensor): ``[m, 2]``.
        det_labels (Tensor): ``[m]``.
        det_scores (Tensor): ``[m]``.
        score_threshold (float): lowest score counted.
        max_distance (float): metres.

    Returns:
        tuple[Tensor, Tensor]: ``found [n]`` bool and ``false_positive [m]`` bool.
    """
    near = same_class_within(gt_centres, gt_labels, det_centres, det_labels, max_distance)
    confident = det_scores >= score_threshold
    near = near & confident[None, :]
    return near.any(dim=1), confident & ~near.any(dim=0)


def affected_objects(points_before: Tensor, points_after: Tensor, visible_before: Tensor, visible_after: Tensor,
                     min_lidar_points: int = MIN_LIDAR_POINTS) -> Tuple[Tensor, Tensor]:
    """Which objects the corruption took from LiDAR and which from the cameras.

    Args:
        points_before (Tensor): ``[n]`` points in each box, clean input.
        points_after (Tensor): ``[n]`` points in each box, corrupted input.
        visible_before (Tensor): ``[n]`` bool, the centre in a live view of the clean input.
        visible_after (Tensor): ``[n]`` bool, the centre in a live view of the corrupted input.
        min_lidar_points (int): points a box must hold for LiDAR to see the object.

    Returns:
        tuple[Tensor, Tensor]: ``lidar_affected [n]`` (held ``>= min_lidar_points``,
        holds fewer) and ``camera_affected [n]`` (seen before, in no live view now), bool.
    """
    if not points_before.shape == points_after.shape == visible_before.shape == visible_after.shape:
        raise ValueError(f'per-object inputs differ in shape: {tuple(points_before.shape)}, '
                         f'{tuple(points_after.shape)}, {tuple(visible_before.shape)}, {tuple(visible_after.shape)}')
    lidar = (points_before >= min_lidar_points) & (points_after < min_lidar_points)
    return lidar, visible_before.bool() & ~visible_after.bool()


def routed_queries(gt_centres: Tensor, gt_labels: Tensor, query_centres: Tensor, query_scores: Tensor,
                   max_distance: float = MAX_DISTANCE_M) -> Tensor:
    """Per object, the query whose prediction of its class within ``max_distance`` scores best.

    Args:
        gt_centres (Tensor): ``[n, 2]`` BEV centres.
        gt_labels (Tensor): ``[n]`` classes.
        query_centres (Tensor): ``[C, Q, 2]`` each query's centre per class.
        query_scores (Tensor): ``[Q, C]`` each query's score per class.
        max_distance (float): metres.

    Returns:
        Tensor: ``[n]`` long query index, ``-1`` where no query predicts the object's class within reach.
    """
    num_classes, num_queries = query_centres.shape[:2]
    if query_scores.shape != (num_queries, num_classes):
        raise ValueError(f'query_scores {tuple(query_scores.shape)} do not match query_centres '
                         f'{tuple(query_centres.shape)} ([Q, C] and [C, Q, 2])')
    labels = gt_labels.long()
    if num_queries == 0:
        return torch.full_like(labels, -1)
    distance = (query_centres[labels].double() - gt_centres[:, None, :2].double()).norm(dim=-1)  # [n, Q]
    scores = query_scores.t()[labels].double().masked_fill(distance > max_distance, -1.0)
    best_score, best = scores.max(dim=1)
    return torch.where(best_score >= 0, best, torch.full_like(best, -1))


def router_hits(lidar_weights: Tensor, camera_weights: Tensor, lidar_targets: Tensor,
                camera_targets: Tensor) -> Tensor:
    """Whether each weight is on its target's side of 0.5.

    Args:
        lidar_weights (Tensor): ``[n]`` in ``[0, 1]``.
        camera_weights (Tensor): ``[n]``.
        lidar_targets (Tensor): ``[n]`` bool.
        camera_targets (Tensor): ``[n]`` bool.

    Returns:
        Tensor: ``[n, 2]`` bool (LiDAR, camera).
    """
    weights = torch.stack([lidar_weights, camera_weights], dim=-1)
    targets = torch.stack([lidar_targets, camera_targets], dim=-1).bool()
    return (weights > 0.5) == targets


@dataclass
class ObjectCounts:
    """Object-level counts summed over samples (see :func:`sample_counts`)."""

    samples: int = 0
    lidar_affected: int = 0
    camera_affected: int = 0
    affected: int = 0
    affected_found: int = 0
    lidar_affected_found: int = 0
    camera_affected_found: int = 0
    false_positives: int = 0
    ghosts: int = 0
    ghost_false_positives: int = 0
    routed_objects: int = 0
    lidar_hits: int = 0
    camera_hits: int = 0
    dead_camera_objects: int = 0
    dead_camera_mass: float = 0.0
    dead_lidar_objects: int = 0
    dead_lidar_mass: float = 0.0

    def __add__(self, other: 'ObjectCounts') -> 'ObjectCounts':
        return ObjectCounts(**{item.name: getattr(self, item.name) + getattr(other, item.name)
                               for item in fields(self)})


@dataclass
class ObjectMetrics:
    """The object-level metrics of one corruption (ratios None where nothing was counted).

    Attributes:
        affected_recall (float, optional): recall of the affected objects (LiDAR or camera).
        lidar_affected_recall (float, optional): of the objects that lost their LiDAR points.
        camera_affected_recall (float, optional): of the objects only dead views see.
        false_positives_per_sample (float, optional).
        ghost_false_positives_per_sample (float, optional): the false positives within ``max_distance`` of a
            ghost's centre, per sample (None when no sample had a ghost).
        router_accuracy (float, optional): both weights of the routed objects' queries on the targets' side.
        router_lidar_accuracy (float, optional).
        router_camera_accuracy (float, optional).
        dead_camera_attention (float, optional): mean cross-attention mass on the camera keys of the queries of
            the routed objects no live view sees (``camera_mass`` recorded).
        dead_lidar_attention (float, optional): mean mass on the BEV keys of the queries of the routed objects
            whose box holds fewer than ``min_lidar_points`` points.
        counts (dict): the :class:`ObjectCounts` behind them.
        options (dict): ``score_threshold``, ``max_distance``, ``min_lidar_points``.
    """

    affected_recall: Optional[float]
    lidar_affected_recall: Optional[float]
    camera_affected_recall: Optional[float]
    false_positives_per_sample: Optional[float]
    router_accuracy: Optional[float]
    router_lidar_accuracy: Optional[float]
    router_camera_accuracy: Optional[float]
    dead_camera_attention: Optional[float] = None
    dead_lidar_attention: Optional[float] = None
    ghost_false_positives_per_sample: Optional[float] = None
    counts: Dict[str, float] = field(default_factory=dict)
    options: Dict[str, float] = field(default_factory=dict)


def _ratio(numerator: float, denominator: int) -> Optional[float]:
    return numerator / denominator if denominator else None


def visible_objects(observation: SampleObservation, lidar2img: Tensor, lies: bool = False) -> Tensor:
    """``[n]`` bool: each object's centre in a live view of ``observation``, projected with ``lidar2img``
    (``lies``: a yawed view is no live view)."""
    boxes = LiDARInstance3DBoxes(observation.gt_boxes, box_dim=observation.gt_boxes.shape[-1])
    return camera_visible_objects(boxes.gravity_center, lidar2img, observation.camera_meta, lies)


def sample_counts(clean: SampleObservation, corrupted: SampleObservation, score_threshold: float = SCORE_THRESHOLD,
                  max_distance: float = MAX_DISTANCE_M, min_lidar_points: int = MIN_LIDAR_POINTS) -> ObjectCounts:
    """The object-level counts of one sample under a corruption, against the same sample clean.

    The camera views are projected with the clean calibration (a miscalibration
    corrupts what the model is told, not what the cameras see).

    Raises:
        ValueError: the two observations are of different samples or objects.
    """
    if clean.token != corrupted.token or not torch.equal(clean.gt_boxes, corrupted.gt_boxes):
        raise ValueError(f'the clean observation of sample {clean.token} and the corrupted one of {corrupted.token} '
                         f'differ in sample or ground truth: record them over the same dataset')
    lidar2img = clean.lidar2img
    visible_after = visible_objects(corrupted, lidar2img)
    lidar, camera = affected_objects(clean.gt_points, corrupted.gt_points, visible_objects(clean, lidar2img),
                                     visible_after, min_lidar_points)
    gt_centres = corrupted.gt_boxes[:, :2]
    found, false_positive = detection_outcomes(gt_centres, corrupted.gt_labels, corrupted.det_centres,
                                               corrupted.det_labels, corrupted.det_scores, score_threshold,
                                               max_distance)
    affected = lidar | camera
    ghosts = ghost_centres(corrupted.camera_meta)
    near_ghost = centres_within(corrupted.det_centres, ghosts, max_distance).any(dim=1)
    counts = ObjectCounts(samples=1, lidar_affected=int(lidar.sum()), camera_affected=int(camera.sum()),
                          affected=int(affected.sum()), affected_found=int((found & affected).sum()),
                          lidar_affected_found=int((found & lidar).sum()),
                          camera_affected_found=int((found & camera).sum()),
                          false_positives=int(false_positive.sum()), ghosts=len(ghosts),
                          ghost_false_positives=int((false_positive & near_ghost).sum()))
    if corrupted.has_routing:
        query = routed_queries(gt_centres, corrupted.gt_labels, corrupted.query_centres, corrupted.query_scores,
                               max_distance)
        routed = query >= 0
        lidar_target = (corrupted.gt_points[routed] >= min_lidar_points) & (not lidar_misaligned(corrupted.camera_meta))
        camera_target = visible_objects(corrupted, lidar2img, lies=True)[routed]
        hits = router_hits(corrupted.lidar_weights[query[routed]], corrupted.camera_weights[query[routed]],
                           lidar_target, camera_target)
        counts.routed_objects = int(routed.sum())
        counts.lidar_hits, counts.camera_hits = (int(value) for value in hits.sum(dim=0))
        if corrupted.camera_mass is not None:
            camera_mass = corrupted.camera_mass[query[routed]].double()
            dead_camera = ~visible_after[routed]
            dead_lidar = corrupted.gt_points[routed] < min_lidar_points
            counts.dead_camera_objects, counts.dead_lidar_objects = int(dead_camera.sum()), int(dead_lidar.sum())
            counts.dead_camera_mass = float(camera_mass[dead_camera].sum())
            counts.dead_lidar_mass = float((1.0 - camera_mass[dead_lidar]).sum())
    return counts


def object_metrics(clean: Sequence[SampleObservation], corrupted: Sequence[SampleObservation],
                   score_threshold: float = SCORE_THRESHOLD, max_distance: float = MAX_DISTANCE_M,
                   min_lidar_points: int = MIN_LIDAR_POINTS) -> ObjectMetrics:
    """The object-level metrics of a corrupted run against the clean run of the same samples.

    Args:
        clean (Sequence[SampleObservation]): per sample, clean inputs.
        corrupted (Sequence[SampleObservation]): per sample (same order), corrupted inputs.
        score_threshold (float): lowest score a detection is counted with.
        max_distance (float): BEV metres between a detection and its object.
        min_lidar_points (int): points a box must hold for LiDAR to see the object.

    Returns:
        ObjectMetrics: router accuracies are None without routing weights.
    """
    if len(clean) != len(corrupted):
        raise ValueError(f'{len(clean)} clean and {len(corrupted)} corrupted observations: record the same samples')
    total = ObjectCounts()
    for before, after in zip(clean, corrupted):
        total = total + sample_counts(before, after, score_threshold, max_distance, min_lidar_points)
    routed = total.routed_objects
    return ObjectMetrics(
        affected_recall=_ratio(total.affected_found, total.affected),
        lidar_affected_recall=_ratio(total.lidar_affected_found, total.lidar_affected),
        camera_affected_recall=_ratio(total.camera_affected_found, total.camera_affected),
        false_positives_per_sample=_ratio(total.false_positives, total.samples),
        router_accuracy=_ratio(total.lidar_hits + total.camera_hits, 2 * routed),
        router_lidar_accuracy=_ratio(total.lidar_hits, routed),
        router_camera_accuracy=_ratio(total.camera_hits, routed),
        dead_camera_attention=_ratio(total.dead_camera_mass, total.dead_camera_objects),
        dead_lidar_attention=_ratio(total.dead_lidar_mass, total.dead_lidar_objects),
        ghost_false_positives_per_sample=_ratio(total.ghost_false_positives, total.samples) if total.ghosts else None,
        counts=vars(total), options=dict(score_threshold=score_threshold, max_distance=max_distance,
                                         min_lidar_points=min_lidar_points))


def ghost_centres(camera_meta: Mapping) -> Tensor:
    """``[G, 2]`` float64 BEV centres of the ghosts the corruption record of a test sample holds (``G = 0`` without;
    a test pipeline does not move the scene, so the record's frame is the detections')."""
    boxes = (camera_meta.get(CORRUPTION_KEY) or {}).get('ghost_boxes') or []
    return torch.tensor([list(box)[:2] for box in boxes], dtype=torch.float64).reshape(-1, 2)


def camera_meta_of(img_meta: Mapping) -> dict:
    """The part of an img_meta that says which camera views are live: ``pad_shape`` and the dead views."""
    return {key: img_meta[key] for key in ('pad_shape', CORRUPTION_KEY, DROPPED_MODALITIES_KEY) if key in img_meta}

