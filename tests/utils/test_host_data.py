"""Host data on a device without a synchronisation: the cached constants, the copies and their counter, the recorder
of ops that would wait on CUDA."""
import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.utils.host_data import (HostCopyCounter, SyncingOpRecorder, device_constant,
                                                    device_table, host_to_device, permitted_host_sync)


def test_device_constant_is_made_once_per_values_dtype_and_device():
    first = device_constant([1.0, 2.5, -3.0], 'cpu', torch.float32)
    assert first is device_constant((1.0, 2.5, -3.0), torch.device('cpu'), torch.float32)
    assert first is not device_constant([1.0, 2.5, -3.0], 'cpu', torch.float64)
    assert first.tolist() == [1.0, 2.5, -3.0] and first.dtype == torch.float32
    assert device_constant(np.array([[1, 2], [3, 4]]), 'cpu', torch.long).tolist() == [[1, 2], [3, 4]]


def test_a_table_is_made_once_per_name_and_device_and_every_time_when_fake():
    made = []

    def make():
        made.append(1)
        return np.arange(6, dtype=np.int32).reshape(2, 3)

    first = device_table(('test table', 2, 3), make, 'cpu')
    assert first is device_table(('test table', 2, 3), make, torch.device('cpu')) and len(made) == 1
    assert first.dtype == torch.int32 and first.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert device_table(('test table', 3, 2), make) is not first and len(made) == 2
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [device_table(('test table', 2, 3), make, 'cuda') for _ in range(2)]
    assert fakes[0] is not fakes[1] and fakes[0].device.type == 'cuda' and len(made) == 4


def test_under_fake_tensor_mode_on_the_cpu_a_constant_is_fake_and_not_cached():
    """The fake-mode check must see a ``FakeTensorMode`` on any device, not only a CUDA device without a GPU."""
    values = [4.0, 5.0, 6.5]
    with FakeTensorMode():
        fake = device_constant(values, 'cpu', torch.float32)
    assert type(fake).__name__ == 'FakeTensor'
    real = device_constant(values, 'cpu', torch.float32)
    assert type(real) is torch.Tensor and real.tolist() == values


def test_a_constant_first_made_under_inference_mode_serves_training():
    """An inference tensor cannot be saved for backward: the cache must not hand one to a training step."""
    with torch.inference_mode():
        device_constant([0.5, 2.0, 7.0], 'cpu', torch.float32)
    weight = torch.ones(3, requires_grad=True)
    (weight * device_constant([0.5, 2.0, 7.0], 'cpu', torch.float32)).sum().backward()
    assert weight.grad.tolist() == [0.5, 2.0, 7.0]


def test_host_to_device_keeps_values_and_dtype():
    matrices = np.random.rand(2, 6, 4, 4)
    copied = host_to_device(matrices.astype(np.float32), 'cpu')
    assert copied.dtype == torch.float32 and np.array_equal(copied.numpy(), matrices.astype(np.float32))
    assert host_to_device([[True, False]], None, torch.bool).tolist() == [[True, False]]


def test_the_counter_sees_blocking_host_copies_and_not_the_asynchronous_ones():
    with FakeTensorMode(allow_non_fake_inputs=True):
        with HostCopyCounter() as counter:
            torch.tensor([1, 2, 3], device='cuda')
            torch.zeros(2, device='cuda').new_tensor([1.0, 2.0])
            torch.from_numpy(np.ones(3)).to('cuda')
            torch.zeros(3, device='cuda').copy_(torch.ones(3))
        assert len(counter.copies) == 4, counter.copies
        with HostCopyCounter() as counter:
            host_to_device(np.ones((2, 3)), torch.device('cuda'), torch.float32)
            device_constant([1.0, 2.0], torch.device('cuda'), torch.float32)
            torch.arange(4, device='cuda') * 2
        assert counter.copies == []


def test_permitted_host_sync_without_cuda_does_nothing():
    with permitted_host_sync():
        assert torch.ones(2).sum().item() == 2.0


def test_syncing_op_recorder_records_what_waits_on_cuda_outside_permitted_regions():
    x = torch.randn(5, 3, requires_grad=True)
    selected = x[x[:, 0] > -10]  # boolean index: its backward runs nonzero
    with SyncingOpRecorder() as recorder:
        selected.sum().backward()
        x.sum().item()
        torch.repeat_interleave(torch.tensor([1, 2]))
        torch.repeat_interleave(x, 2, dim=0)  # a number of repeats: no count to read
        x[torch.tensor([0, 2])].sum()  # integer index
        with permitted_host_sync():
            x.sum().item()
    assert [op.split(' at ')[0] for op in recorder.ops] == [
        'aten.index_put.default [boolean index]', 'aten._local_scalar_dense.default', 'aten.repeat_interleave.Tensor']
    assert all(__file__ in op or 'IndexBackward0' in op for op in recorder.ops)


def test_syncing_op_recorder_counts_only_its_device():
    with SyncingOpRecorder('cuda') as recorder:
        torch.ones(3).sum().item()  # a host tensor: no wait on CUDA
    assert recorder.ops == []
