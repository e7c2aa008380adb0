"""Layer normalisation over channel groups of a 1D sequence (CMT's ``GroupLayerNorm1d``)."""
import torch
from torch import nn


class GroupLayerNorm1d(nn.Module):
    """Normalise each of ``groups`` channel groups of ``[N, C, L]`` over its channels.

    For every sample ``n``, position ``l`` and group ``g`` the ``C / groups``
    channels are normalised to zero mean and unit (biased) variance, then an
    affine ``weight[c] * y + bias[c]`` per channel is applied. With
    ``groups = num_decoder_layers`` this is a LayerNorm of each decoder layer's
    features in a grouped-convolution head.

    Args:
        channels (int): C.
        groups (int): number of groups; must divide C.
        eps (float): added to the variance.
    """

    def __init__(self, channels: int, groups: int = 1, eps: float = 1e-6) -> None:
        super().__init__()
        if channels % groups:
            raise ValueError(f'GroupLayerNorm1d: {groups} groups do not divide {channels} channels')
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.groups = groups
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, C, L]`` -> ``[N, C, L]``."""
        n, c, length = x.shape
        grouped = x.view(n, self.groups, c // self.groups, length)
        mean = grouped.mean(dim=2, keepdim=True)
        var = (grouped - mean).pow(2).mean(dim=2, keepdim=True)
        normed = ((grouped - mean) / (var + self.eps).sqrt()).view(n, c, length)
        return normed * self.weight.view(1, c, 1) + self.bias.view(1, c, 1)

    def extra_repr(self) -> str:
        return f'{self.weight.numel()}, groups={self.groups}, eps={self.eps}'
