"""CMT's per-task prediction branches, applied to every decoder layer at once."""
from typing import Dict, Optional, Tuple

import torch
from mmcv.runner import BaseModule
from mmdet.models.builder import HEADS
from torch import nn

from ..utils.group_layer_norm import GroupLayerNorm1d


@HEADS.register_module()
class SeparateTaskHead(BaseModule):
    """One small network per output (``center``, ``height``, ..., ``cls_logits``).

    The decoder layers' outputs are stacked along the channels and each
    branch is a chain of *grouped* 1D convolutions with one group per decoder
    layer, so layer ``l``'s features only ever meet layer ``l``'s weights: a
    branch with ``num_conv`` convs is ``num_conv - 1`` times
    ``Conv1d(groups) -> GroupLayerNorm1d(groups) -> ReLU`` then a final
    ``Conv1d(groups)`` with bias. The convolutions run along the query axis
    with kernel ``final_kernel`` (so a kernel > 1 mixes neighbouring query
    slots, as in upstream CMT's LiDAR-only config). Parameter names and
    shapes equal upstream CMT's (``center.0.weight [groups * head_conv,
    in_channels, k]``, ``center.1.weight``, ``center.3.weight [groups * out,
    head_conv, k]``).

    Args:
        in_channels (int): decoder channels C.
        heads (dict[str, tuple[int, int]]): branch name -> ``(out_channels,
            num_conv)``.
        groups (int): decoder layers L.
        head_conv (int): hidden channels per group.
        final_kernel (int): kernel size of every conv (odd).
        init_bias (float): initial bias of the ``cls_logits`` branch's last conv
            (the focal-loss prior: ``sigmoid(-2.19) = 0.1``).
        init_cfg (dict, optional): initialisation of the convs. The default,
            None, keeps PyTorch's default initialisation: upstream CMT declares
            a Kaiming init here, but its heads sit in a plain ``nn.ModuleList``
            that mmcv's ``init_weights`` never enters, so the published models
            were trained from the default init; Kaiming (fan-out) on the output
            convs would start the centre offsets and the log-sizes at outputs of
            several units, saturating the centre sigmoid.
    """

    def __init__(self,
                 in_channels: int,
                 heads: Dict[str, Tuple[int, int]],
                 groups: int = 1,
                 head_conv: int = 64,
                 final_kernel: int = 1,
                 init_bias: float = -2.19,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if final_kernel % 2 != 1:
            raise ValueError(f'final_kernel must be odd to keep the number of queries, got {final_kernel}')
        self.heads = dict(heads)
        self.groups = groups
        self.init_bias = init_bias
        for name, (out_channels, num_conv) in self.heads.items():
            if num_conv < 1:
                raise ValueError(f'branch {name!r} needs at least one conv, got num_conv={num_conv}')
            layers = []
            channels = in_channels
            for _ in range(num_conv - 1):
                layers += [
                    nn.Conv1d(channels * groups, head_conv * groups, final_kernel, padding=final_kernel // 2,
                              groups=groups, bias=False),
                    GroupLayerNorm1d(head_conv * groups, groups=groups),
                    nn.ReLU(inplace=True),
                ]
                channels = head_conv
            layers.append(nn.Conv1d(channels * groups, out_channels * groups, final_kernel,
                                    padding=final_kernel // 2, groups=groups, bias=True))
            self.add_module(name, nn.Sequential(*layers))

    def init_weights(self) -> None:
        """``init_cfg`` (if any) on the convs, then ``init_bias`` on the classification output."""
        super().init_weights()
        if 'cls_logits' in self.heads:
            nn.init.constant_(getattr(self, 'cls_logits')[-1].bias, self.init_bias)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Predict every output for every decoder layer.

        Args:
            x (Tensor): ``[L, bs, Q, C]`` decoder outputs, ``L == groups``.

        Returns:
            dict[str, Tensor]: branch name -> ``[L, bs, Q, out_channels]``.
        """
        num_layers, bs, num_queries, channels = x.shape
        if num_layers != self.groups:
            raise ValueError(f'SeparateTaskHead was built for {self.groups} decoder layers, got {num_layers}')
        stacked = x.permute(1, 0, 3, 2).reshape(bs, num_layers * channels, num_queries)
        outputs = {}
        for name in self.heads:
            out = getattr(self, name)(stacked)
            outputs[name] = out.view(bs, num_layers, -1, num_queries).permute(1, 0, 3, 2)
        return outputs
