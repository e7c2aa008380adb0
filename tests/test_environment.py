"""The third-party stack the plugin stands on works on CPU.

These guard the setup recipe (tools/setup_env.sh): mmcv's CPU ops, spconv 2's
sparse convolution through mmdet3d's ``SparseEncoder``, and the patched
mmdet3d importing against mmcv-full 1.7.2.
"""
import os
import subprocess
import sys

import torch


def test_mmdet3d_accepts_mmcv_1_7_2():
    import mmcv
    import mmdet3d

    assert mmcv.__version__ == '1.7.2'
    assert mmdet3d.__version__ == '1.0.0rc6'


def test_mmcv_voxelization_runs_on_cpu():
    from mmcv.ops import Voxelization

    voxelize = Voxelization(
        voxel_size=[0.5, 0.5, 8.0], point_cloud_range=[-4, -4, -5, 4, 4, 3], max_num_points=4, max_voxels=100)
    points = torch.tensor([[0.1, 0.1, 0.0, 1.0], [0.2, 0.2, 0.0, 2.0], [3.9, -3.9, 1.0, 3.0], [10.0, 0.0, 0.0, 4.0]])
    voxels, coors, num_points = voxelize(points)
    # the first two points share a voxel, the third has its own, the fourth is out of range
    assert voxels.shape == (2, 4, 4)
    assert sorted(num_points.tolist()) == [1, 2]
    assert coors.shape == (2, 3)  # (z, y, x)
    assert {tuple(c) for c in coors.tolist()} == {(0, 8, 8), (0, 0, 15)}


def test_sparse_encoder_forward_backward_on_cpu():
    """mmdet3d's SparseEncoder through spconv 2, with the plugin's CPU stream fix applied on import."""
    import projects.mmdet3d_plugin  # noqa: F401
    from mmdet3d.models.middle_encoders import SparseEncoder

    encoder = SparseEncoder(
        in_channels=5,
        sparse_shape=[41, 32, 32],
        output_channels=128,
        order=('conv', 'norm', 'act'),
        encoder_channels=((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128)),
        encoder_paddings=((0, 0, 1), (0, 0, 1), (0, 0, [0, 1, 1]), (0, 0)),
        block_type='basicblock')
    num_voxels = 60
    coors = torch.stack([
        torch.zeros(num_voxels, dtype=torch.int32),
        torch.randint(0, 41, (num_voxels,), dtype=torch.int32),
        torch.randint(0, 32, (num_voxels,), dtype=torch.int32),
        torch.randint(0, 32, (num_voxels,), dtype=torch.int32),
    ], dim=1)
    coors = torch.unique(coors, dim=0)
    features = torch.randn(coors.shape[0], 5, requires_grad=True)
    bev = encoder(features, coors, batch_size=1)
    # spconv 2 keeps the upstream KRSC weight layout [out, kD, kH, kW, in]
    assert tuple(encoder.conv_input[0].weight.shape) == (16, 3, 3, 3, 5)
    assert bev.shape[:2] == (1, 256) and bev.shape[2:] == (4, 4)
    bev.sum().backward()
    assert features.grad is not None and torch.isfinite(features.grad).all()
    assert encoder.conv_input[0].weight.grad is not None


def test_environment_makes_openmp_threads_wait_passively():
    """tools/setup_env.sh's start-up line: spinning OpenMP threads made spconv 10x slower on shared cores."""
    env = {key: value for key, value in os.environ.items() if key != 'OMP_WAIT_POLICY'}
    policy = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get("OMP_WAIT_POLICY"))'], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    assert policy == 'PASSIVE'
