"""The corruption specs: ``mode[:arg[:arg]]``, the modes, their arguments and their parsing.

``parse_corruption('view_yaw:2:20')`` is ``SensorCorruption``'s config (``corruption.py`` applies it);
:data:`CORRUPTION_MODES` says which inputs each mode changes, which arguments it takes (:data:`MODE_ARGUMENTS`:
type, valid range, CLI placeholder) and whether it draws at random. Unknown modes and bad arguments raise a
``ValueError`` that names the valid forms (:data:`CORRUPTION_FORMS`).
"""
import numbers
from dataclasses import dataclass
from typing import Callable, Dict, Tuple, Union

import numpy as np

#: ``view_yaw``'s usual angle, and ``mixed_lie``'s: at the demo's resolution it moves every projection of every
#: view by >= 2 camera tokens (``corruption_geometry.yaw_token_shift``; tests/datasets/test_lying_corruptions.py).
VIEW_YAW_DEG = 20.0
#: Ghosts of ``mixed_lie`` (in its sector).
MIXED_LIE_GHOSTS = 3

Argument = Union[int, float, None]


@dataclass(frozen=True)
class ModeArgument:
    """An argument of the corruption modes: its type, which values are allowed and its CLI placeholder."""

    arg_type: type
    is_valid: Callable[[float], bool]
    arg_help: str
    placeholder: str


_PROBABILITY = ModeArgument(float, lambda v: 0 <= v <= 1, 'a probability in [0, 1]', 'P')
#: Every argument of a mode, by its ``SensorCorruption`` name.
MODE_ARGUMENTS: Dict[str, ModeArgument] = {
    'view': ModeArgument(int, lambda v: v >= 0, 'a camera view index >= 0', 'N'),
    'fov_deg': ModeArgument(float, lambda v: 0 < v <= 360, 'an angle in (0, 360] degrees', 'DEG'),
    'keep_beams': ModeArgument(int, lambda v: v >= 1, 'a number of beams >= 1', 'K'),
    'keep_ratio': ModeArgument(float, lambda v: 0 < v <= 1, 'a fraction in (0, 1]', 'R'),
    'drop_prob': _PROBABILITY,
    'fail_prob': _PROBABILITY,
    'frame_prob': _PROBABILITY,
    'rotation_deg': ModeArgument(float, lambda v: 0 < v <= 90, 'an angle in (0, 90] degrees', 'DEG'),
    'sector_deg': ModeArgument(float, lambda v: 0 < v <= 180, 'a sector width in (0, 180] degrees', 'DEG'),
    'num_ghosts': ModeArgument(int, lambda v: v >= 1, 'a number of ghost objects >= 1', 'N'),
    'num_views': ModeArgument(int, lambda v: v >= 1, 'a number of camera views >= 1', 'V'),
    'yaw_deg': ModeArgument(float, lambda v: 0 < v <= 90, 'an angle in (0, 90] degrees', 'DEG'),
}


@dataclass(frozen=True)
class CorruptionMode:
    """A corruption mode: the inputs it changes and its arguments.

    Args:
        input_keys: the ``results`` keys it needs: ``('points',)``,
            ``('img',)`` (the camera images and calibration) or both.
        arg_names: its arguments (keys of :data:`MODE_ARGUMENTS`), in their CLI order ``mode:A1:A2``.
        options: ``(name, default)`` of further arguments it takes from the config only.
        random: whether it draws at random (from the sample's generator, see :func:`sample_rng`).
    """

    input_keys: Tuple[str, ...]
    arg_names: Tuple[str, ...] = ()
    options: Tuple[Tuple[str, float], ...] = ()
    random: bool = False


