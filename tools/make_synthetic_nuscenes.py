"""Generate a small synthetic dataset in the exact nuScenes v1.0 on-disk format.

Example::

    python tools/make_synthetic_nuscenes.py --root data/synthetic_nuscenes \
        --version v1.0-mini --scenes 10 --samples 10 --seed 0

``--preset nuscenes-mini`` makes a set shaped like nuScenes v1.0-mini (1600 x 900 images, a 32-beam
LiDAR at nuScenes's density, 10 sweeps per sample); options given with it override its values.
The result loads with ``NuScenes(version=..., dataroot=...)``, converts with
``tools/create_data.py nuscenes`` and evaluates with the official ``DetectionEval``.
See ``docs/synthetic_data.md``.
"""
import argparse
import os.path as osp
import time

from tools.data_converter.synthetic.generator import PRESETS, SyntheticConfig, generate_synthetic_nuscenes

#: command-line option (its ``dest``) -> the ``SyntheticConfig`` field it sets
OPTION_FIELDS = dict(root='root', version='version', scenes='num_scenes', samples='samples_per_scene',
                     sweeps='sweeps_per_sample', seed='seed', image_size='image_size', objects='objects_per_scene',
                     lidar_beams='lidar_beams', lidar_azimuths='lidar_azimuths', object_range='object_range',
                     val_scenes='num_val_scenes', front_intensity_offset='front_intensity_offset')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Write a synthetic nuScenes-format dataset.')
    parser.add_argument('--preset', choices=sorted(PRESETS),
                        help='start from these settings (see generator.PRESETS); the other options override them')
    parser.add_argument('--root', default='data/synthetic_nuscenes', help='output data root')
    parser.add_argument('--version', default='v1.0-mini', choices=['v1.0-mini', 'v1.0-trainval'],
                        help='nuScenes version: decides the table folder and the official scene names/splits '
                        '(v1.0-mini has 8 train + 2 val scene names, v1.0-trainval 700 + 150)')
    parser.add_argument('--scenes', type=int, default=10, help='total number of scenes')
    parser.add_argument('--val-scenes', type=int, default=None,
                        help='validation scenes among them (default: scenes // 5, at least 1 when scenes >= 2)')
    parser.add_argument('--samples', type=int, default=10, help='key frames (2 Hz samples) per scene')
    parser.add_argument('--sweeps', type=int, default=3, help='LiDAR sweeps (20 Hz) before each key frame, <= 9')
    parser.add_argument('--objects', type=int, default=16,
                        help='objects per scene (the first 10 cover each detection class once)')
    parser.add_argument('--image-size', type=int, nargs=2, default=(800, 450), metavar=('W', 'H'),
                        help='camera image size; nuScenes is 1600 900, intrinsics scale with the width')
    parser.add_argument('--lidar-beams', type=int, default=32, help='LiDAR rings')
    parser.add_argument('--lidar-azimuths', type=int, default=720, help='LiDAR rays per ring')
    parser.add_argument('--object-range', type=float, default=48.0,
                        help='objects stay within this distance (|x|, |y|, metres) of the ego in every frame; '
                        'keep it below the point-cloud range of the model that trains on the set')
    parser.add_argument('--front-intensity-offset', type=float, default=0.0,
                        help='LiDAR intensity added to every object\'s front part (a retro-reflective front that '
                        'shows its heading; default 0: none)')
    parser.add_argument('--seed', type=int, default=0, help='random seed (output is deterministic)')
    parser.add_argument('--quiet', action='store_true', help='no per-scene progress lines')
    preset = parser.parse_known_args(argv)[0].preset
    if preset is not None:
        fields = {field: option for option, field in OPTION_FIELDS.items()}
        parser.set_defaults(**{fields[field]: value for field, value in PRESETS[preset].items()})
    return parser.parse_args(argv)


def default_val_scenes(num_scenes: int) -> int:
    """Validation scenes when not given: a fifth, at least one when there are two or more scenes."""
    return max(1, num_scenes // 5) if num_scenes >= 2 else 0


def main(argv=None) -> None:
    args = parse_args(argv)
    val_scenes = default_val_scenes(args.scenes) if args.val_scenes is None else args.val_scenes
    config = SyntheticConfig(**dict({field: getattr(args, option) for option, field in OPTION_FIELDS.items()},
                                    num_val_scenes=val_scenes, image_size=tuple(args.image_size)))
    start = time.time()
    print(f'writing synthetic nuScenes {args.version} to {args.root}: {args.scenes} scenes '
          f'({val_scenes} val) x {args.samples} samples, images {args.image_size[0]}x{args.image_size[1]}, '
          f'{args.sweeps} sweeps, {args.lidar_beams} x {args.lidar_azimuths} LiDAR rays, seed {args.seed}')
    totals = generate_synthetic_nuscenes(config, log=None if args.quiet else print)
    print(f'done in {time.time() - start:.1f}s: {totals["scenes"]} scenes, {totals["samples"]} samples, '
          f'{totals["annotations"]} annotations -> {osp.join(args.root, args.version)}')


if __name__ == '__main__':
    main()
