"""Rewrite the design notes' ``encoder_config`` of ``AQRWeightGenerator`` into the generator's sizes.

The design notes describe the routing layer as an mmcv encoder config::

    encoder_config=dict(
        type='DetrTransformerEncoder', num_layers=1,
        transformerlayers=dict(
            type='BaseTransformerLayer',
            attn_cfgs=[dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8,
                            dropout=0.1, use_flashbias=True)],
            feedforward_channels=1024, ffn_dropout=0.1,
            operation_order=('cross_attn', 'norm', 'ffn', 'norm')))

The routing layer is exactly that: one post-norm layer (attention -> norm ->
FFN -> norm) whose attention is standard multi-head dot-product attention, run
over each query's gathered window tokens. :func:`routing_layer_args` reads the
generator's ``embed_dims``, ``num_heads``, ``feedforward_channels`` and
``dropout`` from such a config and rejects, naming the key, everything the
layer cannot honour (another attention type, more layers, another operation
order, activation or norm), so no key is silently ignored;
:func:`upgrade_weight_generator` writes them into the generator's config.
"""
from typing import Any, Dict, List, Mapping, Optional

from .legacy_keys import log_rewrite

ATTENTION_TYPES = ('PETRMultiheadFlashAttention', 'PETRMultiheadAttention', 'MultiheadAttention')
ENCODER_TYPES = ('DetrTransformerEncoder', 'TransformerLayerSequence')
LAYER_TYPES = ('BaseTransformerLayer', )
OPERATION_ORDER = ('cross_attn', 'norm', 'ffn', 'norm')
PREFIX = 'encoder_config'


def _check_keys(cfg: dict, allowed: tuple, where: str) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(f'{where}: unsupported key(s) {unknown} for the AQR routing layer; supported: '
                         f'{sorted(allowed)}')


def _check_value(cfg: dict, key: str, allowed: tuple, where: str) -> None:
    if key in cfg and cfg[key] not in allowed:
        raise ValueError(f'{where}.{key}={cfg[key]!r} is not supported by the AQR routing layer; use one of '
                         f'{list(allowed)}')


