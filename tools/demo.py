"""The end-to-end demo on synthetic nuScenes (``make demo``): data → train → official evaluation.

    python tools/demo.py [--model cmt_aqr|cmt_aqr_heading|cmt_aqr_fused|cmt|cmt_camera] [--work-dir DIR]
                         [--epochs N] [--sensor-failure-epochs N]

Steps, each printed as it starts and skipped when its output is already there
(so a second run, or a run after an interruption, continues where it stopped):

1. ``tools/make_synthetic_nuscenes.py``: a small dataset in the nuScenes v1.0 format
   (many short scenes, for many different layouts; official v1.0-trainval scene names);
2. ``tools/create_data.py nuscenes``: info files and the GT database;
3. ``tools/init_checkpoint.py`` + ``tools/test.py --eval bbox``: the untrained model's metrics;
4. ``tools/train.py --auto-resume``: trains the tiny model (progress and ETA in the log lines); a config
   that sets ``demo_processes = N`` (its recipe written for N processes of ``samples_per_gpu`` samples, as
   mmdet's ``8x2`` configs) trains, on a machine without a GPU that has N cores, as N data-parallel processes
   (``torch.distributed.run``, gloo) with the cores split between them (see ``--processes``);
5. CMT-AQR only: ``tools/train.py --auto-resume`` again, a 4-epoch fine-tune of that checkpoint on sensor
   failures (``RandomSensorCorruption``: boxes without points, dead views, a cut sector, no cameras; see
   ``--sensor-failure-epochs``) in ``<work dir>/sensor_failures``;
6. ``tools/test.py --eval bbox``: the trained model, scored by the nuScenes devkit's ``DetectionEval``;

then prints the metrics of both models side by side and where the logs, TensorBoard events and checkpoints
are (``projects/mmdet3d_plugin/experiments/demo_pipeline.py``).
"""
import argparse
from typing import Optional, Sequence

from projects.mmdet3d_plugin.experiments.demo_pipeline import (CONFIGS, FRONT_INTENSITY_OFFSETS, SENSOR_FAILURE_EPOCHS,
                                                                DemoDataset, run_demo)
from tools.data_converter.synthetic.generator import GENERATOR_VERSION


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Synthetic nuScenes demo: generate, train, evaluate')
    parser.add_argument('--model', choices=sorted(CONFIGS), default='cmt_aqr',
                        help='cmt_aqr (default: CMT-AQR with a camera pass), cmt_aqr_heading (the same with heading '
                             'aids, on data whose objects have a LiDAR-bright front), cmt_aqr_fused (its fused pass '
                             'only), the baseline cmt, or the camera-only cmt_camera')
    parser.add_argument('--data-root', default='data/synthetic_nuscenes', help='where the synthetic set is written')
    parser.add_argument('--work-dir', help='logs, checkpoints and metrics (default: work_dirs/demo_<model>)')
    parser.add_argument('--epochs', type=int, help="training epochs (default: the demo config's)")
    parser.add_argument('--sensor-failure-epochs', type=int,
                        help='epochs of the fine-tune on sensor failures after the training (default: '
                             + ', '.join(f'{epochs} for {model}' for model, epochs in SENSOR_FAILURE_EPOCHS.items())
                             + ', none for the others; 0 leaves it out)')
    parser.add_argument('--scenes', type=int, default=100, help='synthetic scenes (a fifth of them for validation)')
    parser.add_argument('--samples', type=int, default=2, help='key frames per scene')
    parser.add_argument('--seed', type=int, default=0, help='seed of the data generator and of training')
    parser.add_argument('--front-intensity-offset', type=float,
                        help='LiDAR intensity added to every object\'s front part in the generated data (default: '
                             + ', '.join(f'{offset:g} for {model}' for model, offset in FRONT_INTENSITY_OFFSETS.items())
                             + ', 0 for the others)')
    parser.add_argument('--processes', type=int,
                        help="data-parallel training processes, each of the config's samples_per_gpu; default: the "
                             "config's demo_processes on a machine without a GPU that has as many cores, else 1")
    parser.add_argument('--cfg-options', nargs='+', default=[], help='passed on to tools/train.py and tools/test.py')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    offset = args.front_intensity_offset
    dataset = DemoDataset(args.data_root, args.scenes, args.samples, args.seed, GENERATOR_VERSION,
                          FRONT_INTENSITY_OFFSETS.get(args.model, 0.0) if offset is None else offset)
    run_demo(args.model, dataset, args.work_dir, args.epochs, args.processes, args.cfg_options,
             args.sensor_failure_epochs)


if __name__ == '__main__':
    main()
