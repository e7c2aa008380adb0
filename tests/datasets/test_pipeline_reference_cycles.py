"""The training pipeline's own geometry leaves no reference cycles behind (issue 23).

mmdet3d's ``array_converter`` decorator (``rotation_3d_in_axis``,
``LiDARInstance3DBoxes.corners``, ``limit_period``, ...) makes a reference
cycle on every call: its nested ``recursive_recover`` closure refers to
itself. The scene rotation and the object sampler's box corners are computed
in numpy here instead (``rotation_z_transposed``, ``box_corners``); they must
give mmdet3d's values and, with automatic garbage collection off, leave
nothing for a collection to find.
"""
import gc
from collections import Counter
from typing import Callable, List

import numpy as np
import torch
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from mmdet3d.core.bbox.structures.utils import rotation_3d_in_axis

from projects.mmdet3d_plugin.datasets.box_geometry import box_corners
from projects.mmdet3d_plugin.datasets.pipelines.lidar_scene import rotation_z_transposed


def _garbage_of_one_call(call: Callable[[], object]) -> List[str]:
    """What a full collection finds after ``call()`` ran with automatic collection off (type names)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        call()
        gc.collect()
        return [getattr(obj, '__qualname__', type(obj).__name__) for obj in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def _cycle_garbage(call: Callable[[], object]) -> List[str]:
    """The reference cycles ``call()`` leaves on every call: what two calls' collections both find (type names).

    A cycle made per call shows up after each; what shows up once is not the call's doing: a first call's
    one-time compilation or import, or another test's objects (torch.fx graph modules of a compiled function)
    that a background thread releases while the call runs (seen in full-suite runs).
    """
    first, second = (Counter(_garbage_of_one_call(call)) for _ in range(2))
    return sorted((first & second).elements())


def test_the_cycle_check_sees_mmdet3ds_array_converter_cycles():
    boxes = LiDARInstance3DBoxes(torch.tensor([[1.0, 2.0, -1.0, 4.0, 2.0, 1.5, 0.3]]))
    assert 'array_converter.<locals>.array_converter_wrapper.<locals>.new_func.<locals>.recursive_recover' in \
        _cycle_garbage(lambda: boxes.corners)


def test_box_corners_are_mmdet3ds_corners_in_their_order():
    rng = np.random.default_rng(0)
    boxes = np.concatenate([rng.uniform(-20, 20, (6, 3)), rng.uniform(0.5, 5, (6, 3)), rng.uniform(-4, 4, (6, 1)),
                            rng.normal(size=(6, 2))], axis=1).astype(np.float32)
    expected = LiDARInstance3DBoxes(torch.from_numpy(boxes), box_dim=9).corners.numpy()
    np.testing.assert_allclose(box_corners(boxes), expected, atol=1e-4)
    assert box_corners(boxes[:0]).shape == (0, 8, 3)
    assert _cycle_garbage(lambda: box_corners(boxes)) == []


def test_rotation_matrix_is_mmdet3ds():
    for angle in (0.0, 0.4, -2.5, np.pi):
        _, expected = rotation_3d_in_axis(np.zeros((1, 3), dtype=np.float32), angle, axis=2, return_mat=True)
        matrix = rotation_z_transposed(angle)
        assert matrix.dtype == np.float32
        np.testing.assert_allclose(matrix, np.asarray(expected), atol=1e-6)


def test_scene_rotation_and_object_sampling_leave_no_reference_cycles(loaded_sample, created_data, cmt):
    np.random.seed(0)
    sample_objects = build_from_cfg(dict(type='UnifiedObjectSample', sample_2d=True, mixup_rate=-1.0,
                                         db_sampler=cmt.db_sampler_cfg(created_data['dbinfos'])), PIPELINES)
    rotate = build_from_cfg(dict(type='GlobalRotScaleTransAll', rot_range=[0.5, 0.5], scale_ratio_range=[1.0, 1.0]),
                            PIPELINES)
    samples = [loaded_sample(), loaded_sample()]  # a fresh one for each of the check's two calls
    results = samples[0]
    num_boxes = len(results['gt_bboxes_3d'])
    inputs = iter(samples)
    assert _cycle_garbage(lambda: rotate(sample_objects(next(inputs)))) == []
    assert len(results['gt_bboxes_3d']) > num_boxes  # objects were pasted (the corners were needed)
    assert results['pcd_rotation_angle'] == 0.5
