"""tools/kernel_registers.py: the tiled_bias kernels compile for sm_90 without a GPU and ptxas's report is read."""
import pytest

from projects.mmdet3d_plugin.apis.kernel_registers import RegisterReport, parse_ptxas
from tools import kernel_registers

PTXAS_OUTPUT = """ptxas info    : Compiling entry function '_forward_kernel' for 'sm_90a'
ptxas info    : Function properties for _forward_kernel
    48 bytes stack frame, 56 bytes spill stores, 44 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem"""


def test_ptxas_report_is_parsed():
    assert parse_ptxas(PTXAS_OUTPUT) == RegisterReport(255, 56, 44, 48)
    with pytest.raises(ValueError, match='ptxas printed no'):
        parse_ptxas('ptxas info    : Compiling entry function')


@pytest.mark.slow(seconds=10)
def test_the_backends_launches_compile_for_sm90(capsys):
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    rows = kernel_registers.main(['--kernels', 'forward', 'query_grad', '--dtypes', 'float32'])
    assert [(row['kernel'], row['dtype']) for row in rows] == [('forward', 'float32'), ('query_grad', 'float32')]
    assert all(0 < row['registers'] <= 255 and row['spill_store_bytes'] >= 0 for row in rows)
    from projects.mmdet3d_plugin.attention.backends.tiled_bias.launch import LAUNCH
    block_q, block_k, warps = LAUNCH['forward', 'float32']
    assert f'| forward | float32 | {block_q} x {block_k} | {warps} | yes |' in capsys.readouterr().out
