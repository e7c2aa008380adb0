"""Test-time sensor corruptions on the command line: ``--corruption SPEC``, ``--corruption-seed N``, checked specs.

A spec is ``mode[:arg[:arg]]`` (``projects/mmdet3d_plugin/datasets/pipelines/corruption.py``);
a bad one is refused while parsing, with the valid forms.
"""
import argparse

from projects.mmdet3d_plugin.apis.robustness_eval import CLEAN
from projects.mmdet3d_plugin.datasets.pipelines.corruption_spec import CORRUPTION_FORMS, parse_corruption


def corruption_spec(text: str) -> str:
    """``argparse`` type of a corruption ``mode[:arg[:arg]]``: the spec, checked.

    Raises:
        argparse.ArgumentTypeError: the spec is not one of
            :data:`CORRUPTION_FORMS` (the message names the cause and the valid forms).
    """
    try:
        parse_corruption(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f'{error} (valid forms: {CORRUPTION_FORMS})') from None
    return text.strip()


def robustness_spec(text: str) -> str:
    """``argparse`` type of ``--corruptions`` items: ``clean`` or a corruption spec."""
    return CLEAN if text.strip() == CLEAN else corruption_spec(text)


def add_corruption_arguments(parser: argparse.ArgumentParser) -> None:
    """``--corruption SPEC`` and ``--corruption-seed N`` (``projects.mmdet3d_plugin.apis.test.apply_corruption``)."""
    parser.add_argument('--corruption', type=corruption_spec, metavar='SPEC',
                        help=f'corrupt the test inputs: {CORRUPTION_FORMS} (LiDAR removed, all cameras black, '
                        f'camera view N black, LiDAR limited to a DEG-degree forward field of view, only K beams, '
                        f'a random fraction R of the points, each object\'s points lost with probability P, each '
                        f'camera black with probability P, camera extrinsics rotated by DEG degrees, a DEG-degree '
                        f'LiDAR sector and the cameras of the opposite sector lost, N LiDAR-only ghost objects, V '
                        f'camera calibrations yawed by DEG, the LiDAR misaligned by DEG and 2 m in a fraction P of '
                        f'the frames, ghosts and yawed cameras in opposite DEG-degree sectors; '
                        f'docs/robustness/corruptions.md)')
    parser.add_argument('--corruption-seed', type=int, default=0,
                        help='seed of the random corruptions (all but lidar_drop, camera_drop, view_drop, fov, '
                        'beams), drawn per sample token')
