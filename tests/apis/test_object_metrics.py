"""apis/object_metrics.py on constructed samples: affected objects, recall, false positives, router accuracy."""
import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.apis.object_metrics import (SampleObservation, affected_objects, detection_outcomes,
                                                        object_metrics, routed_queries, router_hits, sample_counts,
                                                        visible_objects)
from projects.mmdet3d_plugin.diagnostics.synthetic_batch import ring_camera

IMG_H, IMG_W = 32, 64
CAR, PEDESTRIAN = 0, 8


def _cameras(yaws=(0.0, np.pi)):
    """Two 90-degree cameras at the origin: view 0 looks along +x, view 1 along -x."""
    return torch.tensor(np.stack([ring_camera(yaw, IMG_W, IMG_H) for yaw in yaws]), dtype=torch.float32)


def _boxes(centres):
    """LiDAR boxes (bottom centre) of 2 x 2 x 2 m around the given (x, y) centres."""
    boxes = torch.zeros(len(centres), 9)
    boxes[:, :2] = torch.tensor(centres, dtype=torch.float32)
    boxes[:, 2] = -1.0
    boxes[:, 3:6] = 2.0
    return boxes


# A at (10, 0): front camera; B at (-10, 0): back camera; C at (0, 10): no camera (both look +-45 degrees).
CENTRES = [(10.0, 0.0), (-10.0, 0.0), (0.0, 10.0)]


def _observation(points, dead_views=(), lidar2img=None, detections=(), routing=None, token='t0'):
    """An observation of three cars A, B, C (see CENTRES) with ``points`` in their boxes."""
    meta = dict(pad_shape=[(IMG_H, IMG_W, 3)] * 2)
    if dead_views:
        meta['corruption'] = dict(name='camera_fail:0.4', views=list(dead_views))
    det = torch.tensor([d[:2] for d in detections], dtype=torch.float32).reshape(-1, 2)
    observation = SampleObservation(
        token=token, gt_boxes=_boxes(CENTRES), gt_labels=torch.full((3, ), CAR), gt_points=torch.tensor(points),
        lidar2img=_cameras() if lidar2img is None else lidar2img, camera_meta=meta, det_centres=det,
        det_labels=torch.tensor([d[2] for d in detections], dtype=torch.long),
        det_scores=torch.tensor([d[3] for d in detections], dtype=torch.float32))
    if routing is not None:
        # one query on each object (A, B, C) for every class; routing = (scores, lidar weights, camera weights)
        scores, lidar, camera = routing
        observation.query_centres = torch.tensor(CENTRES)[None].expand(10, -1, -1).clone()
        observation.query_scores = torch.tensor(scores)[:, None].expand(-1, 10).clone()
        observation.lidar_weights, observation.camera_weights = torch.tensor(lidar), torch.tensor(camera)
    return observation


def test_detections_find_objects_of_their_class_within_2m_above_the_threshold():
    gt_centres, gt_labels = torch.tensor([[0.0, 0.0], [10.0, 0.0]]), torch.tensor([CAR, PEDESTRIAN])
    det_centres = torch.tensor([[1.5, 0.0], [10.0, 3.0], [20.0, 0.0], [10.0, 0.5]])
    det_labels = torch.tensor([CAR, PEDESTRIAN, CAR, CAR])
    det_scores = torch.tensor([0.5, 0.9, 0.2, 0.6])
    found, false_positive = detection_outcomes(gt_centres, gt_labels, det_centres, det_labels, det_scores)
    # the car is found at 1.5 m; the pedestrian's detection is 3 m off and the car near it has the wrong class
    assert found.tolist() == [True, False]
    assert false_positive.tolist() == [False, True, False, True]  # the 0.2 detection is below the 0.3 threshold
    _, false_positive = detection_outcomes(gt_centres, gt_labels, det_centres, det_labels, det_scores, 0.1)
    assert false_positive.tolist() == [False, True, True, True]
    found, _ = detection_outcomes(gt_centres, gt_labels, det_centres, det_labels, det_scores, max_distance=3.0)
    assert found.tolist() == [True, True]
    found, false_positive = detection_outcomes(gt_centres, gt_labels, det_centres[:0], det_labels[:0],
                                               det_scores[:0])
    assert found.tolist() == [False, False] and false_positive.numel() == 0


def test_affected_objects_lost_their_points_or_every_view_that_saw_them():
    lidar, camera = affected_objects(torch.tensor([10, 10, 2, 10]), torch.tensor([0, 10, 0, 4]),
                                     torch.tensor([True, True, True, False]), torch.tensor([True, False, True, False]))
    assert lidar.tolist() == [True, False, False, True]  # object 2 never had 5 points
    assert camera.tolist() == [False, True, False, False]  # object 3 was never seen
    lidar, _ = affected_objects(torch.tensor([10, 10]), torch.tensor([0, 3]), torch.ones(2, dtype=torch.bool),
                                torch.ones(2, dtype=torch.bool), min_lidar_points=3)
    assert lidar.tolist() == [True, False]
    with pytest.raises(ValueError, match='differ in shape'):
        affected_objects(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2))


