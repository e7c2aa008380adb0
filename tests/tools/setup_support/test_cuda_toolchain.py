"""tools/setup_support/cuda_toolchain.py: the CUDA versions and compile jobs tools/cuda_build.py checks, without a GPU."""
import subprocess

import pytest

from tools.setup_support import cuda_toolchain
from tools.setup_support.cuda_toolchain import check_cuda_versions, max_jobs


@pytest.mark.parametrize('mode, has_gpu, torch_cuda, nvcc, driver, problem', [
    ('cuda', False, '13.0', '13.0', None, None),  # this project's build machines: nvcc, no GPU
    ('cuda', True, '13.0', '13.1', '13.2', None),
    ('cuda', True, '12.4', '12.8', '13.0', None),  # a newer driver runs older CUDA
    ('cuda', False, '13.0', '12.8', None, "nvcc's CUDA major"),
    ('cuda', True, '13.0', '13.0', '12.8', 'driver is older'),
    ('cpu', True, '13.0', None, '12.4', 'driver is older'),  # torch itself could not use the GPU
    ('cpu', False, '13.0', '12.8', None, None),  # the CPU build compiles nothing with nvcc
])
def test_cuda_versions_are_checked_before_installing(mode, has_gpu, torch_cuda, nvcc, driver, problem):
    if problem is None:
        check_cuda_versions(mode, has_gpu, torch_cuda, nvcc, driver)
        return
    with pytest.raises(ValueError, match=problem) as error:
        check_cuda_versions(mode, has_gpu, torch_cuda, nvcc, driver)
    assert f'torch {torch_cuda}, nvcc {nvcc or "absent"}, driver {driver or "absent"}' in str(error.value)


def test_tool_versions_are_read_from_their_output(monkeypatch):
    monkeypatch.setattr(cuda_toolchain.shutil, 'which', lambda name: f'/usr/bin/{name}')
    outputs = {'nvcc': 'Cuda compilation tools, release 13.0, V13.0.88\n',
               'nvidia-smi': '| NVIDIA-SMI 580.95   Driver Version: 580.95   CUDA Version: 13.0     |\n'}
    run = lambda command, **kwargs: subprocess.CompletedProcess(command, 0, outputs[command[0]], '')  # noqa: E731
    assert cuda_toolchain.nvcc_cuda(run) == '13.0' and cuda_toolchain.driver_cuda(run) == '13.0'
    monkeypatch.setattr(cuda_toolchain.shutil, 'which', lambda name: None)
    assert cuda_toolchain.nvcc_cuda(run) is None and cuda_toolchain.driver_cuda(run) is None


def test_compile_jobs_are_bounded_by_cores_and_memory(tmp_path):
    assert max_jobs('cuda', 64, 100.0) == 25 and max_jobs('cpu', 64, 100.0) == 64
    assert max_jobs('cuda', 2, 100.0) == 2 and max_jobs('cuda', 8, None) == 8 and max_jobs('cuda', 8, 1.0) == 1
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text('MemTotal:       24000000 kB\nMemAvailable:   8388608 kB\n')
    assert cuda_toolchain.available_memory_gb(str(meminfo)) == 8.0
    assert cuda_toolchain.available_memory_gb(str(tmp_path / 'missing')) is None


def test_gpu_visible_reads_nvidia_smi(monkeypatch):
    monkeypatch.setattr(cuda_toolchain.shutil, 'which', lambda name: f'/usr/bin/{name}')
    listing = 'GPU 0: NVIDIA H200 (UUID: GPU-1)\n'
    found = lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, listing, '')  # noqa: E731
    failed = lambda *args, **kwargs: subprocess.CompletedProcess(args, 9, '', 'NVIDIA-SMI has failed')  # noqa: E731
    assert cuda_toolchain.gpu_visible(found) and not cuda_toolchain.gpu_visible(failed)
    monkeypatch.setattr(cuda_toolchain.shutil, 'which', lambda name: None)
    assert not cuda_toolchain.gpu_visible(found)
