"""``upgrade_model_config``: every legacy key of a model config rewritten to its current key, or refused.

The walk visits every dict of the config; a dict whose ``type`` has legacy
keys (:data:`.legacy_keys.LEGACY_KEYS`, :data:`.legacy_keys.LEGACY_TYPES`)
goes through that type's rule before its values are visited, so a rule's
output (e.g. the head's ``routing`` group) is upgraded in turn. Each rewrite
logs one line (``config upgrade: <old> -> <new>``); a key that cannot be
rewritten raises a :class:`.legacy_keys.LegacyKeyError` naming the key to use.
A config in current keys comes back as the same objects, without a log line.
"""
from typing import Any, Callable, Dict, Mapping

from .head import HEAD_TYPES, upgrade_head_config
from .legacy_keys import LegacyKeyError, log_rewrite, refuse
from .routing_layer import upgrade_weight_generator


def _upgrade_detector(cfg: dict, where: str) -> dict:
    refuse(where, cfg, 'CmtDetector')
    return cfg


def _upgrade_flash_attention(cfg: dict, where: str) -> dict:
    """``use_flashbias=True`` -> ``prefer='flashbias'``; ``use_flashbias=False`` -> removed."""
    if 'use_flashbias' not in cfg:
        return cfg
    use_flashbias = cfg.pop('use_flashbias')
    if not use_flashbias:
        log_rewrite(f'{where}.use_flashbias=False', 'removed')
        return cfg
    if cfg.get('prefer', 'flashbias') != 'flashbias':
        raise LegacyKeyError(f"{where}: use_flashbias=True and prefer={cfg['prefer']!r} disagree; give prefer only")
    cfg['prefer'] = 'flashbias'
    log_rewrite(f'{where}.use_flashbias=True', f"{where}.prefer='flashbias'")
    return cfg


def _upgrade_attention(cfg: dict, where: str) -> dict:
    refuse(where, cfg, 'PETRMultiheadAttention')
    return cfg


def _upgrade_weight_generator(cfg: dict, where: str) -> dict:
    return upgrade_weight_generator(cfg, where) if 'encoder_config' in cfg else cfg


def _upgrade_bias_generator(cfg: dict, where: str) -> dict:
    refuse(where, cfg, 'AttentionBiasGenerator')
    return cfg


def _upgrade_transformer(cfg: dict, where: str) -> dict:
    log_rewrite(f"{where}.type='{cfg['type']}'", f"{where}.type='CmtTransformer'")
    return dict(cfg, type='CmtTransformer')


#: config ``type`` -> its rule: (config copy, path) -> the upgraded config
RULES: Dict[str, Callable[[dict, str], dict]] = dict(
    CmtDetector=_upgrade_detector,
    PETRMultiheadFlashAttention=_upgrade_flash_attention,
    PETRMultiheadAttention=_upgrade_attention,
    AQRWeightGenerator=_upgrade_weight_generator,
    AttentionBiasGenerator=_upgrade_bias_generator,
    CmtLidarTransformer=_upgrade_transformer,
    CmtImageTransformer=_upgrade_transformer,
    **{name: upgrade_head_config for name in HEAD_TYPES},
)


def upgrade_model_config(cfg: Any, where: str = 'model') -> Any:
    """``cfg`` with every legacy key rewritten to its current key (one log line each).

    Args:
        cfg (Mapping | list | tuple | Any): a model config (``cfg.model`` of
            an mmcv ``Config``) or any part of it (a head, an attention, ...);
            other values are returned as they are.
        where (str): the config path of ``cfg``, for the log lines and messages.

    Returns:
        The upgraded config: new dicts (of ``cfg``'s dict class) where a key
        changed, the given objects where nothing did; ``cfg`` is not changed.

    Raises:
        LegacyKeyError: a legacy key that cannot be rewritten, naming the key to use.
        ValueError: a value the current key cannot take (e.g. ``norm_bbox=False``).
    """
    if isinstance(cfg, Mapping):
        name = cfg.get('type')
        rule = RULES.get(name) if isinstance(name, str) else None
        upgraded = rule(dict(cfg), where) if rule is not None else cfg
        items = {key: upgrade_model_config(value, f'{where}.{key}') for key, value in upgraded.items()}
        if items.keys() == cfg.keys() and all(items[key] is value for key, value in cfg.items()):
            return cfg
        return type(cfg)(items)
    if isinstance(cfg, (list, tuple)):
        items = [upgrade_model_config(value, f'{where}[{index}]') for index, value in enumerate(cfg)]
        return cfg if all(new is old for new, old in zip(items, cfg)) else type(cfg)(items)
    return cfg
