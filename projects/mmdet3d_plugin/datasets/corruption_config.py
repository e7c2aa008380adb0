"""Put a test-time ``SensorCorruption`` into a test pipeline or a whole config (``tools/test.py --corruption``),
or train-time sensor failures (``RandomSensorCorruption``) into a config's training pipeline
(:func:`add_train_corruptions`).

Where it goes: right after the loading steps (``Load*``) at the top level
of the pipeline, i.e. after the points, the sweeps and the images are loaded
and before ``MultiScaleFlipAug3D`` and everything in it (resizing,
normalisation, 3D test-time transforms). So the sweeps are corrupted with
the key frame, black images are pixels of value 0 before normalisation, and
every test-time flip sees the same corrupted sample.
"""
import copy
import inspect
from typing import Dict, List, Sequence, Union

from mmcv import Config
from mmdet.datasets.builder import PIPELINES as MMDET_PIPELINES
from mmdet3d.datasets.builder import PIPELINES as MMDET3D_PIPELINES
from mmdet3d.datasets.pipelines import Compose

from .pipelines.corruption import AUGMENTATION_META_KEYS, CORRUPTION_KEY
from .pipelines.corruption_spec import GHOST_MODES, corruption_mode, parse_corruption

#: The loading step each corrupted input needs.
REQUIRED_LOADER = {'points': 'LoadPointsFromFile', 'img': 'LoadMultiViewImageFromFiles'}
SWEEP_LOADER = 'LoadPointsFromMultiSweeps'
#: Corruption modes that need the sweep time of each point (``SensorCorruption``'s ``sweep_time_column``).
TIME_AWARE_MODES = ('beams', 'object_drop')
#: Dataset splits whose pipelines ``corrupt_config`` rewrites.
CORRUPTED_SPLITS = ('val', 'test')
#: Sensor failures to train on (``RandomSensorCorruption``: one of them or none per sample): boxes that lose their
#: points, dead camera views, a cut sector of both sensors (per-query variation for AQR's routing targets) and
#: whole-camera failures (MoME's per-sample label). make demo's CMT-AQR ends with a fine-tune on them
#: (``tools/demo.py --sensor-failure-epochs``); every stage-2 arm of the robustness study trains with them.
SENSOR_FAILURE_CORRUPTIONS = (dict(spec='object_drop:0.5', prob=0.15), dict(spec='camera_fail:0.4', prob=0.15),
                              dict(spec='mixed:120', prob=0.15), dict(spec='camera_drop', prob=0.15))


def _default_argument(transform_type: str, name: str):
    """Default value of argument ``name`` of the pipeline transform ``transform_type`` (mmdet3d's, else mmdet's)."""
    transform_class = MMDET3D_PIPELINES.get(transform_type) or MMDET_PIPELINES.get(transform_type)
    return inspect.signature(transform_class).parameters[name].default


def sweep_time_column(sweep_loader: Dict) -> int:
    """Column of the sweep time lag in the points ``LoadPointsFromMultiSweeps`` (config ``sweep_loader``) outputs."""
    use_dim = list(sweep_loader.get('use_dim', _default_argument(SWEEP_LOADER, 'use_dim')))
    time_dim = sweep_loader.get('time_dim', _default_argument(SWEEP_LOADER, 'time_dim'))
    if time_dim not in use_dim:
        raise ValueError(f'{SWEEP_LOADER}(use_dim={use_dim}, time_dim={time_dim}) drops the sweep time, which the '
                         f'beams corruption needs to map each sweep back to its own LiDAR frame (and object_drop '
                         f'to place each sweep\'s boxes)')
    return use_dim.index(time_dim)


def _with_corruption_meta_key(step: Dict, keys: Sequence[str] = (CORRUPTION_KEY, )) -> Dict:
    """``step`` with ``keys`` (default ``'corruption'``) in the meta keys of every ``Collect3D`` in it (nested
    ``transforms`` too), changed in place."""
    if step.get('type') == 'Collect3D':
        meta_keys = tuple(step.get('meta_keys', _default_argument('Collect3D', 'meta_keys')))
        missing = tuple(key for key in keys if key not in meta_keys)
        if missing:
            step['meta_keys'] = meta_keys + missing
    if 'transforms' in step:
        step['transforms'] = [_with_corruption_meta_key(inner, keys) for inner in step['transforms']]
    return step


