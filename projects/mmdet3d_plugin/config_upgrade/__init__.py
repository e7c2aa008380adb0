"""Config upgrade: every renamed or legacy config key rewritten to its current key, or refused.

What belongs here: the old vocabularies a config may still be written in
(upstream CMT's flat head keys and registry aliases, the design notes' keys
such as ``enable_aqr``, ``encoder_config``, ``use_flashbias``, ``pts_head``)
and their translation into the keys the runtime classes take. Nothing here
builds or runs a model, and nothing imports the models, so config loading
(``mmcv_custom.launch.load_config``) and the detector can both call it.

* :func:`upgrade_model_config`: a model config (or any part of it) -> the
  same config in current keys, one log line per rewrite;
* :data:`LEGACY_KEYS` / :data:`LEGACY_TYPES`: the table of legacy keys and names;
* :func:`current_keys_only` / :func:`register_legacy_types`: how the runtime
  classes refuse a legacy key or name, naming the current one and the upgrade.
"""
from .head import upgrade_head_config
from .legacy_keys import (LEGACY_KEYS, LEGACY_TYPES, LegacyKeyError, current_keys_only,
                          register_legacy_types)
from .upgrade import upgrade_model_config

__all__ = [
    'LEGACY_KEYS', 'LEGACY_TYPES', 'LegacyKeyError', 'current_keys_only', 'register_legacy_types',
    'upgrade_head_config', 'upgrade_model_config'
]