def test_routed_query_is_the_best_scoring_prediction_of_the_class_within_reach():
    query_centres = torch.tensor([[[1.0, 0.0], [0.5, 0.0], [5.0, 0.0]],  # class 0
                                  [[9.0, 9.0], [9.0, 9.0], [9.0, 9.0]]])  # class 1
    query_scores = torch.tensor([[0.3, 0.9], [0.8, 0.9], [0.99, 0.9]])
    gt_centres, gt_labels = torch.tensor([[0.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 1])
    assert routed_queries(gt_centres, gt_labels, query_centres, query_scores).tolist() == [1, -1]
    assert routed_queries(gt_centres, gt_labels, query_centres, query_scores, max_distance=6.0).tolist() == [2, -1]
    assert routed_queries(gt_centres, gt_labels, query_centres[:, :0], query_scores[:0]).tolist() == [-1, -1]
    with pytest.raises(ValueError, match='do not match'):
        routed_queries(gt_centres, gt_labels, query_centres, query_scores.t())


def test_router_hits_compare_each_weight_with_its_target():
    hits = router_hits(torch.tensor([0.2, 0.8, 0.6]), torch.tensor([0.9, 0.7, 0.4]),
                       torch.tensor([False, True, False]), torch.tensor([True, False, False]))
    assert hits.tolist() == [[True, True], [True, False], [False, True]]


def test_object_metrics_of_a_constructed_corruption():
    routing = ([0.9, 0.4, 0.7], [0.2, 0.8, 0.9], [0.9, 0.7, 0.1])
    clean = _observation([20, 20, 20])
    # A loses its points, B's camera (view 1) fails; one detection on A, one false positive far from everything
    corrupted = _observation([0, 20, 20], dead_views=[1], routing=routing,
                             detections=[(10.5, 0.0, CAR, 0.9), (0.0, -15.0, CAR, 0.5), (-10.0, 0.0, CAR, 0.1)])
    counts = sample_counts(clean, corrupted)
    assert (counts.lidar_affected, counts.camera_affected, counts.affected) == (1, 1, 2)
    assert (counts.affected_found, counts.lidar_affected_found, counts.camera_affected_found) == (1, 1, 0)
    assert counts.false_positives == 1  # B's detection scores 0.1: neither found nor a false positive
    # targets: A lidar 0 camera 1; B lidar 1 camera 0 (dead view); C lidar 1 camera 0 (no camera sees it)
    assert (counts.routed_objects, counts.lidar_hits, counts.camera_hits) == (3, 3, 2)
    metrics = object_metrics([clean, clean], [corrupted, _observation([20, 20, 20], routing=routing)])
    assert metrics.affected_recall == pytest.approx(0.5)
    assert (metrics.lidar_affected_recall, metrics.camera_affected_recall) == (1.0, 0.0)
    assert metrics.false_positives_per_sample == pytest.approx(0.5)
    # the clean sample: B's camera weight 0.7 is now right (its view is live), C's still right
    assert metrics.router_lidar_accuracy == pytest.approx(5 / 6)  # A's 0.2 is wrong clean (A has its points)
    assert metrics.router_camera_accuracy == pytest.approx(5 / 6)
    assert metrics.router_accuracy == pytest.approx(10 / 12)
    assert metrics.counts['samples'] == 2 and metrics.options['score_threshold'] == 0.3


def test_attention_on_the_dead_sensor_averages_the_routed_queries_mass():
    routing = ([0.9, 0.4, 0.7], [0.2, 0.8, 0.9], [0.9, 0.7, 0.1])
    clean = _observation([20, 20, 20])
    # A loses its points; B's camera (view 1) fails; C no camera sees: the dead camera is B's and C's
    corrupted = _observation([0, 20, 20], dead_views=[1], routing=routing)
    assert object_metrics([clean], [corrupted]).dead_camera_attention is None  # no mass recorded
    corrupted.camera_mass = torch.tensor([0.7, 0.25, 0.05])  # per query: A, B, C
    counts = sample_counts(clean, corrupted)
    assert (counts.dead_camera_objects, counts.dead_lidar_objects) == (2, 1)
    assert counts.dead_camera_mass == pytest.approx(0.30) and counts.dead_lidar_mass == pytest.approx(0.3)
    metrics = object_metrics([clean], [corrupted])
    assert metrics.dead_camera_attention == pytest.approx(0.15)  # camera keys of B and C's queries
    assert metrics.dead_lidar_attention == pytest.approx(0.3)  # BEV keys of A's query: 1 - 0.7


def test_no_affected_objects_and_no_routing_give_none():
    clean = _observation([20, 20, 20])
    metrics = object_metrics([clean], [_observation([20, 20, 20], detections=[(10.0, 0.0, CAR, 0.9)])])
    assert metrics.affected_recall is None and metrics.router_accuracy is None
    assert metrics.false_positives_per_sample == 0.0


def test_cameras_are_judged_with_the_clean_calibration_and_dropped_images_count():
    clean = _observation([20, 20, 20])
    rotated = _observation([20, 20, 20], lidar2img=_cameras(yaws=(np.pi / 2, -np.pi / 2)),
                           routing=([0.9, 0.9, 0.9], [0.9, 0.9, 0.9], [0.9, 0.9, 0.1]))
    counts = sample_counts(clean, rotated)
    assert counts.camera_affected == 0  # a miscalibration hides nothing from the cameras
    assert counts.camera_hits == 3  # targets: A and B seen, C not, as the cameras really are
    dropped = _observation([20, 20, 20])
    dropped.camera_meta['dropped_modalities'] = ['image']
    assert sample_counts(clean, dropped).camera_affected == 2  # A and B; C was never seen


def test_observations_of_different_samples_are_refused():
    with pytest.raises(ValueError, match='differ in sample'):
        sample_counts(_observation([20, 20, 20]), _observation([20, 20, 20], token='t1'))
    with pytest.raises(ValueError, match='1 clean and 2 corrupted'):
        object_metrics([_observation([20, 20, 20])], [_observation([20, 20, 20])] * 2)


def test_an_object_is_seen_where_its_gravity_centre_projects():
    """A 6 m tall box 2 m ahead standing 3 m below the cameras: its bottom centre is below the front image, its
    gravity centre (at the cameras' height) in it."""
    observation = _observation([20, 20, 20])
    observation.gt_boxes[0, :3] = torch.tensor([2.0, 0.0, -3.0])
    observation.gt_boxes[0, 5] = 6.0
    assert visible_objects(observation, observation.lidar2img).tolist() == [True, True, False]


def test_false_positives_near_ghosts_are_the_confident_unmatched_detections_within_2m_of_a_ghost():
    """Ghosts at (5, 5) and (-5, -5). Detections: a true car on A (not counted, although a ghost is near it in
    the second sample), a false car 1.5 m from the first ghost, a false car 3 m from it, a low-scoring one on it."""
    clean = _observation([40, 40, 40])
    corrupted = _observation([40, 40, 40], detections=[(10.0, 0.0, CAR, 0.9), (6.5, 5.0, CAR, 0.8),
                                                       (5.0, 8.0, CAR, 0.7), (5.0, 5.0, CAR, 0.1)])
    ghosts = [[5.0, 5.0, -1.5, 4.0, 2.0, 1.5, 0.0, 0.0, 0.0], [-5.0, -5.0, -1.5, 4.0, 2.0, 1.5, 0.0, 0.0, 0.0]]
    corrupted.camera_meta['corruption'] = dict(name='lidar_ghost:2', mode='lidar_ghost', ghost_boxes=ghosts)
    counts = sample_counts(clean, corrupted)
    assert counts.false_positives == 2 and counts.ghost_false_positives == 1 and counts.ghosts == 2
    beside_a = _observation([40, 40, 40], detections=[(10.0, 0.0, CAR, 0.9)], token='t1')
    beside_a.camera_meta['corruption'] = dict(mode='lidar_ghost', ghost_boxes=[[9.0, 1.0, -1.5, 1, 1, 1, 0, 0, 0]])
    metrics = object_metrics([clean, _observation([40, 40, 40], token='t1')], [corrupted, beside_a])
    assert metrics.ghost_false_positives_per_sample == 0.5
    assert metrics.counts['ghost_false_positives'] == 1
    assert object_metrics([clean], [_observation([40, 40, 40])]).ghost_false_positives_per_sample is None


def test_router_targets_know_where_a_sensor_lies():
    """A yawed view is no evidence (camera target 0 for B, seen only by the yawed back view), a misaligned cloud
    none either (LiDAR target 0 for every object); the affected objects are still the ones that lost evidence."""
    routing = ([0.9, 0.9, 0.9], [0.9, 0.9, 0.9], [0.9, 0.2, 0.2])
    clean = _observation([20, 20, 20])
    yawed = _observation([20, 20, 20], routing=routing)
    yawed.camera_meta['corruption'] = dict(mode='view_yaw', yawed_views=[1])
    counts = sample_counts(clean, yawed)
    # targets: A camera 1 (live front view), B camera 0 (yawed), C camera 0 (no view): all three right
    assert (counts.routed_objects, counts.lidar_hits, counts.camera_hits) == (3, 3, 3)
    assert counts.camera_affected == 0
    misaligned = _observation([20, 20, 20], routing=([0.9] * 3, [0.1, 0.1, 0.9], [0.9, 0.9, 0.2]))
    misaligned.camera_meta['corruption'] = dict(mode='lidar_misalign', misaligned=True)
    assert sample_counts(clean, misaligned).lidar_hits == 2
