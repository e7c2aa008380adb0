"""``upgrade_head_config``: the one place where CMT's flat head options become ``CmtHead``'s sub-configs.

Upstream CMT configs, the published configs of this repository and the CMT ->
CMT-AQR recipe write the head flat::

    pts_bbox_head=dict(type='CmtHead', in_channels=512, hidden_dim=256, num_query=900, depth_num=64,
                       downsample_scale=8, scalar=10, noise_scale=1.0, noise_trans=0.0, dn_weight=1.0,
                       split=0.75, norm_bbox=True, common_heads=..., tasks=..., separate_head=...,
                       transformer=..., bbox_coder=..., loss_cls=..., loss_bbox=..., loss_heatmap=...,
                       aqr_config=dict(type='AQRWeightGenerator', ...),
                       attention_bias_config=dict(type='AttentionBiasGenerator', ...), ...)

The registry names ``CmtHead``, ``CmtLidarHead`` and ``CmtImageHead`` build
through this function, so every path that builds a head from a config (the
detector, ``build_head``, tests, tools) accepts both forms. It groups the
flat keys (:data:`GROUPS`: ``task_heads``, ``losses``, ``denoising``,
``routing``, ``passes``, ``camera_aids``), turns the registry name into the
head's token set (``passes['modalities']``: ``CmtLidarHead`` is a ``CmtHead``
with BEV tokens only, ``CmtImageHead`` one with camera tokens only) and
handles the options kept only for old configs: ``norm_bbox`` (must be True),
``loss_heatmap`` (accepted with a warning: CMT computes no heatmap loss),
``init_cfg`` (must be None), the design notes' ``enable_aqr`` switch, and
their renamed keys (refused, naming the key to use). Keys it does not know
are left for ``CmtHead``, which refuses them (``TypeError``).
"""
import logging
import warnings
from typing import Dict, Mapping, Tuple

from ..aqr.design_note_keys import HEAD_RENAMED_KEYS, reject_renamed_keys
from .pass_plan import MODALITIES

#: registry name -> the head's tokens
HEAD_TYPES: Dict[str, Tuple[str, ...]] = dict(CmtHead=MODALITIES, CmtLidarHead=('lidar', ), CmtImageHead=('camera', ))
#: sub-config -> the flat keys it holds
GROUPS: Dict[str, Tuple[str, ...]] = dict(
    task_heads=('tasks', 'common_heads', 'separate_head'),
    losses=('loss_cls', 'loss_bbox'),
    denoising=('scalar', 'noise_scale', 'noise_trans', 'split', 'dn_weight'),
    routing=('aqr_config', 'attention_bias_config', 'modulation', 'weight_renderer_config',
             'feature_modulator_config'),
    passes=('modalities', 'modality_passes', 'pass_decoders', 'lidar_free_pass', 'camera_free_pass'),
    camera_aids=('image_aux_config', 'camera_depth_position', 'camera_window_prior', 'fused_image_drop_prob'),
)
logger = logging.getLogger('mmdet')


def upgrade_head_config(cfg: Mapping) -> dict:
    """A head config in either form -> ``CmtHead``'s arguments, with ``type='CmtHead'`` (see the module docstring).

    Args:
        cfg (Mapping): ``type`` (one of :data:`HEAD_TYPES`, default
            ``'CmtHead'``) and the head's options, flat, grouped or mixed.

    Returns:
        dict: a new config (``cfg`` is not changed); its sub-configs are new dicts.

    Raises:
        ValueError: for an unknown ``type``, a key given both flat and in its
            group, ``norm_bbox=False``, an ``init_cfg``, ``enable_aqr=True``
            without ``aqr_config``, a registry name whose tokens contradict
            ``passes['modalities']``, and the design notes' renamed keys.
    """
    cfg = dict(cfg)
    name = cfg.pop('type', 'CmtHead')
    if name not in HEAD_TYPES:
        raise ValueError(f'unknown CMT head type {name!r}; the CMT heads are {tuple(HEAD_TYPES)}')
    reject_renamed_keys(name, HEAD_RENAMED_KEYS, **{key: cfg.pop(key, None) for key in HEAD_RENAMED_KEYS})
    if not cfg.pop('norm_bbox', True):
        raise ValueError('CMT regresses normalize_bbox codes; norm_bbox=False is not supported')
    if cfg.pop('loss_heatmap', None) is not None:
        warnings.warn(f'{name}: loss_heatmap is accepted for upstream CMT configs but CMT computes no heatmap '
                      f'loss; it is not used')
    init_cfg = cfg.pop('init_cfg', None)
    if init_cfg is not None:
        raise ValueError(f'{name} initialises itself; init_cfg must be None, got {init_cfg}')
    enable_aqr = cfg.pop('enable_aqr', None)
    for group, keys in GROUPS.items():
        grouped = dict(cfg.pop(group, None) or {})
        for key in keys:
            if key in cfg and key in grouped:
                raise ValueError(f'{name}: {key} is given both flat and in {group}; give it once')
            if key in cfg:
                grouped[key] = cfg.pop(key)
        cfg[group] = grouped
    _apply_enable_aqr(name, cfg['routing'], enable_aqr)
    modalities = cfg['passes'].setdefault('modalities', HEAD_TYPES[name])
    if name != 'CmtHead' and tuple(modalities) != HEAD_TYPES[name]:
        raise ValueError(f'{name} has the tokens {HEAD_TYPES[name]}; passes.modalities={tuple(modalities)} '
                         f'contradicts it (use CmtHead)')
    return dict(type='CmtHead', **cfg)


def _apply_enable_aqr(name: str, routing: dict, enable_aqr) -> None:
    """The design notes' switch: None: AQR iff ``aqr_config``; True: ``aqr_config`` required; False: plain CMT
    (the AQR configs are dropped from ``routing``, logged)."""
    if enable_aqr not in (None, True, False):
        raise ValueError(f'{name}: enable_aqr must be True, False or None, got {enable_aqr!r}')
    if enable_aqr and routing.get('aqr_config') is None:
        raise ValueError(f"{name}: enable_aqr=True needs aqr_config, e.g. dict(type='AQRWeightGenerator', "
                         f"window_sizes=[15, 5])")
    if enable_aqr is False:
        configs = ('aqr_config', 'attention_bias_config', 'weight_renderer_config', 'feature_modulator_config')
        present = [key for key in configs if routing.pop(key, None) is not None]
        if present:
            logger.info(f'{name}: enable_aqr=False, so {", ".join(present)} are not built: plain CMT')
