"""tools/kernel_registers.py: the tiled_bias kernels compile for sm_90 without a GPU, ptxas's report is read and
the instructions of a kernel's loop are counted."""
import pytest

from projects.mmdet3d_plugin.diagnostics.kernel_registers import RegisterReport, loop_instructions, parse_ptxas
from tools import kernel_registers

PTXAS_OUTPUT = """ptxas info    : Compiling entry function '_forward_kernel' for 'sm_90a'
ptxas info    : Function properties for _forward_kernel
    48 bytes stack frame, 56 bytes spill stores, 44 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem"""


def test_ptxas_report_is_parsed():
    assert parse_ptxas(PTXAS_OUTPUT) == RegisterReport(255, 56, 44, 48)
    with pytest.raises(ValueError, match='ptxas printed no'):
        parse_ptxas('ptxas info    : Compiling entry function')

#: nvdisasm -c output: a short loop (.L_x_1, 3 instructions and a NOP) nested before a larger one (.L_x_0, 7 and
#: 2 NOPs), a forward branch and a branch to itself after the exit
SASS = """        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   NOP ;
.L_x_1:
        /*0030*/                   FADD R3, R2, R3 ;
        /*0040*/                   NOP ;
        /*0050*/                   ISETP.GE.AND P0, PT, R3, RZ, PT ;
        /*0060*/               @P0 BRA `(.L_x_1) ;
        /*0070*/               @P1 BRA `(.L_x_2) ;
        /*0080*/                   NOP ;
        /*0090*/                   FMUL R5, R3, R3 ;
.L_x_2:
        /*00a0*/               @P2 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
.L_x_3:
        /*00c0*/                   BRA `(.L_x_3);
"""


def test_the_largest_loop_is_counted_without_nops():
    assert loop_instructions(SASS) == 7
    assert loop_instructions(SASS.split('.L_x_2:')[0]) == 3, 'the inner loop alone'
    assert loop_instructions('        /*0000*/                   EXIT ;') == 0


@pytest.mark.slow(seconds=10)
def test_the_backends_launches_compile_for_sm90(capsys):
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    rows = kernel_registers.main(['--kernels', 'forward', 'query_grad', '--dtypes', 'float32'])
    assert [(row['kernel'], row['dtype']) for row in rows] == [('forward', 'float32'), ('query_grad', 'float32')]
    assert all(0 < row['registers'] <= 255 and row['spill_store_bytes'] >= 0 for row in rows)
    assert all(row['loop_instructions'] > 100 and row['instructions_per_score'] > 0 for row in rows)
    from projects.mmdet3d_plugin.attention.backends.tiled_bias.launch import LAUNCH
    block_q, block_k, warps = LAUNCH['forward', 'float32']
    assert f'| forward | float32 | {block_q} x {block_k} | {warps} | yes |' in capsys.readouterr().out
