"""Every legacy config key and registry name, with the current form to write instead.

One table (:data:`LEGACY_KEYS`, :data:`LEGACY_TYPES`) serves both sides:
:func:`..upgrade.upgrade_model_config` rewrites what it can and refuses the
rest with these names, and the runtime classes, which take current keys only,
refuse a legacy key that reaches them (:func:`current_keys_only`,
:func:`register_legacy_types`) with the same names and a pointer to the upgrade.
"""
import functools
import logging
from typing import Callable, Dict, Iterable, Mapping, NamedTuple

UPGRADE_FUNCTION = 'projects.mmdet3d_plugin.config_upgrade.upgrade_model_config'
logger = logging.getLogger('mmdet')


class LegacyKey(NamedTuple):
    """What to write instead of a legacy key, and whether the upgrade rewrites it (else it refuses)."""

    current: str
    rewritten: bool


#: ``CmtHead`` sub-config -> the flat keys (upstream CMT's form) it holds
HEAD_GROUPS: Dict[str, tuple] = dict(
    task_heads=('tasks', 'common_heads', 'separate_head'),
    losses=('loss_cls', 'loss_bbox'),
    denoising=('scalar', 'noise_scale', 'noise_trans', 'split', 'dn_weight'),
    routing=('aqr_config', 'attention_bias_config', 'modulation', 'weight_renderer_config',
             'feature_modulator_config'),
    passes=('modalities', 'modality_passes', 'pass_decoders', 'lidar_free_pass', 'camera_free_pass'),
    aids=('image_aux_config', 'camera_depth_position', 'camera_window_prior', 'fused_image_drop_prob',
          'bev_aux_config'),
)
#: ``CmtHead`` sub-configs of earlier versions (in configs dumped by their runs) -> the sub-config that holds their
#: keys now
RENAMED_HEAD_GROUPS: Dict[str, str] = dict(camera_aids='aids', lidar_aids='aids')
#: the design notes' head keys that have another form here
HEAD_RENAMED_KEYS: Dict[str, LegacyKey] = dict(
    renderer_config=LegacyKey("routing=dict(weight_renderer_config=..., modulation='feature')", False),
    modulator_config=LegacyKey("routing=dict(feature_modulator_config=..., modulation='feature')", False),
    aqr_bias_strength=LegacyKey("routing=dict(attention_bias_config=dict(type='AttentionBiasGenerator', "
                                "bias_scale=...))", False),
    aqr_use_local_bias=LegacyKey("routing=dict(attention_bias_config=dict(type='AttentionBiasGenerator', "
                                 "use_local_bias=...))", False),
)
#: owner type -> legacy key -> what to write instead
LEGACY_KEYS: Dict[str, Dict[str, LegacyKey]] = dict(
    CmtDetector=dict(pts_head=LegacyKey("pts_bbox_head=dict(type='CmtHead', ...)", False)),
    CmtHead=dict(
        {key: LegacyKey(f'{group}=dict({key}=...)', True) for group, keys in HEAD_GROUPS.items() for key in keys},
        **{old: LegacyKey(f'{group}=dict(...)', True) for old, group in RENAMED_HEAD_GROUPS.items()},
        enable_aqr=LegacyKey('routing=dict(aqr_config=...) (AQR is on iff aqr_config is given)', True),
        norm_bbox=LegacyKey('nothing (the head always regresses normalize_bbox codes)', True),
        loss_heatmap=LegacyKey('nothing (CMT computes no heatmap loss)', True),
        init_cfg=LegacyKey('nothing (the head initialises itself)', True),
        **HEAD_RENAMED_KEYS),
    PETRMultiheadFlashAttention=dict(use_flashbias=LegacyKey("prefer='flashbias'", True)),
    PETRMultiheadAttention=dict(use_flashbias=LegacyKey("type='PETRMultiheadFlashAttention', prefer='flashbias'",
                                                        False)),
    AQRWeightGenerator=dict(encoder_config=LegacyKey('embed_dims, num_heads, feedforward_channels, dropout', True)),
    AttentionBiasGenerator=dict(
        bias_strength=LegacyKey('bias_scale (the initial alpha)', False),
        bev_feature_shape=LegacyKey('nothing: the BEV grid size is read from the BEV feature tensor at run time',
                                    False),
        pers_feature_shape=LegacyKey('nothing: the number of views and the camera grid size are read from the image '
                                     'feature tensor at run time', False)),
)
#: legacy registry name -> the current type (and options) it stands for
LEGACY_TYPES: Dict[str, str] = dict(
    CmtLidarHead="type='CmtHead', passes=dict(modalities=('lidar', ))",
    CmtImageHead="type='CmtHead', passes=dict(modalities=('camera', ))",
    CmtLidarTransformer="type='CmtTransformer'",
    CmtImageTransformer="type='CmtTransformer'",
)


class LegacyKeyError(ValueError):
    """A legacy key or registry name that has to be written in its current form."""


def legacy_key_message(where: str, key: str, legacy: LegacyKey) -> str:
    """``'<where>.<key> is a legacy key; use <current> (...)'``, naming the upgrade when it rewrites the key."""
    how = (f'{UPGRADE_FUNCTION} rewrites it' if legacy.rewritten else
           f'{UPGRADE_FUNCTION} cannot rewrite it')
    return f'{where}.{key} is a legacy key; use {legacy.current} instead ({how})'


def log_rewrite(old: str, new: str) -> None:
    """The one log line of a rewrite: ``config upgrade: <old> -> <new>``."""
    logger.info(f'config upgrade: {old} -> {new}')


def current_keys_only(cls: type) -> type:
    """Class decorator: a key of :data:`LEGACY_KEYS` given to ``cls`` raises a :class:`LegacyKeyError`.

    Raises at construction, before ``cls.__init__`` runs, naming the key to
    use and :data:`UPGRADE_FUNCTION`.
    """
    legacy = LEGACY_KEYS[cls.__name__]
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        for key in kwargs:
            if key in legacy:
                raise LegacyKeyError(legacy_key_message(cls.__name__, key, legacy[key]))
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def _refusing_builder(name: str) -> Callable:
    def build(*args, **kwargs):
        raise LegacyKeyError(f"type='{name}' is a legacy registry name; use {LEGACY_TYPES[name]} instead "
                             f'({UPGRADE_FUNCTION} rewrites it)')

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f'Legacy name: refused, naming {LEGACY_TYPES[name]}.'
    return build


def register_legacy_types(registry, names: Iterable[str]) -> None:
    """Register, under each legacy name of ``names``, a builder that raises naming the current type.

    Configs that still say the name get a message instead of "not in the
    registry"; :data:`UPGRADE_FUNCTION` rewrites the name before building.
    """
    for name in names:
        registry.register_module(name=name, module=_refusing_builder(name))


def refuse(where: str, cfg: Mapping, owner: str) -> None:
    """Raise for the first key of ``cfg`` that the upgrade cannot rewrite for ``owner``."""
    for key, legacy in LEGACY_KEYS[owner].items():
        if key in cfg and not legacy.rewritten:
            raise LegacyKeyError(legacy_key_message(where, key, legacy))
