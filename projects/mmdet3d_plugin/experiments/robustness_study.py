"""The robustness studies (``tools/robustness_study.py``, ``make study``): does routing pay when sensors fail or lie?

Steps of a study design (:data:`.study_arms.STUDY_DESIGNS`), each skipped when its output is there (a second run
continues):

1. the synthetic data set (the tool's ``StudyTools.prepare_data``);
2. per seed, every trained arm of the design: stage 1
   from scratch (once, of the first seed, with ``shared_stage1``), the
   stage-2 arms from it (``tools/train.py``);
3. per seed, right after its trainings (so that a study stopped half-way has
   whole seeds), every arm evaluated clean and under every corruption, with the
   object metrics (``tools/eval_robustness.py --object-metrics``; the oracle:
   CMT-AQR's checkpoint with ``--routing oracle``);
4. AQR routing pictures of one validation sample of the first seed's
   :data:`PICTURE_ARM` (``tools/visualize_aqr.py``);
5. ``<report>.md``, ``<report>.json`` and the chart (:mod:`.study_report`).

The repository's tools run as processes through a :class:`StudyTools`
given by the caller, so this module never imports ``tools/``.
"""
import glob
import os
import os.path as osp
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence

import mmcv
from mmcv import Config

from ..datasets.corruption_config import describe_corruptions
from .study_arms import StudyArm, arm_config, checkpoint_arm, study_arm, study_design
from .study_report import Runs, bar_chart, degradation_lines, markdown_report, per_seed_lines, summarise

#: The arm every stage-2 arm starts from.
STAGE1 = 'stage1'
#: The arm whose routing is drawn (under its design's ``picture_corruptions``).
PICTURE_ARM = 'aqr_targets'
TOTAL_STEPS = 5
#: The time model of :meth:`RobustnessStudy.plan`: minutes per training epoch and per evaluated corruption of a
#: study of :data:`REFERENCE_SCENES` scenes on 2 CPU cores (tool start-up included), scaled with the scenes; the
#: data set and a routing picture are guesses. A step takes at least a tool's start-up.
REFERENCE_SCENES = 150
EPOCH_MINUTES = 1.55
CORRUPTION_MINUTES = 0.155
DATA_MINUTES = 3.0
PICTURE_MINUTES = 0.5
STARTUP_MINUTES = 0.25
#: The study's time budget (three seeds of seven arms, three of them trained from scratch): the plan warns above it.
BUDGET_HOURS = 4.5


@dataclass
class StudyOptions:
    """What a study run is (``tools/robustness_study.py``'s options).

    Attributes:
        seeds (list[int]): training seeds; the report's spread is over them.
        scenes (int): synthetic scenes of 2 samples, a fifth for validation.
        stage1_epochs (int): epochs of stage 1.
        stage2_epochs (int): epochs of every stage-2 arm (the control included).
        shared_stage1 (bool): one stage 1 (of the first seed) for every seed.
        image_drop (float): ``ModalMask3D``: probability that a training sample loses its images.
        lidar_drop (float): ``ModalMask3D``: probability that it loses its points instead.
        corruptions (list[str]): ``clean`` first, then the corruption specs.
        data_root (str): the synthetic set.
        work_dir (str): checkpoints, evaluations, pictures.
        out (str): the report folder.
        score_threshold (float): lowest score of a detection counted by the object metrics.
        min_lidar_points (int): points a box must hold for LiDAR to see its object.
        picture_sample (int): validation sample of the routing pictures.
        command (str): the command line, for the report.
        attention_mass (bool): the object metrics include the fused cross-attention's mass on the dead sensor's
            keys (``tools/eval_robustness.py --attention-mass``).
        design (str): the study design (:data:`.study_arms.STUDY_DESIGNS`).
    """

    seeds: List[int]
    scenes: int
    stage1_epochs: int
    stage2_epochs: int
    shared_stage1: bool
    image_drop: float
    lidar_drop: float
    corruptions: List[str]
    data_root: str
    work_dir: str
    out: str
    score_threshold: float
    min_lidar_points: int
    picture_sample: int
    command: str
    attention_mass: bool = True
    design: str = 'failures'


class StudyTools(Protocol):
    """How the study runs the repository's tools (given by ``tools/robustness_study.py``)."""

    def prepare_data(self) -> None:
        """Generate the synthetic set and its info files (skipped when they are there)."""

    def run(self, command: List[str]) -> None:
        """Run a tool (``['tools/eval_robustness.py', ...]``) from the repository root; stop the study if it fails."""

    def train(self, arguments: List[str], processes: int) -> None:
        """Run ``tools/train.py arguments`` in up to ``processes`` data-parallel processes (a config's
        ``demo_processes``: its recipe's batch); stop the study if it fails."""

    def claim_work_dir(self, work_dir: str, cfg: Config, seed: int) -> None:
        """Mark ``work_dir`` as the run of ``cfg`` and ``seed``; stop the study if it holds another run."""


