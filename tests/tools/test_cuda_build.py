"""The choices of ``tools/setup_env.sh``'s CPU / CUDA mode (``tools/cuda_build.py``), decided without a GPU."""
import subprocess
import sys

import pytest

from tools import cuda_build
from tools.cuda_build import build_mode, check_cuda_versions, max_jobs, spconv_requirement


@pytest.mark.parametrize('requested, has_nvcc, has_gpu, expected', [
    ('auto', False, False, 'cpu'),
    ('auto', True, False, 'cpu'),  # a CPU machine with the CUDA toolkit (this project's CI) keeps the CPU build
    ('auto', False, True, 'cpu'),  # no compiler for mmcv's CUDA ops
    ('auto', True, True, 'cuda'),
    ('cpu', True, True, 'cpu'),
    ('cuda', True, False, 'cuda'),
])
def test_build_mode(requested, has_nvcc, has_gpu, expected):
    mode, why = build_mode(requested, has_nvcc, has_gpu)
    assert mode == expected and why


def test_build_mode_refuses_cuda_without_nvcc_and_unknown_devices():
    with pytest.raises(ValueError, match='needs nvcc'):
        build_mode('cuda', False, True)
    with pytest.raises(ValueError, match="one of \\['auto', 'cpu', 'cuda'\\]"):
        build_mode('gpu', True, True)


@pytest.mark.parametrize('torch_cuda, expected', [
    ('13.0', 'spconv-cu126'),  # no CUDA 13 build; cu126 ran with torch 2.11+cu130 on an H200
    ('12.8', 'spconv-cu126'),
    ('12.6', 'spconv-cu126'),
    ('12.4', 'spconv-cu124'),
    ('12.2', 'spconv-cu121'),
    ('11.8', 'spconv-cu118'),
])
def test_spconv_build_is_the_newest_not_newer_than_torchs_cuda(torch_cuda, expected):
    assert spconv_requirement('cuda', torch_cuda) == f'{expected}=={cuda_build.SPCONV_VERSION}'


def test_spconv_cpu_build_and_refusals():
    assert spconv_requirement('cpu', '13.0') == f'spconv=={cuda_build.SPCONV_VERSION}'
    with pytest.raises(ValueError, match='CUDA build of torch'):
        spconv_requirement('cuda', '')
    with pytest.raises(ValueError, match='older than every spconv'):
        spconv_requirement('cuda', '11.3')


def test_a_gpu_without_nvcc_gets_cuda_spconv_with_cpu_mmcv_ops():
    mode, why = build_mode('auto', has_nvcc=False, has_gpu=True)
    assert mode == 'cpu' and 'mmcv.ops' in why and 'CMT_AQR_DEVICE=cuda' in why
    assert spconv_requirement(mode, '13.0', has_gpu=True) == f'spconv-cu126=={cuda_build.SPCONV_VERSION}'
    assert spconv_requirement(mode, '', has_gpu=True) == f'spconv=={cuda_build.SPCONV_VERSION}', 'a CPU torch'


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
    monkeypatch.setattr(cuda_build.shutil, 'which', lambda name: f'/usr/bin/{name}')
    outputs = {'nvcc': 'Cuda compilation tools, release 13.0, V13.0.88\n',
               'nvidia-smi': '| NVIDIA-SMI 580.95   Driver Version: 580.95   CUDA Version: 13.0     |\n'}
    run = lambda command, **kwargs: subprocess.CompletedProcess(command, 0, outputs[command[0]], '')  # noqa: E731
    assert cuda_build.nvcc_cuda(run) == '13.0' and cuda_build.driver_cuda(run) == '13.0'
    monkeypatch.setattr(cuda_build.shutil, 'which', lambda name: None)
    assert cuda_build.nvcc_cuda(run) is None and cuda_build.driver_cuda(run) is None


def test_compile_jobs_are_bounded_by_cores_and_memory(tmp_path):
    assert max_jobs('cuda', 64, 100.0) == 25 and max_jobs('cpu', 64, 100.0) == 64
    assert max_jobs('cuda', 2, 100.0) == 2 and max_jobs('cuda', 8, None) == 8 and max_jobs('cuda', 8, 1.0) == 1
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text('MemTotal:       24000000 kB\nMemAvailable:   8388608 kB\n')
    assert cuda_build.available_memory_gb(str(meminfo)) == 8.0
    assert cuda_build.available_memory_gb(str(tmp_path / 'missing')) is None


def test_gpu_visible_reads_nvidia_smi(monkeypatch):
    monkeypatch.setattr(cuda_build.shutil, 'which', lambda name: f'/usr/bin/{name}')
    listing = 'GPU 0: NVIDIA H200 (UUID: GPU-1)\n'
    found = lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, listing, '')  # noqa: E731
    failed = lambda *args, **kwargs: subprocess.CompletedProcess(args, 9, '', 'NVIDIA-SMI has failed')  # noqa: E731
    assert cuda_build.gpu_visible(found) and not cuda_build.gpu_visible(failed)
    monkeypatch.setattr(cuda_build.shutil, 'which', lambda name: None)
    assert not cuda_build.gpu_visible(found)


def test_script_prints_the_line_setup_env_reads():
    """``setup_env.sh`` runs the file with the bare interpreter, before the stack is installed."""
    result = subprocess.run([sys.executable, cuda_build.__file__, '--device', 'cuda', '--torch-cuda', '12.4'],
                            capture_output=True, text=True, env={'PATH': '/nonexistent'})
    assert result.returncode == 2 and 'needs nvcc' in result.stderr, 'no nvcc on this PATH'
    result = subprocess.run([sys.executable, cuda_build.__file__, '--device', 'cpu'], capture_output=True, text=True)
    fields = result.stdout.split()
    assert result.returncode == 0 and fields[:3] == ['cpu', f'spconv=={cuda_build.SPCONV_VERSION}', '0']
    assert int(fields[3]) >= 1, 'compile jobs'