def insert_corruption(pipeline: Sequence[Dict], corruption: Union[str, Dict], **options) -> List[Dict]:
    """A copy of the test ``pipeline`` with the corruption right after its loading steps.

    Also adds ``'corruption'`` to the ``meta_keys`` of every ``Collect3D``,
    and for ``beams`` and ``object_drop`` sets ``sweep_time_column`` from the pipeline's
    ``LoadPointsFromMultiSweeps`` (unless given). An input the pipeline never
    loads (no loader at any level: a camera-only model's points) is one the
    model does not read: the corruption leaves it out (``inputs``), so that
    ``lidar_drop`` leaves a camera-only model's input as it is and ``mixed``
    blacks out only its cameras' sector.

    Args:
        pipeline: test pipeline configs (dicts).
        corruption: CLI form ``mode[:arg[:arg]]`` or a ``SensorCorruption`` config.
        **options: further ``SensorCorruption`` arguments (``seed``, ``forward_yaw_deg``, ...).

    Raises:
        ValueError: a bad corruption; the pipeline lacks the loader of the
            corrupted input, already holds a ``SensorCorruption``, or has
            non-loading steps before its last loading step.
    """
    steps = [_with_corruption_meta_key(copy.deepcopy(dict(step))) for step in pipeline]
    transform = dict(parse_corruption(corruption) if isinstance(corruption, str) else corruption)
    transform.setdefault('type', 'SensorCorruption')
    transform.update(options)
    types = [step.get('type') for step in steps]
    if transform['type'] in types:
        raise ValueError(f'the pipeline already holds a {transform["type"]}: {types}')
    if (transform.get('mode') in TIME_AWARE_MODES and SWEEP_LOADER in types
            and 'sweep_time_column' not in transform):
        transform['sweep_time_column'] = sweep_time_column(steps[types.index(SWEEP_LOADER)])
    mode_inputs = corruption_mode(transform['mode']).input_keys
    read = [key for key in mode_inputs if _loads(steps, REQUIRED_LOADER[key])]
    if len(read) < len(mode_inputs) and 'inputs' not in transform:  # the model does not read the others
        transform['inputs'] = read
    corruption_step = Compose([transform]).transforms[0]
    for input_key in corruption_step.input_keys:
        loader = REQUIRED_LOADER[input_key]
        if loader not in types:
            raise ValueError(f'corruption {corruption_step.name!r} changes results[{input_key!r}] but the test '
                             f'pipeline has no top-level {loader}: {types}')
    position = max(index for index, name in enumerate(types) if name.startswith('Load')) + 1
    early = [name for name in types[:position] if not name.startswith('Load')]
    if early:
        raise ValueError(f'the test pipeline transforms the data ({early}) before its last loading step, so a '
                         f'corruption cannot see the raw loaded sample: {types}')
    return steps[:position] + [transform] + steps[position:]


def _loads(steps: Sequence[Dict], loader: str) -> bool:
    """Whether ``loader`` is a step of ``steps`` or of a step's nested ``transforms``."""
    return any(step.get('type') == loader or _loads(step.get('transforms', ()), loader) for step in steps)


def _dataset_configs(dataset: Union[Dict, List, None]) -> List[Dict]:
    """The dataset configs holding a ``pipeline`` in a split's config (a list, or wrappers with ``dataset``)."""
    if dataset is None:
        return []
    if isinstance(dataset, (list, tuple)):
        return [inner for item in dataset for inner in _dataset_configs(item)]
    if 'pipeline' in dataset:
        return [dataset]
    if 'dataset' in dataset:
        return _dataset_configs(dataset['dataset'])
    raise ValueError(f'dataset config {dict(dataset)} has neither a pipeline nor a wrapped dataset')


