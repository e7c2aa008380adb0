"""experiments/tool_runner.py: how many processes train, the command that starts them, and a tool that fails."""
import sys

import pytest

from projects.mmdet3d_plugin.experiments import tool_runner
from projects.mmdet3d_plugin.experiments.tool_runner import run_tool, start_tool, train_command, training_processes


@pytest.mark.parametrize('requested, config_processes, cores, has_gpu, expected', [
    (None, 2, 2, False, 2),  # a 2-core laptop: the config's two single-threaded processes
    (None, 2, 16, False, 2),
    (None, 1, 16, False, 1),  # a config written for one process
    (None, 2, 1, False, 1),  # one core: nothing to share
    (None, 2, 8, True, 1),  # one process drives the GPU
    (1, 2, 8, False, 1),
    (3, 2, 1, False, 3),
])
def test_training_processes_follow_the_config_on_cpu_machines_only(requested, config_processes, cores, has_gpu,
                                                                   expected):
    assert training_processes(requested, config_processes, cores, has_gpu) == expected


def test_training_processes_refuse_a_count_below_one():
    with pytest.raises(SystemExit, match='--processes must be >= 1'):
        training_processes(0, 2, 8, False)


def test_train_command_launches_data_parallel_processes_with_the_cores_split_between_them():
    arguments = ['cfg.py', '--work-dir', 'w']
    assert train_command(arguments, 1, 8) == (['tools/train.py'] + arguments, {})
    command, env = train_command(arguments, 2, 8)
    assert command[:2] == ['-m', 'torch.distributed.run']
    assert command[command.index('--nproc_per_node') + 1] == '2'
    assert command[command.index('tools/train.py'):] == ['tools/train.py', '--launcher', 'pytorch'] + arguments
    assert env == dict(OMP_NUM_THREADS='4', MKL_NUM_THREADS='4')
    assert train_command(arguments, 2, 3)[1]['OMP_NUM_THREADS'] == '1'


def test_a_tool_runs_in_the_repository_root_with_the_environment_added_and_a_failure_stops_the_caller(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tool_runner, 'REPO_ROOT', str(tmp_path))
    (tmp_path / 'tool.py').write_text("import os, sys\nopen('ran', 'w').write(os.environ['DEMO_X'])\n"
                                      "sys.exit(int(sys.argv[1]))\n")
    run_tool(['tool.py', '0'], env=dict(DEMO_X='1'))
    assert (tmp_path / 'ran').read_text() == '1'
    assert '  $ DEMO_X=1 tool.py 0' in capsys.readouterr().out
    with pytest.raises(SystemExit, match='`tool.py 3` exited with code 3'):
        run_tool(['tool.py', '3'], env=dict(DEMO_X='2'))


def test_a_shell_tool_runs_under_bash_with_this_interpreter_as_python(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_runner, 'REPO_ROOT', str(tmp_path))
    (tmp_path / 'tool.sh').write_text('set -e\n"$PYTHON" -c "import sys; open(\'ran\', \'w\').write(sys.executable)"\n'
                                      'exit "$1"\n')
    assert start_tool(['tool.sh', '0']).wait() == 0
    assert (tmp_path / 'ran').read_text() == sys.executable
    assert start_tool(['tool.sh', '4']).wait() == 4
