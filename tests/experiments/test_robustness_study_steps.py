"""experiments/robustness_study.py with fake tools: the plan and its estimate, the commands, resuming, the report."""
import json
import os
import os.path as osp

import pytest

from mmcv import Config

from projects.mmdet3d_plugin.experiments.robustness_study import BUDGET_HOURS, RobustnessStudy, StudyOptions
from projects.mmdet3d_plugin.experiments.study_arms import LIE_STAGE2_CORRUPTIONS, STUDY_ARMS, study_arm, study_design

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CORRUPTIONS = ['clean', 'lidar_drop', 'object_drop:0.5']


class FakeTools:
    """Writes what each tool would: a checkpoint, a robustness.json, pictures; records every call."""

    def __init__(self, root, data_root):
        self.root, self.data_root = root, data_root
        self.commands, self.claims, self.processes = [], [], []

    def prepare_data(self):
        os.makedirs(self.data_root, exist_ok=True)

    def claim_work_dir(self, work_dir, cfg, seed):
        self.claims.append((work_dir, seed, cfg.runner.max_epochs, cfg.load_from))

    def train(self, arguments, processes):
        self.processes.append(processes)
        self.run(['tools/train.py'] + arguments)

    def run(self, command):
        self.commands.append(command)
        tool, options = command[0], dict(zip(command[1:], command[2:]))
        if tool == 'tools/train.py':
            work_dir = options['--work-dir']
            max_epochs = [c[2] for c in self.claims if c[0] == work_dir][-1]
            open(osp.join(self.root, work_dir, f'epoch_{max_epochs}.pth'), 'w').close()
        elif tool == 'tools/eval_robustness.py':
            corruptions = command[command.index('--corruptions') + 1:]
            score = 0.3 + 0.01 * len(self.commands)
            results = [dict(corruption=c, status='ok', mAP=score, NDS=score / 2, routing=options['--routing'],
                            objects=dict(affected_recall=0.5, false_positives_per_sample=1.0, router_accuracy=0.9))
                       for c in corruptions]
            os.makedirs(osp.join(self.root, options['--out']), exist_ok=True)
            with open(osp.join(self.root, options['--out'], 'robustness.json'), 'w') as f:
                json.dump(dict(routing=[options['--routing']], score_threshold=float(options['--score-thr']),
                               min_lidar_points=int(options['--min-lidar-points']),
                               attention_mass='--attention-mass' in command, results=results), f)
        elif tool == 'tools/visualize_aqr.py':
            os.makedirs(osp.join(self.root, options['--out']), exist_ok=True)
            for kind in ('bev', 'cameras', 'bias'):
                open(osp.join(self.root, options['--out'], f'sample0_{kind}.png'), 'w').close()
        else:
            raise AssertionError(f'unexpected tool {command}')


def _study(tmp_path, tools=None, arms=None, **changes):
    """A study of ``tmp_path`` with ``changes`` to its options, run by ``tools`` (new fake tools by default)."""
    options = dict(seeds=[0, 1], scenes=4, stage1_epochs=2, stage2_epochs=1, shared_stage1=False, image_drop=0.25,
                   lidar_drop=0.25, corruptions=list(CORRUPTIONS), data_root=str(tmp_path / 'data'),
                   work_dir=str(tmp_path / 'work'), out=str(tmp_path / 'out'), score_threshold=0.3,
                   min_lidar_points=5, picture_sample=0, command='python tools/robustness_study.py')
    options.update(changes)
    return RobustnessStudy(StudyOptions(**options), tools or FakeTools(REPO_ROOT, options['data_root']), REPO_ROOT,
                           arms)


