"""``PerLayer``: one cross-attention bias (or any mask) per decoder layer.

Put it in the decoder's ``attn_masks``: ``PETRTransformerDecoder`` hands layer
``i`` element ``i`` (and raises when the length differs from its number of
layers). :func:`~.bias.restrict_keys` cuts each element to a key range and
keeps the type. Input: ``L`` biases, each over the same ``[Q, K]``
queries and keys (``AttentionBias``, a ``[..., Q, K]`` tensor or None).
"""


class PerLayer(tuple):
    """One value per decoder layer, e.g. a cross-attention bias with a learned scale per layer."""
