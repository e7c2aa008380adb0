"""Point a whole config at another copy of a dataset (``tools/demo.py --data-root``, tests on temporary data).

mmcv configs are evaluated once, so overriding a config's top-level
``data_root`` variable changes nothing in the dataset and sampler entries
built from it. :func:`retarget_data_root` rewrites those entries instead.
"""
import copy
import os.path as osp
from typing import Any

from mmcv import Config

#: Keys holding a file of the data root: the file keeps its name and moves into the new root.
FILE_KEYS = ('ann_file', 'info_path')


def _retarget(node: Any, data_root: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == 'data_root' and isinstance(value, str):
                node[key] = data_root
            elif key in FILE_KEYS and isinstance(value, str):
                node[key] = osp.join(data_root, osp.basename(value))
            else:
                _retarget(value, data_root)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _retarget(value, data_root)


def retarget_data_root(cfg: Config, data_root: str) -> Config:
    """A copy of ``cfg`` whose datasets and GT-database samplers read ``data_root``.

    Every ``data_root`` entry (top level, datasets, dataset wrappers such as
    CBGS, samplers in the pipelines) becomes ``data_root``, and every
    ``ann_file`` / ``info_path`` keeps its file name inside ``data_root``.

    Args:
        cfg (Config): the config; not modified.
        data_root (str): folder with the ``<version>/`` tables, the info files
            and the GT database (as written by ``tools/create_data.py``).

    Returns:
        Config: the retargeted copy.
    """
    if not osp.isdir(data_root):
        raise FileNotFoundError(f'data root {data_root} does not exist')
    data_root = osp.join(data_root, '')
    cfg_dict = copy.deepcopy(cfg._cfg_dict.to_dict())
    _retarget(cfg_dict, data_root)
    return Config(cfg_dict, filename=cfg.filename)
