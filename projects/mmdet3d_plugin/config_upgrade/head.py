"""``upgrade_head_config``: a CMT head config in upstream CMT's flat form -> ``CmtHead``'s sub-configs.

Upstream CMT configs, the published configs of this repository and the CMT ->
CMT-AQR recipe write the head flat::

    pts_bbox_head=dict(type='CmtHead', in_channels=512, hidden_dim=256, num_query=900, depth_num=64,
                       downsample_scale=8, scalar=10, noise_scale=1.0, ..., norm_bbox=True, tasks=...,
                       transformer=..., bbox_coder=..., loss_cls=..., loss_bbox=..., loss_heatmap=...,
                       aqr_config=dict(type='AQRWeightGenerator', ...), ...)

``CmtHead`` takes its options grouped (:data:`.legacy_keys.HEAD_GROUPS`:
``task_heads``, ``losses``, ``denoising``, ``routing``, ``passes``,
``aids``). This moves every flat key into its group (and the keys of the
earlier groups ``camera_aids`` / ``lidar_aids`` into ``aids``), turns the
registry names ``CmtLidarHead`` / ``CmtImageHead`` into ``CmtHead`` with
``passes['modalities']`` ``('lidar',)`` / ``('camera',)``, drops the options
kept only for old configs (``norm_bbox=True``, ``loss_heatmap`` with a warning,
``init_cfg=None``) and applies the design notes' ``enable_aqr`` switch. Keys it
does not know are left for ``CmtHead``, which refuses them (``TypeError``).
"""
import warnings
from typing import Dict, Mapping, Optional, Tuple

from .legacy_keys import HEAD_GROUPS, RENAMED_HEAD_GROUPS, LegacyKeyError, log_rewrite, refuse

#: the head's registry names -> the tokens the name implies (None: whatever ``passes`` says)
HEAD_TYPES: Dict[str, Optional[Tuple[str, ...]]] = dict(CmtHead=None, CmtLidarHead=('lidar', ),
                                                        CmtImageHead=('camera', ))
AQR_CONFIGS = ('aqr_config', 'attention_bias_config', 'weight_renderer_config', 'feature_modulator_config')


def upgrade_head_config(cfg: Mapping, where: str = 'pts_bbox_head') -> dict:
    """A head config, flat, grouped or mixed -> ``CmtHead``'s arguments with ``type='CmtHead'``.

    Args:
        cfg (Mapping): ``type`` (one of :data:`HEAD_TYPES`, default ``'CmtHead'``) and the head's options.
        where (str): the config path of ``cfg``, for the log lines and messages.

    Returns:
        dict: a new config (``cfg`` is not changed); a group it fills is a new dict.

    Raises:
        ValueError: for an unknown ``type``, a key given both flat and in its
            group with different values (dicts: any value they both give),
            ``norm_bbox=False``, an ``init_cfg``, ``enable_aqr=True`` without
            ``aqr_config``, a legacy name whose tokens contradict
            ``passes['modalities']``, and the design notes' renamed keys
            (:class:`.legacy_keys.LegacyKeyError`, naming the key to use).
    """
    cfg = dict(cfg)
    name = cfg.setdefault('type', 'CmtHead')
    if name not in HEAD_TYPES:
        raise ValueError(f'unknown CMT head type {name!r}; the CMT heads are {tuple(HEAD_TYPES)}')
    refuse(where, cfg, 'CmtHead')
    _drop_old_options(cfg, name, where)
    enable_aqr = cfg.pop('enable_aqr', None)
    for old_group, group in RENAMED_HEAD_GROUPS.items():
        if old_group in cfg:
            _move_into_group(cfg, group, dict(cfg.pop(old_group) or {}), f'{where}.{old_group}.', where)
            log_rewrite(f'{where}.{old_group}.*', f'{where}.{group}.*')
    for group, keys in HEAD_GROUPS.items():
        flat = [key for key in keys if key in cfg]
        if not flat:
            continue
        _move_into_group(cfg, group, {key: cfg.pop(key) for key in flat}, f'{where}.', where)
        old = flat[0] if len(flat) == 1 else f'{{{", ".join(flat)}}}'
        log_rewrite(f'{where}.{old}', f'{where}.{group}.*')
    if enable_aqr is not None:
        _apply_enable_aqr(cfg, enable_aqr, where)
    if HEAD_TYPES[name] is not None:
        passes = dict(cfg.get('passes') or {})
        modalities = tuple(passes.setdefault('modalities', HEAD_TYPES[name]))
        if modalities != HEAD_TYPES[name]:
            raise ValueError(f'{name} has the tokens {HEAD_TYPES[name]}; passes.modalities={modalities} '
                             f'contradicts it (use CmtHead)')
        cfg.update(type='CmtHead', passes=passes)
        log_rewrite(f"{where}.type='{name}'", f"{where}.type='CmtHead', {where}.passes.modalities={modalities}")
    return cfg


