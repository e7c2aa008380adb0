"""tools/gpu_run.py without a GPU: the dry run lists every stage's commands, and each command parses with its
tool's options as on a CUDA machine."""
import importlib

import pytest
import torch

from projects.mmdet3d_plugin.diagnostics.gpu_run_stages import STAGES, stage_commands
from tools import gpu_run


def test_dry_run_lists_every_stage_in_order(capsys):
    assert gpu_run.main(['--dry-run', '--out', 'somewhere', '--trained', 'demo.py', 'demo.pth']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(':')[0] for line in lines] == [stage for stage in STAGES
                                                      for _ in stage_commands('o', 'd', 'w', ('c', 'p'))[stage]]
    assert any('--configs demo.py --checkpoint demo.pth' in line for line in lines)


def test_every_command_parses_with_its_tool_on_a_cuda_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)  # the tools refuse --device cuda without one
    commands = stage_commands(str(tmp_path), 'data/x', 'work_dirs/x',
                              trained=('configs/demo/cmt_aqr_synthetic_tiny.py', 'demo.pth'))
    assert list(commands) == list(STAGES)
    for stage, stage_commands_ in commands.items():
        for script, *args in stage_commands_:
            assert script.startswith('tools/') and script.endswith('.py'), script
            tool = importlib.import_module(script[:-len('.py')].replace('/', '.'))
            try:
                tool.parse_args(args)
            except SystemExit as error:
                pytest.fail(f'{stage}: {script} {args} does not parse (exit {error.code})')


def test_an_unknown_stage_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_run.main(['--dry-run', '--stages', 'check', 'everything'])
    assert "invalid choice: 'everything'" in capsys.readouterr().err