@dataclass
class StudyStep:
    """One step of the plan: what it does, its estimated minutes and whether its output is already there."""

    text: str
    minutes: float
    done: bool


class RobustnessStudy:
    """One study run: where everything goes, the plan, and the steps (see the module docstring).

    Args:
        options (StudyOptions): the run.
        tools (StudyTools): runs the repository's tools.
        repo_root (str): the folder the tools run in; relative paths of ``options`` are relative to it.
        arms (Sequence[StudyArm], optional): the arms, in table order. Default: all of the design's.
    """

    def __init__(self, options: StudyOptions, tools: StudyTools, repo_root: str,
                 arms: Optional[Sequence[StudyArm]] = None) -> None:
        if not options.seeds:
            raise ValueError('the study needs at least one seed')
        if options.corruptions[:1] != ['clean']:
            raise ValueError(f'the corruptions must start with clean (the object metrics compare with it), got '
                             f'{options.corruptions}')
        self.design = study_design(options.design)
        arms = self.design.arms if arms is None else arms
        names = [arm.name for arm in arms]
        for arm in arms:
            if not arm.is_trained and arm.evaluates not in names:
                raise ValueError(f'arm {arm.name} evaluates the checkpoint of {arm.evaluates!r}, which is not an arm '
                                 f'of this study ({names})')
        self.options = options
        self.tools = tools
        self.repo_root = repo_root
        self.arms = tuple(arms)

    @property
    def draws_pictures(self) -> bool:
        """Whether the study has :data:`PICTURE_ARM` to draw."""
        return any(arm.name == PICTURE_ARM for arm in self.arms)

    # ------------------------------------------------------------------ where things go
    def path(self, *parts: str) -> str:
        """``parts`` joined under the repository root (for reading and writing here)."""
        return osp.join(self.repo_root, *parts)

    def train_dir(self, arm: StudyArm, seed: int) -> str:
        """The work dir of ``arm``'s training for ``seed`` (an arm without training: that of the arm it evaluates;
        with ``shared_stage1`` every arm trained from scratch is trained once, for the first seed)."""
        arm = checkpoint_arm(arm, self.arms)
        if arm.training == 'stage2':
            return osp.join(self.options.work_dir, f'seed{seed}', arm.name)
        scratch_seed = self.options.seeds[0] if self.options.shared_stage1 else seed
        return osp.join(self.options.work_dir, f'seed{scratch_seed}', arm.name)

    def epochs(self, arm: StudyArm) -> int:
        """The epochs of ``arm``'s training (an arm without training: those of the arm it evaluates)."""
        arm = checkpoint_arm(arm, self.arms)
        return self.options.stage2_epochs if arm.training == 'stage2' else self.options.stage1_epochs

    def checkpoint(self, arm: StudyArm, seed: int) -> str:
        return osp.join(self.train_dir(arm, seed), f'epoch_{self.epochs(arm)}.pth')

    def config_path(self, arm: StudyArm, seed: int) -> str:
        """The config its training dumped (an arm without training: that of the arm it evaluates)."""
        return osp.join(self.train_dir(arm, seed), osp.basename(checkpoint_arm(arm, self.arms).config))

    def picture_dir(self, corruption: str) -> str:
        """Where ``tools/visualize_aqr.py`` draws :data:`PICTURE_ARM` (first seed) under ``corruption``."""
        return osp.join(self.train_dir(study_arm(PICTURE_ARM, self.arms), self.options.seeds[0]), 'pictures',
                        picture_tag(corruption))

    def evaluation_dir(self, arm: StudyArm, seed: int) -> str:
        suffix = '' if arm.test_routing == 'learned' else f'_{arm.test_routing}'
        return osp.join(self.train_dir(arm, seed), f'robustness{suffix}')

    # ------------------------------------------------------------------ the plan
    def _estimate(self, minutes: float) -> float:
        """A step's minutes from its minutes with :data:`REFERENCE_SCENES` scenes."""
        return max(STARTUP_MINUTES, minutes * self.options.scenes / REFERENCE_SCENES)

    def plan(self) -> List[StudyStep]:
        """Every step of the study in order (shared steps once), with its estimate and whether it is done."""
        options = self.options
        steps = {'data': StudyStep(f'data: {options.scenes} synthetic scenes in {options.data_root}',
                                   self._estimate(DATA_MINUTES), False)}
        for seed in options.seeds:
            for arm in self.arms:
                if not arm.is_trained:
                    continue
                steps.setdefault(self.checkpoint(arm, seed), StudyStep(
                    f'train {arm.name} ({_epochs(self.epochs(arm))}) -> {self.train_dir(arm, seed)}',
                    self._estimate(self.epochs(arm) * EPOCH_MINUTES),
                    osp.exists(self.path(self.checkpoint(arm, seed)))))
            for arm in self.arms:
                out_dir = self.evaluation_dir(arm, seed)
                steps.setdefault(out_dir, StudyStep(
                    f'evaluate {arm.name} ({arm.test_routing} routing, {len(options.corruptions)} runs) -> {out_dir}',
                    self._estimate(len(options.corruptions) * CORRUPTION_MINUTES), self._evaluated(out_dir, arm)))
        if self.draws_pictures:
            steps['pictures'] = StudyStep(
                f'routing pictures of {PICTURE_ARM}, seed {options.seeds[0]}',
                len(self.design.picture_corruptions) * self._estimate(PICTURE_MINUTES),
                all(glob.glob(self.path(self.picture_dir(corruption), '*.png'))
                    for corruption in self.design.picture_corruptions))
        return list(steps.values())

    def print_plan(self) -> None:
        """Print the steps with their estimates, the total and what is left."""
        steps = self.plan()
        total = sum(step.minutes for step in steps)
        left = sum(step.minutes for step in steps if not step.done)
        print(f'[study] plan: seeds {" ".join(map(str, self.options.seeds))} x {len(self.arms)} arms, '
              f'{len(self.options.corruptions)} runs per evaluation; estimated {total / 60:.1f} h on 2 CPU cores, '
              f'{left / 60:.1f} h left', flush=True)
        for step in steps:
            print(f'  {"done" if step.done else f"{step.minutes:5.1f} min"}  {step.text}', flush=True)
        if total > BUDGET_HOURS * 60:
            print(f'[study] the estimate exceeds the study\'s budget of {BUDGET_HOURS} h: fewer seeds, '
                  f'--shared-stage1 or fewer --scenes', flush=True)

    # ------------------------------------------------------------------ the steps
    def banner(self, step: int, text: str) -> None:
        print(f'\n[study {step}/{TOTAL_STEPS}] {text}', flush=True)

    def record_seconds(self, step: str, seconds: float) -> None:
        """Keep a finished step's wall time in ``<work dir>/.study_seconds.json`` (a step run again keeps its
        longest time), so that a resumed study reports its whole time."""
        path = self.path(self.options.work_dir, '.study_seconds.json')
        times = mmcv.load(path) if osp.exists(path) else {}
        times[step] = max(seconds, times.get(step, 0.0))
        os.makedirs(osp.dirname(path), exist_ok=True)
        mmcv.dump(times, path)

    def total_minutes(self) -> float:
        """The wall time of every step the study ran, over all its invocations."""
        path = self.path(self.options.work_dir, '.study_seconds.json')
        return sum(mmcv.load(path).values()) / 60 if osp.exists(path) else 0.0

    def _timed(self, step: str, action: Callable[[], None]) -> None:
        """Run ``action`` and keep its wall time as ``step``'s (:meth:`record_seconds`)."""
        start = time.time()
        action()
        self.record_seconds(step, time.time() - start)

    def train(self, arm: StudyArm, seed: int) -> str:
        """Train ``arm`` for ``seed`` (stage 2 from the stage-1 checkpoint); its checkpoint.

        Skipped when the checkpoint exists, resumed when interrupted; the work dir is claimed for the config
        and seed (``StudyTools.claim_work_dir``).
        """
        options = self.options
        work_dir, checkpoint = self.train_dir(arm, seed), self.checkpoint(arm, seed)
        stage2 = arm.training == 'stage2'
        load_from = self.checkpoint(study_arm(STAGE1, self.arms), seed) if stage2 else None
        cfg = arm_config(arm, options.data_root, self.epochs(arm), options.image_drop, options.lidar_drop, load_from,
                         self.repo_root)
        train_seed = seed if stage2 or not options.shared_stage1 else options.seeds[0]
        os.makedirs(self.path(work_dir), exist_ok=True)
        self.tools.claim_work_dir(work_dir, cfg, train_seed)
        if osp.exists(self.path(checkpoint)):
            print(f'  {checkpoint} exists', flush=True)
            return checkpoint
        cfg.dump(self.path(self.config_path(arm, seed)))
        arguments = [self.config_path(arm, seed), '--work-dir', work_dir, '--auto-resume', '--no-validate', '--seed',
                     str(train_seed)]
        self._timed(f'train {work_dir}', lambda: self.tools.train(arguments, cfg.get('demo_processes', 1)))
        return checkpoint

    def _evaluated(self, out_dir: str, arm: StudyArm) -> bool:
        """Whether ``out_dir`` holds an evaluation of every corruption with the study's object metrics."""
        report = self.path(out_dir, 'robustness.json')
        if not osp.exists(report):
            return False
        written = mmcv.load(report)
        done = {result['corruption'] for result in written['results']
                if result['status'] != 'ok' or result.get('objects') is not None}
        return (not set(self.options.corruptions) - done and written.get('routing') == [arm.test_routing]
                and written.get('score_threshold') == self.options.score_threshold
                and written.get('min_lidar_points') == self.options.min_lidar_points
                and written.get('attention_mass', False) == self.options.attention_mass)

    def evaluate(self, arm: StudyArm, seed: int) -> Dict[str, dict]:
        """``tools/eval_robustness.py --object-metrics`` on ``arm``'s checkpoint (skipped when done).

        Returns:
            dict[str, dict]: corruption -> its result (``status``, ``mAP``, ``NDS``, ``objects``, ...).
        """
        options = self.options
        out_dir = self.evaluation_dir(arm, seed)
        if self._evaluated(out_dir, arm):
            print(f'  {out_dir}/robustness.json has every corruption', flush=True)
        else:
            command = ([
                'tools/eval_robustness.py', self.config_path(arm, seed), self.checkpoint(arm, seed), '--out', out_dir,
                '--routing', arm.test_routing, '--object-metrics', '--score-thr', str(options.score_threshold),
                '--min-lidar-points', str(options.min_lidar_points)]
                + ['--attention-mass'] * options.attention_mass + ['--corruptions', *options.corruptions])
            self._timed(f'evaluate {out_dir}', lambda: self.tools.run(command))
        return {result['corruption']: result for result in mmcv.load(self.path(out_dir, 'robustness.json'))['results']}

    def pictures(self) -> Dict[str, List[str]]:
        """AQR pictures of :data:`PICTURE_ARM` (first seed) under the design's ``picture_corruptions``, copied to
        the report folder as ``<report>_<corruption>_<picture>.png``.

        Returns:
            dict[str, list[str]]: corruption -> the file names written (relative to the report folder).
        """
        arm, seed = study_arm(PICTURE_ARM, self.arms), self.options.seeds[0]
        written = {}
        for corruption in self.design.picture_corruptions:
            folder = self.picture_dir(corruption)
            if not glob.glob(self.path(folder, '*.png')):
                command = ['tools/visualize_aqr.py', self.config_path(arm, seed), self.checkpoint(arm, seed),
                           '--sample', str(self.options.picture_sample), '--out', folder, '--score-thr', '0.2',
                           '--corruption', corruption]
                self._timed(f'pictures {folder}', lambda: self.tools.run(command))
            names = []
            for source in sorted(glob.glob(self.path(folder, '*.png'))):
                kind = osp.basename(source)[:-len('.png')].rsplit('_', 1)[-1]  # bev, cameras or bias
                names.append(f'{self.design.report}_{picture_tag(corruption)}_{kind}.png')
                shutil.copyfile(source, self.path(self.options.out, names[-1]))
            written[corruption] = names
        return written

    def intro(self, minutes: float) -> List[str]:
        """The setup paragraph of the report: the run, the data, the arms and the metrics."""
        options = self.options
        corruptions = (f'with the same train-time corruptions (`RandomSensorCorruption`, one per sample or none: '
                       f'{describe_corruptions(self.design.stage2_corruptions)})' if self.design.stage2_corruptions
                       else 'on clean data')
        stage1 = (f'once (seed {options.seeds[0]}), shared by every seed\'s stage 2, so the spread covers stage 2 '
                  f'only' if options.shared_stage1 else 'per seed')
        lines = [
            f'Written by `{options.command}` (seeds {" ".join(map(str, options.seeds))}; {minutes:.0f} min of steps '
            f'on this machine). One synthetic nuScenes set of {options.scenes} scenes x 2 samples (a fifth of the '
            f'scenes for validation); every training with ModalMask3D modality drop (images dropped with probability '
            f'{options.image_drop}, else points with probability {options.lidar_drop}). Stage 1 '
            f'{_epochs(options.stage1_epochs)}, {stage1}; every stage-2 arm {_epochs(options.stage2_epochs)} from it, '
            f'every parameter training (the control\'s router frozen), {corruptions}.',
            '', 'Arms:', '']
        lines += [f'- **{arm.label}** (`{arm.name}`, `{arm.config}`): {arm.description};' for arm in self.arms]
        lines += [
            '', f'Metrics on the validation split, clean and under each corruption (`tools/eval_robustness.py '
            f'--object-metrics`), mean over the seeds with min … max in brackets: the official nuScenes '
            f'`DetectionEval` mAP and NDS; the recall of the objects the corruption affected (its box held >= '
            f'{options.min_lidar_points} LiDAR points clean and holds fewer, or only failed / dropped camera views see '
            f'its centre) by a detection of its class scoring >= {options.score_threshold} within 2 m (BEV); false '
            f'positives per sample (detections scoring >= {options.score_threshold} with no object of their class '
            f'within 2 m); the router\'s accuracy: per object, the query of its best-scoring prediction of its class '
            f'within 2 m, its LiDAR and camera weights on the side of 0.5 of the object\'s per-query targets (LiDAR: '
            f'the box holds >= {options.min_lidar_points} points and the cloud is not misaligned, camera: its centre '
            f'is in a live view that is not yawed)'
            + ('; for the same queries, the share of the fused pass\'s last cross-attention on the camera keys where '
               'no live view sees the object, and on the BEV keys where its box lost its points (routing that mutes '
               'a dead sensor takes these towards 0)' if options.attention_mass else '')
            + ' (`projects/mmdet3d_plugin/apis/object_metrics.py`). The differences are per seed, each arm minus the '
            'control of the same seed; **bold**: the same sign on every seed.']
        return lines

    def report(self, runs: Runs, pictures: Dict[str, List[str]]) -> Dict[str, dict]:
        """Write ``<report>.md``, ``<report>.json`` and the chart to the report folder; the summary."""
        options, report = self.options, self.design.report
        summary = summarise(runs, options.corruptions)
        chart = f'{report}_chart.png'
        bar_chart(summary, self.arms, self.path(options.out, chart))
        minutes = self.total_minutes()
        caption = (f'{study_arm(PICTURE_ARM, self.arms).label} (seed {options.seeds[0]}) on validation sample '
                   f'{options.picture_sample}: LiDAR weight of each query in the BEV (with the points that are left, '
                   f'ground truth green, predictions red), camera weight of each query in the camera that sees it, and '
                   f'the attention bias of the highest-scoring query (`tools/visualize_aqr.py`).'
                   if self.draws_pictures else '')
        text = markdown_report(self.design.title, self.intro(minutes), summary, self.arms, chart, pictures, caption,
                               degradation_lines(runs, self.arms), per_seed_lines(runs, self.arms, options.seeds))
        with open(self.path(options.out, f'{report}.md'), 'w') as f:
            f.write(text)
        mmcv.dump(dict(options=asdict(options), arms=[asdict(arm) for arm in self.arms], summary=summary, runs=runs,
                       minutes=minutes), self.path(options.out, f'{report}.json'), indent=2)
        print(text)
        print(f'study: {minutes:.1f} min; report {osp.join(options.out, report + ".md")}', flush=True)
        return summary

    def run(self) -> Dict[str, dict]:
        """Every step (each skipped when done); the summary (see :func:`.study_report.summarise`)."""
        options = self.options
        self.print_plan()
        self.banner(1, f'synthetic data in {options.data_root}')
        start = time.time()
        self.tools.prepare_data()
        self.record_seconds(f'data {options.data_root} ({options.scenes} scenes)', time.time() - start)
        runs: Runs = {arm.name: [] for arm in self.arms}
        for seed in options.seeds:  # seed by seed: a study stopped half-way has whole seeds evaluated
            for arm in self.arms:
                if arm.is_trained:
                    self.banner(2, f'seed {seed}: train {arm.label} ({arm.name})')
                    self.train(arm, seed)
            for arm in self.arms:
                self.banner(3, f'seed {seed}: evaluate {arm.label} ({arm.test_routing} routing), clean and under '
                            f'{len(options.corruptions) - 1} corruptions')
                runs[arm.name].append(self.evaluate(arm, seed))
        os.makedirs(self.path(options.out), exist_ok=True)
        pictures = {}
        if self.draws_pictures:
            self.banner(4, f'routing pictures of {PICTURE_ARM} in {options.out}')
            pictures = self.pictures()
        self.banner(5, f'report and chart in {options.out}')
        return self.report(runs, pictures)


def picture_tag(corruption: str) -> str:
    """A corruption spec as a file name part: ``object_drop:0.5`` -> ``object_drop_0p5``."""
    return corruption.replace(':', '_').replace('.', 'p')


def _epochs(count: int) -> str:
    return f'{count} epoch' + ('s' if count != 1 else '')
