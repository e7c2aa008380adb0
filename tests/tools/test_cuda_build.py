"""The choices of ``tools/setup_env.sh``'s CPU / CUDA mode (``tools/cuda_build.py``), decided without a GPU."""
import subprocess
import sys

import pytest

from tools import cuda_build
from tools.cuda_build import build_mode, spconv_requirement


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


def test_script_prints_the_line_setup_env_reads():
    """``setup_env.sh`` runs the file with the bare interpreter, before the stack is installed."""
    result = subprocess.run([sys.executable, cuda_build.__file__, '--device', 'cuda', '--torch-cuda', '12.4'],
                            capture_output=True, text=True, env={'PATH': '/nonexistent'})
    assert result.returncode == 2 and 'needs nvcc' in result.stderr, 'no nvcc on this PATH'
    result = subprocess.run([sys.executable, cuda_build.__file__, '--device', 'cpu'], capture_output=True, text=True)
    fields = result.stdout.split()
    assert result.returncode == 0 and fields[:3] == ['cpu', f'spconv=={cuda_build.SPCONV_VERSION}', '0']
    assert int(fields[3]) >= 1, 'compile jobs'
