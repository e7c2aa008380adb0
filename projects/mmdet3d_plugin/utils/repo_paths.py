"""Where this checkout is: the tools run configs (``configs/...``) and other tools by their repository paths.

The plugin is installed in editable mode (``tools/setup_env.sh``), so this
module lies in the checkout and the repository root is three folders up.
"""
import os.path as osp

#: the checkout's root folder (holds ``configs/``, ``tools/``, ``projects/``)
REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def repo_path(path: str) -> str:
    """``path`` if absolute, else the file of that name under the repository root (any working directory)."""
    return path if osp.isabs(path) else osp.join(REPO_ROOT, path)