@pytest.mark.slow(seconds=35)
def test_the_study_trains_evaluates_and_reports_every_arm_then_resumes(tmp_path, capsys):
    study = _study(tmp_path)
    tools = study.tools
    summary = study.run()
    work = str(tmp_path / 'work')
    trained = [c for c in tools.commands if c[0] == 'tools/train.py']
    # the single-sensor models and stage 1 of each seed from scratch, then the three stage-2 arms of each seed from
    # their seed's stage 1
    assert [c[c.index('--work-dir') + 1] for c in trained] == [
        f'{work}/seed{seed}/{name}' for seed in (0, 1)
        for name in ('lidar_only', 'camera_only', 'stage1', 'control', 'global_gate', 'aqr_targets')]
    assert [c[-1] for c in trained] == ['0'] * 6 + ['1'] * 6  # --seed
    # each with its config's data-parallel processes (make demo's recipe: 2; the camera-only model: 1)
    assert tools.processes == [2, 1, 2, 2, 2, 2] * 2
    scratch = ('stage1', 'lidar_only', 'camera_only')
    stage2_claims = [claim for claim in tools.claims if not claim[0].endswith(scratch)]
    assert len(stage2_claims) == 6
    assert all(claim[2:] == (1, f'{work}/seed{claim[1]}/stage1/epoch_2.pth') for claim in stage2_claims)
    assert all(claim[2:] == (2, None) for claim in tools.claims if claim[0].endswith(scratch))
    evaluations = [c for c in tools.commands if c[0] == 'tools/eval_robustness.py']
    assert len(evaluations) == 14
    # seed by seed: seed 0's seven evaluations come before seed 1's first training
    seed1_training = tools.commands.index(trained[6])
    assert [tools.commands.index(c) < seed1_training for c in evaluations] == [True] * 7 + [False] * 7
    oracle = evaluations[6]  # the final router's checkpoint (CMT-AQR's), the weights replaced by the truth
    assert oracle[1:3] == [f'{work}/seed0/aqr_targets/cmt_aqr_synthetic_tiny_passes.py',
                           f'{work}/seed0/aqr_targets/epoch_1.pth']
    assert oracle[oracle.index('--routing') + 1] == 'oracle' and oracle[oracle.index('--out') + 1].endswith(
        'seed0/aqr_targets/robustness_oracle')
    assert all('--object-metrics' in c and c[-len(CORRUPTIONS):] == CORRUPTIONS for c in evaluations)
    # the report: one row per corruption, every arm, differences from the control
    assert list(summary) == CORRUPTIONS
    assert list(summary['clean']['arms']) == [arm.name for arm in STUDY_ARMS]
    assert summary['clean']['minus_control']['aqr_targets']['mAP']['n'] == 2
    text = (tmp_path / 'out' / 'study.md').read_text()
    assert ('| corruption | LiDAR only | camera only | stage 1 | control | global gate | CMT-AQR | oracle |'
            in text)
    written = json.loads((tmp_path / 'out' / 'study.json').read_text())
    assert written['options']['seeds'] == [0, 1] and len(written['runs']['oracle']) == 2
    assert (tmp_path / 'out' / 'study_chart.png').exists()
    for corruption in study_design('failures').picture_corruptions:
        tag = corruption.replace(':', '_').replace('.', 'p')
        assert (tmp_path / 'out' / f'study_{tag}_bias.png').exists() and f'(study_{tag}_bias.png)' in text

    capsys.readouterr()
    count = len(tools.commands)
    _study(tmp_path, tools).run()
    out = capsys.readouterr().out
    assert len(tools.commands) == count, 'a second run reuses every step'
    assert '0.0 h left' in out and out.count('exists') == 12 and out.count('has every corruption') == 14


def test_shared_stage1_is_trained_and_evaluated_once(tmp_path):
    arms = [study_arm(name) for name in ('lidar_only', 'stage1', 'control', 'aqr_targets', 'oracle')]
    study = _study(tmp_path, arms=arms, shared_stage1=True)
    study.run()
    work = str(tmp_path / 'work')
    trained = [c[c.index('--work-dir') + 1] for c in study.tools.commands if c[0] == 'tools/train.py']
    assert trained == [f'{work}/seed0/lidar_only', f'{work}/seed0/stage1', f'{work}/seed0/control',
                       f'{work}/seed0/aqr_targets', f'{work}/seed1/control', f'{work}/seed1/aqr_targets']
    evaluated = [c[c.index('--out') + 1] for c in study.tools.commands if c[0] == 'tools/eval_robustness.py']
    # the arms trained from scratch once, the stage-2 arms and the oracle (of CMT-AQR's checkpoint) per seed
    assert evaluated == [f'{work}/seed0/lidar_only/robustness', f'{work}/seed0/stage1/robustness',
                         f'{work}/seed0/control/robustness', f'{work}/seed0/aqr_targets/robustness',
                         f'{work}/seed0/aqr_targets/robustness_oracle', f'{work}/seed1/control/robustness',
                         f'{work}/seed1/aqr_targets/robustness', f'{work}/seed1/aqr_targets/robustness_oracle']


def test_an_arm_that_evaluates_another_needs_that_arm(tmp_path):
    with pytest.raises(ValueError, match="arm oracle evaluates the checkpoint of 'aqr_targets', which is not an arm"):
        _study(tmp_path, arms=[study_arm(name) for name in ('stage1', 'control', 'oracle')])


