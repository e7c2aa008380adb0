"""CPFPN: a Feature Pyramid Network whose only 3x3 output conv is on the finest level.

CMT (like PETR) uses only the finest FPN level, so the 3x3 output convs of the
coarser levels would be parameters without gradient, which breaks
``with_cp`` / DDP training. CPFPN keeps the FPN top-down path (1x1 lateral
convs, nearest upsampling and addition) but builds the 3x3 conv for the first
level only; the other levels are returned as their lateral maps. Parameter
names equal mmdet's ``FPN`` (``lateral_convs.{i}.conv.*``, ``fpn_convs.0.conv.*``).
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmcv.runner import BaseModule, auto_fp16
from mmdet.models.builder import NECKS


@NECKS.register_module()
class CPFPN(BaseModule):
    """FPN without the unused output convs of the coarse levels.

    Args:
        in_channels (Sequence[int]): channels of each input level.
        out_channels (int): channels of every output level.
        num_outs (int): number of outputs; levels beyond the used inputs are
            made by stride-2 max-pooling of the last output.
        start_level (int): first input level used.
        end_level (int): last input level used (exclusive); -1 for all.
        no_norm_on_lateral (bool): build the lateral convs without norm.
        conv_cfg (dict, optional): conv config of the ConvModules.
        norm_cfg (dict, optional): norm config of the ConvModules.
        act_cfg (dict, optional): activation config of the ConvModules.
        upsample_cfg (dict): ``F.interpolate`` arguments of the top-down path.
        init_cfg (dict): mmcv initialisation config.
    """

    def __init__(self,
                 in_channels: Sequence[int],
                 out_channels: int,
                 num_outs: int,
                 start_level: int = 0,
                 end_level: int = -1,
                 no_norm_on_lateral: bool = False,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: Optional[dict] = None,
                 act_cfg: Optional[dict] = None,
                 upsample_cfg: dict = dict(mode='nearest'),
                 init_cfg: dict = dict(type='Xavier', layer='Conv2d', distribution='uniform')) -> None:
        super().__init__(init_cfg)
        self.in_channels = list(in_channels)
        end = len(self.in_channels) if end_level == -1 else end_level
        if not 0 <= start_level < end <= len(self.in_channels):
            raise ValueError(f'CPFPN: need 0 <= start_level < end_level <= {len(self.in_channels)}, '
                             f'got start_level={start_level}, end_level={end_level}')
        if num_outs < end - start_level or (end_level != -1 and num_outs != end - start_level):
            raise ValueError(f'CPFPN: num_outs={num_outs} does not fit the {end - start_level} used input levels')
        self.out_channels = out_channels
        self.num_outs = num_outs
        self.start_level = start_level
        self.backbone_end_level = end
        self.upsample_cfg = dict(upsample_cfg)
        self.fp16_enabled = False

        self.lateral_convs = nn.ModuleList(
            ConvModule(self.in_channels[i], out_channels, 1, conv_cfg=conv_cfg,
                       norm_cfg=None if no_norm_on_lateral else norm_cfg, act_cfg=act_cfg, inplace=False)
            for i in range(start_level, end))
        self.fpn_convs = nn.ModuleList([
            ConvModule(out_channels, out_channels, 3, padding=1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                       act_cfg=act_cfg, inplace=False)
        ])

    def _upsample_to(self, x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        if 'scale_factor' in self.upsample_cfg:
            return F.interpolate(x, **self.upsample_cfg)
        return F.interpolate(x, size=reference.shape[2:], **self.upsample_cfg)

    @auto_fp16()
    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        """
        Args:
            inputs (Sequence[Tensor]): one map per input level,
                ``[N, in_channels[i], H_i, W_i]``.

        Returns:
            tuple[Tensor]: ``num_outs`` maps ``[N, out_channels, H_j, W_j]``,
            finest first.
        """
        if len(inputs) != len(self.in_channels):
            raise ValueError(f'CPFPN expects {len(self.in_channels)} input levels, got {len(inputs)}')
        laterals: List[torch.Tensor] = [
            conv(inputs[self.start_level + i]) for i, conv in enumerate(self.lateral_convs)
        ]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + self._upsample_to(laterals[i], laterals[i - 1])
        outs = [self.fpn_convs[0](laterals[0])] + laterals[1:]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
