"""Pictures of AQR's routing on one test sample of a CMT-AQR checkpoint.

    python tools/visualize_aqr.py CONFIG CHECKPOINT --sample N --out DIR [--query Q] [--score-thr 0.3]
        [--corruption SPEC] [--layer L] [--cfg-options k=v ...]

Runs the model's ordinary test forward on test sample ``N`` and writes:

* ``sample<N>_bev.png``: bird's-eye view with the LiDAR points, the ground
  truth (green), the predictions scoring at least ``--score-thr`` (red) and
  every query's reference point coloured by its LiDAR weight;
* ``sample<N>_cameras.png``: the six input images (as the model saw them)
  with each query drawn in the camera AQR projected it to, coloured by its
  camera weight;
* ``sample<N>_query<Q>_bias.png``: the cross-attention bias of query ``Q``
  (default: the highest-scoring one) over the BEV keys and each camera's keys.

With ``--corruption`` the names get the corruption (``sample<N>_camera_drop_bev.png``).
A plain CMT config has no routing: only the BEV picture with the boxes is written
(``projects/mmdet3d_plugin/apis/routing_pictures.py``).
"""
import argparse
from typing import List, Optional

from mmcv import DictAction

from projects.mmdet3d_plugin.apis.routing_pictures import AQRPictures, draw_aqr_pictures
from tools.cli.corruption import add_corruption_arguments


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Draw AQR routing pictures of one test sample')
    parser.add_argument('config', help='test config file path (a CMT-AQR config)')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--sample', type=int, default=0, help='index of the test sample')
    parser.add_argument('--out', required=True, help='folder of the PNGs')
    parser.add_argument('--query', type=int, help='query of the bias picture (default: the highest-scoring one)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='draw predictions scoring at least this')
    parser.add_argument('--layer', type=int, default=-1, help='decoder layer of a per-layer bias (default: last)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    add_corruption_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> AQRPictures:
    args = parse_args(argv)
    return draw_aqr_pictures(args.config, args.checkpoint, args.out, args.sample, args.query, args.score_thr,
                             args.layer, args.corruption, args.corruption_seed, args.cfg_options)


if __name__ == '__main__':
    main()
