"""diagnostics/precision_comparison.py: the metrics on hand-made predictions, and a real detector in float32,
float16 and bfloat16 cross-attention on the CPU (the demo config at tiny shapes)."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.core.bbox.coders.multi_task_bbox_coder import MultiTaskBBoxCoder
from projects.mmdet3d_plugin.diagnostics.model_benchmark import ModelBenchmarkOptions
from projects.mmdet3d_plugin.diagnostics.precision_comparison import (FLOOR_RUN, METRICS, TOLERANCES,
                                                                      LastLayerPredictions, compare_config,
                                                                      compare_predictions, exceeded,
                                                                      last_layer_predictions, markdown_table)

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'


def _predictions(bs=2, tasks=2, queries=5, classes=(1, 2), seed=0) -> LastLayerPredictions:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(bs, queries, sum(classes), generator=generator)
    boxes = torch.rand(bs, tasks * queries, 9, generator=generator) + 0.5  # sizes > 0; task t's at rows t * Q + q
    class_to_task = torch.tensor([task for task, count in enumerate(classes) for _ in range(count)])
    return LastLayerPredictions(scores, boxes, class_to_task)


def _changed(predictions: LastLayerPredictions, scores=None, boxes=None) -> LastLayerPredictions:
    return LastLayerPredictions(predictions.scores if scores is None else scores,
                                predictions.boxes if boxes is None else boxes, predictions.class_to_task)


def test_identical_predictions_compare_to_zero():
    reference = _predictions()
    metrics = compare_predictions(reference, _changed(reference), max_num=4)
    assert all(metrics[name] == 0 for name in METRICS)
    assert metrics['shared_top'] == 1


def test_a_detection_box_is_the_box_of_its_class_task():
    reference = _predictions()
    # the best pair of sample 1: query 3, class 2 (task 1); move task 1's box of query 3 (row 5 + 3) by 0.3 m in z
    scores = torch.zeros_like(reference.scores)
    scores[1, 3, 2] = 1.0
    reference = _changed(reference, scores=scores)
    boxes = reference.boxes.clone()
    boxes[1, 5 + 3, 2] += 0.3
    assert compare_predictions(reference, _changed(reference, boxes=boxes), max_num=1)['centre_m'] == \
        pytest.approx(0.3)
    boxes = reference.boxes.clone()
    boxes[1, 3, 2] += 0.3  # task 0's box of the same query is no detection of class 2
    assert compare_predictions(reference, _changed(reference, boxes=boxes), max_num=1)['centre_m'] == 0


def test_each_metric_measures_its_quantity():
    reference = _predictions(bs=1, tasks=1, queries=3, classes=(1, ))
    boxes = reference.boxes.clone()
    boxes[0, :, 6] = torch.tensor([math.pi - 0.01, 0.0, 0.0])
    reference = _changed(reference, boxes=boxes)
    other = boxes.clone()
    other[0, 0, 6] = -math.pi + 0.01  # across the wrap: 0.02 rad apart
    other[0, 1, 3] *= 1.1  # 10 % wider
    other[0, 2, 7:9] += torch.tensor([0.3, 0.4])  # 0.5 m/s
    scores = reference.scores.clone()
    scores[0, 1, 0] += 0.25
    metrics = compare_predictions(reference, _changed(reference, scores=scores, boxes=other), max_num=3)
    assert metrics['heading_rad'] == pytest.approx(0.02, abs=1e-5)
    assert metrics['size'] == pytest.approx(math.log(1.1), rel=1e-5)
    assert metrics['velocity'] == pytest.approx(0.5, rel=1e-5)
    assert metrics['score'] == pytest.approx(0.25)
    assert metrics['centre_m'] == 0


def test_shared_top_counts_pairs_ranked_in_both():
    reference = _predictions(bs=1, queries=4, classes=(1, ), tasks=1)
    scores = torch.tensor([[[0.9], [0.8], [0.1], [0.0]]])
    swapped = torch.tensor([[[0.9], [0.0], [0.1], [0.8]]])  # query 1 drops out of the top 2, query 3 enters
    metrics = compare_predictions(_changed(reference, scores=scores), _changed(reference, scores=swapped), max_num=2)
    assert metrics['shared_top'] == 0.5


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match='different shapes'):
        compare_predictions(_predictions(queries=5), _predictions(queries=6), max_num=2)


def test_exceeded_names_each_metric_beyond_its_tolerance_and_nan():
    limits = TOLERANCES['float16']
    metrics = {name: limits[name] for name in METRICS}
    assert exceeded(metrics, 'float16') == []
    metrics.update(score=2 * limits['score'], velocity=float('nan'))
    assert [failure.split()[0] for failure in exceeded(metrics, 'float16')] == ['score', 'velocity']


def test_last_layer_predictions_reads_the_last_layer_of_every_task():
    layers, bs, queries = 3, 1, 4

    def task(classes, value):
        zeros = torch.zeros(layers, bs, queries, 3)
        preds = dict(center=torch.full((layers, bs, queries, 2), value), height=zeros[..., :1], dim=zeros,
                     rot=torch.tensor([0.0, 1.0]).expand(layers, bs, queries, 2), vel=zeros[..., :2],
                     cls_logits=torch.zeros(layers, bs, queries, classes))
        preds['center'][-1] += 1
        return [preds]

    coder = MultiTaskBBoxCoder(pc_range=[-10, -10, -5, 10, 10, 3], num_classes=3)
    predictions = last_layer_predictions(coder, [task(1, 0.0), task(2, 5.0)])
    assert predictions.scores.shape == (bs, queries, 3) and torch.all(predictions.scores == 0.5)
    assert predictions.class_to_task.tolist() == [0, 1, 1]
    assert predictions.boxes.shape == (bs, 2 * queries, 9)
    assert predictions.boxes[0, ::queries, 0].tolist() == [1.0, 6.0]  # x of the last layer, per task
    assert torch.all(predictions.boxes[..., 3:6] == 1)  # exp(0) sizes


def test_demo_model_half_precision_attention_against_float32():
    rows = compare_config(DEMO_CONFIG, ['float16', 'bfloat16'], ModelBenchmarkOptions(tiny=True, seed=1))
    floor, half, bf16 = rows
    assert [row['run'] for row in rows] == [FLOOR_RUN, 'float16', 'bfloat16']
    assert all(floor[name] == 0 for name in METRICS) and floor['shared_top'] == 1  # the CPU repeats itself
    for row in (half, bf16):
        assert row['failures'] == [], row
        assert row['score'] > 0, 'the half dtype did not change the attention: was it applied?'
    assert bf16['score'] > half['score']  # bfloat16 keeps fewer mantissa bits
    table = markdown_table(rows)
    assert table.count('| ok |') == 2 and '| floor |' in table


def test_a_checkpoint_of_another_config_is_refused(tmp_path):
    path = tmp_path / 'other.pth'
    torch.save(dict(state_dict={'pts_bbox_head.unknown': torch.zeros(1)}), path)
    with pytest.raises(RuntimeError, match='unexpected key|missing keys'):
        compare_config(DEMO_CONFIG, ['float16'], ModelBenchmarkOptions(tiny=True), checkpoint=str(path))


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match='no tolerance'):
        compare_config(DEMO_CONFIG, ['float64'], ModelBenchmarkOptions(tiny=True))
