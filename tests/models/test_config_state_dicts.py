"""Every config in configs/, configs/demo/, configs/design_notes/ and configs/finetune/ builds a model with the
state dict it had before the head was rebuilt from parts (issue 39): the same keys, shapes and order (a fine-tune
config, those of the published config it fine-tunes).

``tests/data/reference/config_state_dicts/digests.json`` holds, per config, the number of ``state_dict()``
entries and the SHA-256 of its ``key<TAB>shape`` lines in order, recorded from the tree of
``refs/snapshots/pre-redesign`` (``git archive`` of it, then this file's ``__main__`` run there). A checkpoint of
any of these configs therefore loads into the rebuilt head. Record again only for an intended change::

    python tests/models/test_config_state_dicts.py tests/data/reference/config_state_dicts/digests.json
"""
import glob
import hashlib
import json
import os
import sys
import warnings

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGESTS = os.path.join(REPO_ROOT, 'tests', 'data', 'reference', 'config_state_dicts', 'digests.json')
CONFIG_DIRS = ('configs', 'configs/demo', 'configs/design_notes', 'configs/finetune')


def config_paths(root: str = REPO_ROOT):
    """The configs' paths relative to ``root``."""
    return sorted(os.path.relpath(path, root) for folder in CONFIG_DIRS
                  for path in glob.glob(os.path.join(root, folder, '*.py')))


def state_dict_digest(path: str, root: str = REPO_ROOT) -> dict:
    """``{'entries': N, 'sha256': ...}`` of the ``key<TAB>shape`` lines of the model the config builds."""
    from mmcv import Config
    from mmdet3d.models import build_model

    import projects.mmdet3d_plugin  # noqa: F401
    cfg = Config.fromfile(os.path.join(root, path))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # loss_heatmap of upstream configs
        model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    lines = ''.join(f'{key}\t{",".join(map(str, value.shape))}\n' for key, value in model.state_dict().items())
    return dict(entries=len(model.state_dict()), sha256=hashlib.sha256(lines.encode()).hexdigest())


def test_every_config_is_recorded():
    with open(DIGESTS) as f:
        assert sorted(json.load(f)) == config_paths()


@pytest.mark.slow(seconds=5)
@pytest.mark.parametrize('path', config_paths())
def test_state_dict_keys_and_shapes_equal_the_recorded_ones(path):
    with open(DIGESTS) as f:
        expected = json.load(f)[path]
    assert state_dict_digest(path) == expected, f'{path}: the state dict (keys, shapes or order) changed'


if __name__ == '__main__':
    digests = {path: state_dict_digest(path, os.getcwd()) for path in config_paths(os.getcwd())}
    with open(sys.argv[1], 'w') as f:
        json.dump(digests, f, indent=1, sort_keys=True)
    print(f'wrote {len(digests)} digests to {sys.argv[1]}')
