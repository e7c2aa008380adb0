"""Prepare nuScenes (real or synthetic) for the CMT / CMT-AQR configs: info ``.pkl`` files and the GT database.

Examples::

    # real nuScenes (tables in data/nuscenes/v1.0-trainval, ...)
    python tools/create_data.py nuscenes --root-path data/nuscenes --out-dir data/nuscenes \
        --extra-tag nuscenes --version v1.0-trainval
    # the mini split, or the synthetic set of tools/make_synthetic_nuscenes.py
    python tools/create_data.py nuscenes --root-path data/synthetic_nuscenes \
        --out-dir data/synthetic_nuscenes --extra-tag nuscenes --version v1.0-mini

Writes ``<extra-tag>_infos_train.pkl`` / ``_val.pkl`` (``_test.pkl`` for
v1.0-test), then, from the training infos, ``<extra-tag>_gt_database/`` and
``<extra-tag>_dbinfos_train.pkl`` for ``UnifiedObjectSample``. ``--version
v1.0`` (upstream CMT's spelling) means v1.0-trainval followed by v1.0-test.
See docs/data.md.
"""
import argparse
import time
from typing import List, Optional

from tools.data_converter.gt_database import create_groundtruth_database
from tools.data_converter.nuscenes_converter import (SUPPORTED_VERSIONS, check_data_root,
                                                     create_nuscenes_infos)

VERSION_CHOICES = SUPPORTED_VERSIONS + ('v1.0', )


def expand_versions(version: str) -> List[str]:
    """The table versions to convert: ``v1.0`` stands for trainval then test (as upstream)."""
    return ['v1.0-trainval', 'v1.0-test'] if version == 'v1.0' else [version]


def nuscenes_data_prep(root_path: str, out_dir: str, info_prefix: str, version: str, max_sweeps: int = 10,
                       with_gt_database: bool = True, verbose: bool = True) -> dict:
    """Write the info files of one version and, unless it is v1.0-test, the GT database of its train split.

    Returns:
        dict: split name (and ``'dbinfos'``) -> written file path.
    """
    paths = create_nuscenes_infos(root_path, out_dir, info_prefix, version=version, max_sweeps=max_sweeps,
                                  verbose=verbose)
    if with_gt_database and 'train' in paths:
        paths['dbinfos'] = create_groundtruth_database(paths['train'], out_dir, info_prefix, max_sweeps=max_sweeps,
                                                       expected_version=version, verbose=verbose)
    return paths


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Create the nuScenes info files and GT database.')
    parser.add_argument('dataset', choices=['nuscenes'], help='dataset name')
    parser.add_argument('--root-path', default='./data/nuscenes', help='nuScenes data root (holds <version>/)')
    parser.add_argument('--out-dir', default=None, help='output folder (default: the root path)')
    parser.add_argument('--extra-tag', default='nuscenes', help='prefix of the output files')
    parser.add_argument('--version', default='v1.0-trainval', choices=VERSION_CHOICES,
                        help='table version; v1.0 = v1.0-trainval and v1.0-test')
    parser.add_argument('--max-sweeps', type=int, default=10, help='LiDAR sweeps kept per key frame')
    parser.add_argument('--no-gt-database', action='store_true', help='only write the info files')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    out_dir = args.out_dir or args.root_path
    versions = expand_versions(args.version)
    for version in versions:
        check_data_root(args.root_path, version)
    for version in versions:
        start = time.time()
        print(f'nuScenes {version}: {args.root_path} -> {out_dir} (prefix {args.extra_tag})', flush=True)
        paths = nuscenes_data_prep(args.root_path, out_dir, args.extra_tag, version, args.max_sweeps,
                                   with_gt_database=not args.no_gt_database)
        print(f'nuScenes {version} done in {time.time() - start:.1f}s: ' +
              ', '.join(f'{name} {path}' for name, path in paths.items()), flush=True)


if __name__ == '__main__':
    main()
