"""tools/slurm_train.sh and tools/slurm_test.sh on one machine: a stand-in ``srun`` starts the tasks as slurm does.

The stand-in (written into a ``bin`` folder put first on ``PATH``) records its options and starts ``--ntasks``
copies of the command, each with the variables srun sets (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
``SLURM_NODELIST``, ...); a stand-in ``scontrol`` expands the node list to 127.0.0.1. ``--launcher slurm`` then
starts a gloo group on the CPU (projects/mmdet3d_plugin/mmcv_custom/slurm_env.py). Training uses
``--autoscale-lr``: the learning rate of 2 processes is the config's x 2 / 8.
"""
import json
import os
import sys

import pytest
from mmcv import Config

FAKE_SRUN = '''#!{python}
import json, os, subprocess, sys
args, options = sys.argv[1:], {{}}
while args[0].startswith('-'):
    option = args.pop(0)
    name, value = option.split('=', 1) if '=' in option else (option, args.pop(0) if option == '-p' else True)
    options[name] = value
with open(os.environ['FAKE_SRUN_RECORD'], 'w') as file:
    json.dump(dict(options=options, command=args), file)
ntasks, per_node = int(options['--ntasks']), int(options['--ntasks-per-node'])
tasks = [subprocess.Popen(args, env=dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node),
                                         SLURM_NODEID=str(rank // per_node), SLURM_NTASKS=str(ntasks),
                                         SLURM_NNODES=str(-(-ntasks // per_node)), SLURM_NODELIST='localhost',
                                         SLURM_JOB_NAME=options['--job-name'], SLURM_JOB_ID='1'))
         for rank in range(ntasks)]
sys.exit(max(task.wait() for task in tasks))
'''


@pytest.fixture
def slurm_env(tmp_path, tools_cli) -> dict:
    """The environment of a 2-task job on this machine: stand-in srun and scontrol first on PATH."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / 'scontrol').write_text('#!/bin/sh\necho 127.0.0.1\n')
    for name in ('srun', 'scontrol'):
        (bin_dir / name).chmod(0o755)
    return dict(PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}', FAKE_SRUN_RECORD=str(tmp_path / 'srun.json'),
                GPUS='2', GPUS_PER_NODE='2', CPUS_PER_TASK='1', SRUN_ARGS='--exclusive --comment=cmt', PYTHON=sys.executable,
                MASTER_PORT=str(tools_cli.free_port()), CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')


@pytest.mark.slow(seconds=50)
def test_slurm_train_then_slurm_test_on_two_cpu_tasks(synthetic_nuscenes, tools_cli, slurm_env, tmp_path):
    cfg = tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_synthetic_tiny.py', slim=True)
    cfg.data.train.load_interval = 2  # one sample, padded to one per process
    config = str(tmp_path / 'cmt_slim.py')
    cfg.dump(config)
    work_dir = tmp_path / 'work'

    out = tools_cli.run(['bash', 'tools/slurm_train.sh', 'cpu_partition', 'cmt_job', config, str(work_dir),
                         '--autoscale-lr', '--no-validate'], timeout=400, env=slurm_env)
    srun = json.loads((tmp_path / 'srun.json').read_text())
    assert srun['options']['-p'] == 'cpu_partition' and srun['options']['--job-name'] == 'cmt_job'
    assert srun['options']['--ntasks'] == srun['options']['--ntasks-per-node'] == '2'
    assert srun['options']['--exclusive'] is True and srun['options']['--comment'] == 'cmt'  # SRUN_ARGS
    assert srun['command'][-4:] == [f'--work-dir={work_dir}', '--launcher=slurm', '--autoscale-lr', '--no-validate']
    assert 'Distributed training: True, device: cpu' in out
    assert f'--autoscale-lr: lr {cfg.optimizer.lr} x 2 processes / 8' in out
    assert Config.fromfile(str(work_dir / 'cmt_slim.py')).optimizer.lr == pytest.approx(cfg.optimizer.lr * 2 / 8)
    assert (work_dir / 'epoch_1.pth').is_file()

    out = tools_cli.run(['bash', 'tools/slurm_test.sh', 'cpu_partition', 'cmt_test', config,
                         str(work_dir / 'epoch_1.pth'), '--eval', 'bbox', '--work-dir', str(tmp_path / 'test')],
                        timeout=400, env=slurm_env)
    assert 'distributed: True' in out and 'NDS' in out