def _single(value: Any, where: str) -> dict:
    """The one dict of ``value`` (a dict or a one-element list of dicts)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f'{where} must hold exactly one config (the routing layer has one attention), '
                             f'got {len(value)}')
        value = value[0]
    if not isinstance(value, dict):
        raise ValueError(f'{where} must be a dict, got {type(value).__name__}')
    return value


def _attention_args(attn: dict, where: str, dropouts: List[float]) -> Dict[str, Any]:
    _check_keys(attn, ('type', 'embed_dims', 'num_heads', 'dropout', 'attn_drop', 'proj_drop', 'batch_first',
                       'use_flashbias', 'backend'), where)
    _check_value(attn, 'type', ATTENTION_TYPES, where)
    _check_value(attn, 'backend', ('auto', ), where)
    if 'num_heads' not in attn:
        raise ValueError(f'{where}.num_heads is required')
    if 'use_flashbias' in attn and attn.get('type') != 'PETRMultiheadFlashAttention':
        raise ValueError(f"{where}.use_flashbias is an option of type='PETRMultiheadFlashAttention', not "
                         f"{attn.get('type')!r}")
    dropouts.extend(attn[key] for key in ('dropout', 'attn_drop', 'proj_drop') if key in attn)
    args = dict(num_heads=attn['num_heads'], use_flashbias=bool(attn.get('use_flashbias', False)))
    if 'embed_dims' in attn:
        args['embed_dims'] = attn['embed_dims']
    return args


def _ffn_args(layer: dict, where: str, dropouts: List[float]) -> Dict[str, Any]:
    ffn = _single(layer['ffn_cfgs'], f'{where}.ffn_cfgs') if 'ffn_cfgs' in layer else {}
    ffn_where = f'{where}.ffn_cfgs'
    _check_keys(ffn, ('type', 'embed_dims', 'feedforward_channels', 'ffn_drop', 'num_fcs', 'act_cfg'), ffn_where)
    _check_value(ffn, 'type', ('FFN', ), ffn_where)
    _check_value(ffn, 'num_fcs', (2, ), ffn_where)
    if 'act_cfg' in ffn and ffn['act_cfg'].get('type') != 'ReLU':
        raise ValueError(f'{ffn_where}.act_cfg={ffn["act_cfg"]!r} is not supported by the AQR routing layer; use '
                         f"dict(type='ReLU')")
    channels = [c for c in (layer.get('feedforward_channels'), ffn.get('feedforward_channels')) if c is not None]
    if len(set(channels)) > 1:
        raise ValueError(f'{where}.feedforward_channels={channels[0]} and {ffn_where}.feedforward_channels='
                         f'{channels[1]} disagree')
    dropouts.extend(d for d in (layer.get('ffn_dropout'), ffn.get('ffn_drop')) if d is not None)
    args = dict(feedforward_channels=channels[0]) if channels else {}
    if 'embed_dims' in ffn:
        args['embed_dims'] = ffn['embed_dims']
    return args


def _merge_embed_dims(*parts: Dict[str, Any]) -> Optional[int]:
    dims = {part['embed_dims'] for part in parts if 'embed_dims' in part}
    if len(dims) > 1:
        raise ValueError(f'{PREFIX}: the attention and the FFN disagree on embed_dims: {sorted(dims)}')
    return dims.pop() if dims else None


def routing_layer_args(encoder_config: dict) -> Dict[str, Any]:
    """``AQRWeightGenerator`` arguments described by an mmcv encoder config.

    Args:
        encoder_config (dict): an encoder (``type`` in :data:`ENCODER_TYPES`,
            ``num_layers=1``, ``transformerlayers``) or directly the layer
            config (``type='BaseTransformerLayer'``, ``attn_cfgs``,
            ``feedforward_channels`` / ``ffn_cfgs``, ``ffn_dropout``,
            ``operation_order``, ``norm_cfg``, ``batch_first``).

    Returns:
        dict: ``num_heads``, ``use_flashbias`` and, where the config gives
        them, ``embed_dims``, ``feedforward_channels`` and ``dropout`` (one
        rate: the routing layer uses the same dropout on the attention
        probabilities, the attention output and the FFN).

    Raises:
        ValueError: a key or value the routing layer cannot honour; the
            message names it (e.g. ``encoder_config.transformerlayers.attn_cfgs[0].type``).
    """
    if not isinstance(encoder_config, dict):
        raise ValueError(f'{PREFIX} must be a dict, got {type(encoder_config).__name__}')
    if encoder_config.get('type') in LAYER_TYPES:
        layer, where = encoder_config, PREFIX
    else:
        _check_keys(encoder_config, ('type', 'num_layers', 'transformerlayers', 'post_norm_cfg'), PREFIX)
        _check_value(encoder_config, 'type', ENCODER_TYPES, PREFIX)
        _check_value(encoder_config, 'num_layers', (1, ), PREFIX)
        _check_value(encoder_config, 'post_norm_cfg', (None, ), PREFIX)
        if 'transformerlayers' not in encoder_config:
            raise ValueError(f'{PREFIX}.transformerlayers is required (the routing layer config)')
        where = f'{PREFIX}.transformerlayers'
        layer = _single(encoder_config['transformerlayers'], where)
    _check_keys(layer, ('type', 'attn_cfgs', 'feedforward_channels', 'ffn_dropout', 'ffn_cfgs', 'operation_order',
                        'norm_cfg', 'batch_first'), where)
    _check_value(layer, 'type', LAYER_TYPES, where)
    if 'operation_order' in layer and tuple(layer['operation_order']) != OPERATION_ORDER:
        raise ValueError(f'{where}.operation_order={tuple(layer["operation_order"])} is not supported: the AQR '
                         f'routing layer is {OPERATION_ORDER} (queries attend to their memory windows)')
    if 'norm_cfg' in layer and layer['norm_cfg'].get('type') != 'LN':
        raise ValueError(f"{where}.norm_cfg={layer['norm_cfg']!r} is not supported; use dict(type='LN')")
    if 'attn_cfgs' not in layer:
        raise ValueError(f'{where}.attn_cfgs is required (the routing attention: type, embed_dims, num_heads)')
    dropouts: List[float] = []
    attention = _attention_args(_single(layer['attn_cfgs'], f'{where}.attn_cfgs'), f'{where}.attn_cfgs[0]',
                                dropouts)
    ffn = _ffn_args(layer, where, dropouts)
    if len(set(dropouts)) > 1:
        raise ValueError(f'{PREFIX}: the routing layer uses one dropout rate for attention and FFN, got '
                         f'{dropouts}; set them equal')
    args = dict(num_heads=attention['num_heads'], use_flashbias=attention['use_flashbias'])
    embed_dims = _merge_embed_dims(attention, ffn)
    if embed_dims is not None:
        args['embed_dims'] = embed_dims
    if 'feedforward_channels' in ffn:
        args['feedforward_channels'] = ffn['feedforward_channels']
    if dropouts:
        args['dropout'] = dropouts[0]
    return args


def upgrade_weight_generator(cfg: Mapping, where: str) -> dict:
    """An ``AQRWeightGenerator`` config with ``encoder_config`` -> the same config with the sizes it gives.

    Args:
        cfg (Mapping): the generator's config, with ``encoder_config``.
        where (str): its config path, for the log line and the messages.

    Returns:
        dict: a new config without ``encoder_config`` and with the
        ``embed_dims``, ``num_heads``, ``feedforward_channels`` and
        ``dropout`` the encoder config sets (see :func:`routing_layer_args`).

    Raises:
        ValueError: a key or value the routing layer cannot honour, or a size
            given both directly and in ``encoder_config`` with different values.
    """
    cfg = dict(cfg)
    from_config = routing_layer_args(cfg.pop('encoder_config'))
    use_flashbias = from_config.pop('use_flashbias')
    for name, configured in from_config.items():
        value = cfg.setdefault(name, configured)
        if value != configured:
            raise ValueError(f'{where}: {name}={value} but encoder_config sets {name}={configured}; give it once')
    sizes = ', '.join(f'{name}={value}' for name, value in from_config.items())
    dropped = (' (use_flashbias dropped: the routing layer applies its local window mask by gathering each '
               'query\'s window tokens, there is no bias for flashbias to apply)' if use_flashbias else '')
    log_rewrite(f'{where}.encoder_config', f'{where}.{{{sizes}}}{dropped}')
    return cfg
