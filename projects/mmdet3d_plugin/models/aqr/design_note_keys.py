"""Keys of the design notes (``../shared/seeds``) that have another form in this plugin.

A config written in the notes' vocabulary must never load with such a key
silently ignored: the modules that own these keys accept them only to raise a
``ValueError`` naming the key to use instead (:func:`reject_renamed_keys`).
"""
from typing import Dict

#: ``CmtHead`` keys of the notes -> what to write here.
HEAD_RENAMED_KEYS = dict(
    renderer_config="weight_renderer_config (with modulation='feature')",
    modulator_config="feature_modulator_config (with modulation='feature')",
    aqr_bias_strength="attention_bias_config=dict(type='AttentionBiasGenerator', bias_scale=...)",
    aqr_use_local_bias="attention_bias_config=dict(type='AttentionBiasGenerator', use_local_bias=...)")
#: ``AttentionBiasGenerator`` keys of the notes -> what to write here.
BIAS_GENERATOR_RENAMED_KEYS = dict(
    bias_strength='bias_scale (the initial alpha)',
    bev_feature_shape='nothing: the BEV grid size is read from the BEV feature tensor at run time',
    pers_feature_shape='nothing: the number of views and the camera grid size are read from the image feature '
    'tensor at run time')


def reject_renamed_keys(owner: str, renamed: Dict[str, str], **given) -> None:
    """Raise for a design-notes key that has another form here.

    Args:
        owner (str): the class name, for the message.
        renamed (dict[str, str]): key of the notes -> what to use instead.
        **given: those keys as the config gave them (``None`` = absent).

    Raises:
        ValueError: naming the first key given and the form to use instead.
    """
    for key, value in given.items():
        if value is not None:
            raise ValueError(f'{owner}: {key} is a key of the design notes that has another form here; use '
                             f'{renamed[key]} instead')
