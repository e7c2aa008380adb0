"""What tools/train.py and tools/test.py share: config loading, the work dir, the device and the process group.

The tools parse their options with ``tools/cli/launch.py`` and hand the
parsed namespace (any object with the attributes of :class:`LaunchOptions`) here.
"""
import importlib
import os
import os.path as osp
from typing import Optional, Protocol

import torch
import torch.distributed as dist
from mmcv import Config
from mmcv.runner import init_dist

from ..config_upgrade import upgrade_model_config
from .slurm_env import torch_env_from_slurm


class LaunchOptions(Protocol):
    """The parsed options read here: the config file, its overrides, the process's local rank and the work dir."""

    config: str
    cfg_options: Optional[dict]
    local_rank: int
    work_dir: Optional[str]


def load_config(args: LaunchOptions) -> Config:
    """``args.config`` with ``args.cfg_options`` merged in, its model in current keys (``upgrade_model_config``
    rewrites legacy keys), its plugin imported and ``LOCAL_RANK`` set."""
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if 'model' in cfg:
        cfg.model = upgrade_model_config(cfg.model)
    import_plugin(cfg, args.config)
    return cfg


def resolve_work_dir(args: LaunchOptions, cfg: Config) -> str:
    """``--work-dir``, else the config's ``work_dir``, else ``./work_dirs/<config name>``; created if missing."""
    work_dir = args.work_dir or cfg.get('work_dir') or osp.join('./work_dirs',
                                                                 osp.splitext(osp.basename(args.config))[0])
    os.makedirs(osp.abspath(work_dir), exist_ok=True)
    return work_dir


def import_plugin(cfg: Config, config_path: str) -> None:
    """Import the plugin named by the config, as mmdet3d's tools do.

    ``plugin=True`` with ``plugin_dir='projects/mmdet3d_plugin/'`` imports
    ``projects.mmdet3d_plugin`` (relative to the working directory); without
    ``plugin_dir`` the config's own folder is imported as a package.
    """
    if not cfg.get('plugin', False):
        return
    plugin_dir = cfg.get('plugin_dir') or osp.dirname(config_path)
    module_path = osp.normpath(plugin_dir).replace(os.sep, '.').strip('.')
    try:
        importlib.import_module(module_path)
    except ImportError as error:
        raise ImportError(f'cannot import the plugin {module_path!r} named by plugin_dir={plugin_dir!r} of '
                          f'{config_path}; run the tools from the repository root') from error


def default_device() -> str:
    """``'cuda'`` when a GPU is usable, else ``'cpu'``."""
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def init_distributed(launcher: str, dist_params: Optional[dict] = None) -> bool:
    """Start the process group for ``launcher`` (``'none'`` starts none).

    ``pytorch`` reads ``MASTER_ADDR``/``RANK``/... that ``torch.distributed.run``
    sets; ``slurm`` first sets them from the variables ``srun`` sets
    (:func:`.slurm_env.torch_env_from_slurm`; the port from ``dist_params.port``)
    and then starts the same way. Without a GPU both use the gloo backend
    whatever the config says (nccl needs GPUs).

    Returns:
        bool: whether the run is distributed.
    """
    if launcher == 'none':
        return False
    params = dict(dist_params or {})
    if launcher == 'slurm':
        os.environ.update(torch_env_from_slurm(os.environ, params.pop('port', None)))
        launcher = 'pytorch'
    if default_device() == 'cpu':
        if launcher != 'pytorch':
            raise ValueError(f'launcher {launcher!r} needs GPUs; on CPU use --launcher pytorch '
                             f'(tools/dist_train.sh / dist_test.sh) or slurm (tools/slurm_train.sh / slurm_test.sh)')
        params.pop('backend', None)
        dist.init_process_group(backend='gloo', **params)
        return True
    init_dist(launcher, **params)
    return True