def _move_into_group(cfg: dict, group: str, values: Mapping, old_prefix: str, where: str) -> None:
    """Put ``values`` (key -> value, each from ``<old_prefix><key>``) into ``cfg[group]``, a new dict, merging a key
    the group already has (:func:`_merge_flat_into_group`)."""
    grouped = dict(cfg.get(group) or {})
    for key, value in values.items():
        grouped[key] = _merge_flat_into_group(value, grouped[key], f'{old_prefix}{key}', f'{where}.{group}.{key}') \
            if key in grouped else value
    cfg[group] = grouped


def _merge_flat_into_group(flat, grouped, flat_path: str, group_path: str):
    """One value of a key given both flat and in its group.

    ``--cfg-options <flat path>.<option>=...`` re-applied to a config dumped after the upgrade makes a flat dict of the
    options given, beside the grouped whole: a dict merges into the grouped one where every value it gives is the
    grouped one's (recursively); any other difference is an error naming the grouped path to use.
    """
    if isinstance(flat, Mapping) and isinstance(grouped, Mapping):
        merged = dict(grouped)
        for option, value in flat.items():
            merged[option] = _merge_flat_into_group(value, grouped[option], f'{flat_path}.{option}',
                                                    f'{group_path}.{option}') if option in grouped else value
        return merged
    if flat != grouped:
        raise ValueError(f'{flat_path} and {group_path} are both given, with different values ({flat!r} and '
                         f'{grouped!r}); give it once, as {group_path}')
    return grouped


def _drop_old_options(cfg: dict, name: str, where: str) -> None:
    """``norm_bbox`` (must be True), ``loss_heatmap`` (warned: unused), ``init_cfg`` (must be None)."""
    if 'norm_bbox' in cfg:
        if not cfg.pop('norm_bbox'):
            raise ValueError('CMT regresses normalize_bbox codes; norm_bbox=False is not supported')
        log_rewrite(f'{where}.norm_bbox=True', 'removed (the head always regresses normalize_bbox codes)')
    if 'loss_heatmap' in cfg and cfg.pop('loss_heatmap') is not None:
        warnings.warn(f'{name}: loss_heatmap is accepted for upstream CMT configs but CMT computes no heatmap '
                      f'loss; it is not used')
    if 'init_cfg' in cfg:
        init_cfg = cfg.pop('init_cfg')
        if init_cfg is not None:
            raise ValueError(f'{name} initialises itself; init_cfg must be None, got {init_cfg}')


def _apply_enable_aqr(cfg: dict, enable_aqr, where: str) -> None:
    """The design notes' switch: True: ``aqr_config`` required; False: plain CMT (the AQR configs are dropped)."""
    if enable_aqr not in (True, False):
        raise LegacyKeyError(f'{where}: enable_aqr must be True, False or None, got {enable_aqr!r}')
    routing = dict(cfg.get('routing') or {})
    if enable_aqr and routing.get('aqr_config') is None:
        raise LegacyKeyError(f"{where}: enable_aqr=True needs aqr_config, e.g. routing=dict(aqr_config=dict("
                             f"type='AQRWeightGenerator', window_sizes=[15, 5]))")
    if enable_aqr:
        log_rewrite(f'{where}.enable_aqr=True', 'removed (aqr_config is given, so AQR is on)')
        return
    present = [key for key in AQR_CONFIGS if routing.pop(key, None) is not None]
    cfg['routing'] = routing
    log_rewrite(f'{where}.enable_aqr=False', f'removed, plain CMT; not built: {", ".join(present) or "-"}')