CORRUPTION_MODES: Dict[str, CorruptionMode] = {
    'lidar_drop': CorruptionMode(('points', )),
    'camera_drop': CorruptionMode(('img', )),
    'view_drop': CorruptionMode(('img', ), ('view', )),
    'fov': CorruptionMode(('points', ), ('fov_deg', )),
    'beams': CorruptionMode(('points', ), ('keep_beams', )),
    'points': CorruptionMode(('points', ), ('keep_ratio', ), random=True),
    'object_drop': CorruptionMode(('points', ), ('drop_prob', ), random=True),
    'camera_fail': CorruptionMode(('img', ), ('fail_prob', ), random=True),
    'extrinsic': CorruptionMode(('img', ), ('rotation_deg', ), random=True),
    'mixed': CorruptionMode(('points', 'img'), ('sector_deg', ), random=True),
    'lidar_ghost': CorruptionMode(('points', ), ('num_ghosts', ), random=True),
    'view_yaw': CorruptionMode(('img', ), ('num_views', 'yaw_deg'), random=True),
    'lidar_misalign': CorruptionMode(('points', ), ('frame_prob', 'rotation_deg'), random=True),
    'mixed_lie': CorruptionMode(('points', 'img'), ('sector_deg', ),
                                (('num_ghosts', MIXED_LIE_GHOSTS), ('yaw_deg', VIEW_YAW_DEG)), random=True),
}
#: Modes that place GT-database ghosts (``SensorCorruption`` needs ``ghost_database``).
GHOST_MODES = ('lidar_ghost', 'mixed_lie')


def corruption_form(mode: str) -> str:
    """The CLI form of a known ``mode``, e.g. ``'view_yaw:V:DEG'``."""
    return ':'.join([mode] + [MODE_ARGUMENTS[name].placeholder for name in CORRUPTION_MODES[mode].arg_names])


#: The CLI forms, for help texts: ``lidar_drop|camera_drop|view_drop:N|fov:DEG|...|mixed_lie:DEG``.
CORRUPTION_FORMS = '|'.join(map(corruption_form, CORRUPTION_MODES))


def corruption_mode(mode: str) -> CorruptionMode:
    """The :class:`CorruptionMode` of ``mode``; ``ValueError`` naming the known forms if there is none."""
    if mode not in CORRUPTION_MODES:
        raise ValueError(f'unknown corruption mode {mode!r}; expected one of {CORRUPTION_FORMS}')
    return CORRUPTION_MODES[mode]


def check_corruption_argument(mode: str, name: str, value: Argument) -> Argument:
    """``value`` as argument ``name`` of ``mode`` (converted to its type), or ``ValueError`` saying what is wrong."""
    corruption_mode(mode)
    argument = MODE_ARGUMENTS[name]
    if value is None:
        raise ValueError(f'corruption {mode!r} needs {name}: {argument.arg_help} (CLI form {corruption_form(mode)})')
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if (not is_number or (argument.arg_type is int and not float(value).is_integer())
            or not argument.is_valid(argument.arg_type(value))):
        raise ValueError(f'corruption {mode!r}: {name} must be {argument.arg_help}, got {value!r}')
    return argument.arg_type(value)


def corruption_name(mode: str, *values: Argument) -> str:
    """The CLI form of a corruption, e.g. ``'fov:120'``, ``'view_yaw:2:20'``, ``'lidar_drop'``."""
    return ':'.join([mode] + [np.format_float_positional(value, trim='-') for value in values])


def parse_corruption(spec: str) -> Dict:
    """The ``SensorCorruption`` config of a CLI corruption ``mode[:arg[:arg]]``.

    ``parse_corruption('view_yaw:2:20') == dict(type='SensorCorruption', mode='view_yaw', num_views=2,
    yaw_deg=20.0)``.

    Raises:
        ValueError: unknown mode, a missing, unexpected or malformed
            argument, or an argument out of range.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f'a corruption must be a string {CORRUPTION_FORMS}, got {spec!r}')
    mode, *texts = spec.strip().split(':')
    mode_spec = corruption_mode(mode)
    if len(texts) > len(mode_spec.arg_names):
        expected = (f'{len(mode_spec.arg_names)} argument(s), {corruption_form(mode)}' if mode_spec.arg_names
                    else 'no argument')
        raise ValueError(f'corruption {mode!r} takes {expected}, got {spec!r}')
    config = dict(type='SensorCorruption', mode=mode)
    for index, name in enumerate(mode_spec.arg_names):
        argument, value = MODE_ARGUMENTS[name], None
        if index < len(texts):
            try:
                value = argument.arg_type(texts[index])
            except ValueError:
                raise ValueError(f'corruption {spec!r}: {texts[index]!r} is not {argument.arg_help}') from None
        config[name] = check_corruption_argument(mode, name, value)
    return config
