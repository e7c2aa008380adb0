"""--launcher slurm: srun's task variables become torch.distributed's, with mmcv's rules for the master's address
and port (tests/tools/test_slurm.py runs tools/slurm_train.sh / slurm_test.sh on 2 CPU tasks)."""
import os

import pytest

from projects.mmdet3d_plugin.mmcv_custom.slurm_env import first_host, torch_env_from_slurm

TASK = dict(SLURM_PROCID='5', SLURM_NTASKS='16', SLURM_LOCALID='1', SLURM_NODELIST='gpu[07-08]', SLURM_NNODES='2')


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stand-in scontrol first on PATH that expands ``gpu[07-08]``; the file its arguments go to."""
    calls = tmp_path / 'calls'
    script = tmp_path / 'scontrol'
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nprintf "gpu07\\ngpu08\\n"\n')
    script.chmod(0o755)
    monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
    return calls


def test_srun_variables_become_rank_world_size_local_rank_and_the_first_host(scontrol):
    assert torch_env_from_slurm(TASK) == dict(RANK='5', WORLD_SIZE='16', LOCAL_RANK='1', MASTER_ADDR='gpu07',
                                              MASTER_PORT='29500')
    assert scontrol.read_text().split() == ['show', 'hostnames', 'gpu[07-08]']


def test_port_from_the_config_then_the_environment_and_a_set_master_address_is_kept(scontrol):
    assert torch_env_from_slurm(dict(TASK, MASTER_PORT='29611'))['MASTER_PORT'] == '29611'
    assert torch_env_from_slurm(dict(TASK, MASTER_PORT='29611'), port=29700)['MASTER_PORT'] == '29700'
    scontrol.unlink()
    assert torch_env_from_slurm(dict(TASK, MASTER_ADDR='10.0.0.1'))['MASTER_ADDR'] == '10.0.0.1'
    assert not scontrol.exists()  # scontrol is not asked


def test_clear_errors_outside_srun_and_without_scontrol(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match='missing: SLURM_LOCALID, SLURM_NODELIST'):
        torch_env_from_slurm(dict(SLURM_PROCID='0', SLURM_NTASKS='2'))
    monkeypatch.setenv('PATH', str(tmp_path))  # no scontrol
    with pytest.raises(RuntimeError, match='scontrol, which is not on PATH'):
        first_host('gpu[07-08]')