def test_an_evaluation_with_other_object_metric_options_is_redone(tmp_path):
    arms = [study_arm(name) for name in ('stage1', 'control', 'aqr_targets', 'oracle')]
    study = _study(tmp_path, arms=arms, seeds=[0])
    study.run()
    tools = study.tools
    count = len(tools.commands)
    _study(tmp_path, tools, arms=arms, seeds=[0], score_threshold=0.5).run()
    assert len([c for c in tools.commands[count:] if c[0] == 'tools/eval_robustness.py']) == 4
    assert not [c for c in tools.commands[count:] if c[0] == 'tools/train.py']


def test_an_evaluation_without_the_attention_mass_is_redone(tmp_path):
    arms = [study_arm(name) for name in ('stage1', 'control')]
    study = _study(tmp_path, arms=arms, seeds=[0], attention_mass=False)
    study.run()
    tools = study.tools
    assert not any('--attention-mass' in c for c in tools.commands)
    count = len(tools.commands)
    _study(tmp_path, tools, arms=arms, seeds=[0]).run()
    redone = [c for c in tools.commands[count:] if c[0] == 'tools/eval_robustness.py']
    assert len(redone) == 2 and all('--attention-mass' in c for c in redone)


def test_default_plan_fits_the_budget_and_lists_every_step(tmp_path, capsys):
    default = dict(seeds=[0, 1, 2], scenes=150, stage1_epochs=12, stage2_epochs=4, corruptions=['clean'] + ['c'] * 10)
    study = _study(tmp_path, **default)
    steps = study.plan()
    # data, 3 x 6 trainings, 3 x 7 evaluations, pictures
    assert len(steps) == 1 + 18 + 21 + 1 and not any(step.done for step in steps)
    total = sum(step.minutes for step in steps)
    assert 180 < total <= BUDGET_HOURS * 60
    study.print_plan()
    out = capsys.readouterr().out
    assert f'estimated {total / 60:.1f} h' in out and 'exceeds' not in out
    shared = _study(tmp_path, shared_stage1=True, **default).plan()
    # the three models trained from scratch and their evaluations once; the oracle evaluates each seed's CMT-AQR
    assert len(shared) == 1 + 12 + 15 + 1 and sum(step.minutes for step in shared) < total - 100


def test_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match='at least one seed'):
        _study(tmp_path, seeds=[])
    with pytest.raises(ValueError, match='start with clean'):
        _study(tmp_path, corruptions=['lidar_drop', 'clean'])


@pytest.mark.slow(seconds=25)
def test_the_lie_study_trains_its_arms_on_the_lies_with_lie_targets_and_reports_apart(tmp_path):
    study = _study(tmp_path, design='lies', seeds=[0], shared_stage1=True,
                   corruptions=['clean', 'lidar_ghost:3', 'mixed_lie:120'])
    tools = study.tools
    study.run()
    work = str(tmp_path / 'work')
    trained = [c[c.index('--work-dir') + 1] for c in tools.commands if c[0] == 'tools/train.py']
    assert trained == [f'{work}/seed0/{name}' for name in ('stage1', 'control', 'global_gate', 'aqr_targets',
                                                              'aqr_mute')]
    routings = [c[c.index('--routing') + 1] for c in tools.commands if c[0] == 'tools/eval_robustness.py']
    assert routings == ['learned'] * 5 + ['oracle_lies']

    def config(name):
        cfg = Config.fromfile(f'{work}/seed0/{name}/' + osp.basename(study_arm(name, study.arms).config))
        train = cfg.data.train
        while 'pipeline' not in train:
            train = train.dataset
        corruptions = [step['corruptions'] for step in train.pipeline if step['type'] == 'RandomSensorCorruption']
        return cfg.model.pts_bbox_head.aqr_config, [(c['spec'], c['prob']) for c in corruptions[0]]

    mix = [(c['spec'], c['prob']) for c in LIE_STAGE2_CORRUPTIONS]
    control, gate, aqr, mute = (config(name) for name in ('control', 'global_gate', 'aqr_targets', 'aqr_mute'))
    assert control[1] == gate[1] == aqr[1] == mute[1] == mix
    assert not control[0].get('lie_targets') and gate[0].lie_targets and gate[0].granularity == 'sample'
    assert aqr[0].lie_targets and aqr[0].unmatched_loss_weight == 1.0 and mute[0] == aqr[0]
    text = (tmp_path / 'out' / 'study_lies.md').read_text()
    assert text.startswith('# Robustness study: does routing pay when sensors lie?')
    assert '| corruption | stage 1 | control | global gate | CMT-AQR | CMT-AQR mute | oracle |' in text
    assert 'lidar_ghost:3 0.1' in text and not (tmp_path / 'out' / 'study.md').exists()
    assert (tmp_path / 'out' / 'study_lies_mixed_lie_120_bias.png').exists()