def corrupt_config(cfg: Config, corruption: Union[str, Dict], **options) -> Config:
    """A copy of ``cfg`` whose ``data.val`` and ``data.test`` pipelines apply the corruption.

    See :func:`insert_corruption` for where it goes and for ``options``; a ghost corruption gets
    :func:`ghost_options` of ``cfg`` unless ``options`` give them.

    Raises:
        ValueError: ``cfg.data.test`` has no pipeline, ``insert_corruption`` refuses one, or a ghost corruption
            finds no ``cfg.db_sampler``.
    """
    cfg = copy.deepcopy(cfg)
    if not _dataset_configs(cfg.data.get('test')):
        raise ValueError('the config has no data.test pipeline to corrupt')
    mode = (parse_corruption(corruption) if isinstance(corruption, str) else corruption)['mode']
    if mode in GHOST_MODES:
        options = dict(ghost_options(cfg), **options)
    for split in CORRUPTED_SPLITS:
        for dataset in _dataset_configs(cfg.data.get(split)):
            dataset['pipeline'] = insert_corruption(dataset['pipeline'], corruption, **options)
    return cfg


def ghost_options(cfg: Config) -> Dict:
    """``ghost_database`` (``cfg.db_sampler``) and ``point_cloud_range`` of the ghost corruptions for ``cfg``.

    Raises:
        ValueError: the config has no ``db_sampler`` (the GT database the ghosts come from).
    """
    if 'db_sampler' not in cfg:
        raise ValueError(f'the corruptions {GHOST_MODES} copy objects from the GT database, but the config has no '
                         f'db_sampler naming it (tools/create_data.py writes it)')
    options = dict(ghost_database=copy.deepcopy(cfg.db_sampler.to_dict()))
    if 'point_cloud_range' in cfg:
        options['point_cloud_range'] = list(cfg.point_cloud_range)
    return options


def train_pipelines(cfg: Config) -> List[List[Dict]]:
    """The pipelines of ``cfg.data.train`` (one per dataset, through dataset wrappers), to change in place."""
    return [dataset['pipeline'] for dataset in _dataset_configs(cfg.data.train)]


def describe_corruptions(corruptions: Sequence[Dict]) -> str:
    """``'object_drop:0.5 0.15, camera_drop 0.15'``: each ``dict(spec=..., prob=...)`` item's spec and probability."""
    return ', '.join(f"{item['spec']} {item['prob']}" for item in corruptions)


def add_train_corruptions(cfg: Config, corruptions: Sequence[Dict]) -> None:
    """Put a ``RandomSensorCorruption`` of ``corruptions`` right before each training pipeline's ``ModalMask3D``.

    That is after the loading steps (``object_drop`` reads the loaded boxes)
    and after the ground-truth sampling (the pasted objects' points and image
    patches are corrupted with the rest, so the recorded dead views hold no
    object, and ghosts avoid the pasted boxes), and before the 3D augmentation;
    with sweeps loaded, the corruptions get their time column; ghosts come from
    ``cfg.db_sampler``'s database (:func:`ghost_options`). Every ``Collect3D``
    of the pipeline gets ``'corruption'`` in its meta keys (the record the
    routing targets read) and, with ghosts, ``AUGMENTATION_META_KEYS`` (which
    move the recorded ghost boxes as the augmentation moved their points).

    Args:
        cfg (Config): changed in place.
        corruptions (Sequence[dict]): ``dict(spec='mode[:arg[:arg]]', prob=p)`` items
            (e.g. :data:`SENSOR_FAILURE_CORRUPTIONS`).

    Raises:
        ValueError: a bad spec, a training pipeline without ``ModalMask3D``, or ghosts without ``cfg.db_sampler``.
    """
    modes = [parse_corruption(item['spec'])['mode'] for item in corruptions]
    for pipeline in train_pipelines(cfg):
        types = [step['type'] for step in pipeline]
        if 'ModalMask3D' not in types:
            raise ValueError(f'the training pipeline has no ModalMask3D step to put the corruptions before: {types}')
        step = dict(type='RandomSensorCorruption', corruptions=[dict(item) for item in corruptions])
        if set(modes) & set(GHOST_MODES):
            step.update(ghost_options(cfg))
        if SWEEP_LOADER in types:
            step['sweep_time_column'] = sweep_time_column(pipeline[types.index(SWEEP_LOADER)])
        pipeline.insert(types.index('ModalMask3D'), step)
        meta_keys = (CORRUPTION_KEY, *(AUGMENTATION_META_KEYS if set(modes) & set(GHOST_MODES) else ()))
        for pipeline_step in pipeline:
            _with_corruption_meta_key(pipeline_step, meta_keys)
