"""VoVNet backbone (Lee & Park, "CenterMask", CVPR 2020) with effective Squeeze-Excitation.

Module and parameter names follow the VoVNet implementation CMT uses
(``stem.stem_1/conv.weight``, ``stage4.OSA4_3.layers.0.OSA4_3_0/norm.bias``,
``stage5.OSA5_1.ese.fc.weight``, ...), so CMT / DD3D VoVNet checkpoints load.

Structure: a stem of three 3x3 conv-BN-ReLU (strides 2, 1, 2), then stages
2..5. Stages 3..5 start with a 3x3/2 max-pool (``ceil_mode``). A stage is a
chain of One-Shot-Aggregation (OSA) blocks: ``layer_per_block`` 3x3
conv-BN-ReLU applied in sequence, the block input and all their outputs
concatenated, a 1x1 conv-BN-ReLU to the stage width, then eSE
(``x * hsigmoid(fc(avgpool(x)))``). Every block after a stage's first adds its
input back (identity shortcut).
"""
from collections import OrderedDict
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.runner import BaseModule
from mmdet.models.builder import BACKBONES
from torch.nn.modules.batchnorm import _BatchNorm

# Published VoVNet-eSE architectures (stem widths, per-stage 3x3 conv width,
# per-stage output width, convs per OSA block, OSA blocks per stage).
VOVNET_SPECS: Dict[str, dict] = {
    'V-19-eSE': dict(stem=(64, 64, 128), stage_conv_ch=(128, 160, 192, 224), stage_out_ch=(256, 512, 768, 1024),
                     layer_per_block=3, block_per_stage=(1, 1, 1, 1)),
    'V-39-eSE': dict(stem=(64, 64, 128), stage_conv_ch=(128, 160, 192, 224), stage_out_ch=(256, 512, 768, 1024),
                     layer_per_block=5, block_per_stage=(1, 1, 2, 2)),
    'V-57-eSE': dict(stem=(64, 64, 128), stage_conv_ch=(128, 160, 192, 224), stage_out_ch=(256, 512, 768, 1024),
                     layer_per_block=5, block_per_stage=(1, 1, 4, 3)),
    'V-99-eSE': dict(stem=(64, 64, 128), stage_conv_ch=(128, 160, 192, 224), stage_out_ch=(256, 512, 768, 1024),
                     layer_per_block=5, block_per_stage=(1, 3, 9, 3)),
}
STAGE_NAMES = ('stage2', 'stage3', 'stage4', 'stage5')


def conv_norm_act(in_channels: int, out_channels: int, kernel_size: int, stride: int, prefix: str) -> nn.Sequential:
    """``{prefix}/conv`` (no bias) -> ``{prefix}/norm`` (BN) -> ``{prefix}/relu``."""
    return nn.Sequential(OrderedDict([
        (f'{prefix}/conv', nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                                     padding=kernel_size // 2, bias=False)),
        (f'{prefix}/norm', nn.BatchNorm2d(out_channels)),
        (f'{prefix}/relu', nn.ReLU(inplace=True)),
    ]))


class EffectiveSE(nn.Module):
    """Effective Squeeze-Excitation: one full-width 1x1 conv on the pooled feature, hard sigmoid gate.

    Args:
        channels (int): feature channels.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, C, H, W]`` -> ``[N, C, H, W]`` rescaled per channel."""
        gate = self.fc(F.adaptive_avg_pool2d(x, 1))
        return x * (F.relu6(gate + 3.0) / 6.0)


class OSABlock(nn.Module):
    """One-Shot Aggregation block.

    Args:
        in_channels (int): input channels.
        conv_channels (int): width of the 3x3 convs.
        out_channels (int): output channels (after the 1x1 aggregation).
        num_layers (int): number of 3x3 convs.
        name (str): block name used as the prefix of its layers (``OSA3_2``).
        identity (bool): add the input to the output (needs
            ``in_channels == out_channels``).
        with_cp (bool): activation checkpointing (see :class:`VoVNet`).
    """

    def __init__(self, in_channels: int, conv_channels: int, out_channels: int, num_layers: int, name: str,
                 identity: bool, with_cp: bool = False) -> None:
        super().__init__()
        if identity and in_channels != out_channels:
            raise ValueError(f'{name}: identity shortcut needs in_channels == out_channels, '
                             f'got {in_channels} and {out_channels}')
        self.identity = identity
        self.with_cp = with_cp
        self.layers = nn.ModuleList(
            conv_norm_act(in_channels if i == 0 else conv_channels, conv_channels, 3, 1, f'{name}_{i}')
            for i in range(num_layers))
        self.concat = conv_norm_act(in_channels + num_layers * conv_channels, out_channels, 1, 1, f'{name}_concat')
        self.ese = EffectiveSE(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, in_channels, H, W]`` -> ``[N, out_channels, H, W]``."""
        if self.with_cp and torch.is_grad_enabled():
            return cp.checkpoint(self._aggregate, x, use_reentrant=False)
        return self._aggregate(x)

    def _aggregate(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features[-1]))
        out = self.ese(self.concat(torch.cat(features, dim=1)))
        return out + x if self.identity else out


def build_osa_stage(stage_index: int, in_channels: int, conv_channels: int, out_channels: int, num_blocks: int,
                    num_layers: int, with_cp: bool = False) -> nn.Sequential:
    """Stage ``stage_index`` (2..5): optional ``Pooling`` then blocks ``OSA{stage}_1 .. OSA{stage}_{num_blocks}``."""
    modules = OrderedDict()
    if stage_index != 2:
        modules['Pooling'] = nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True)
    for block in range(1, num_blocks + 1):
        name = f'OSA{stage_index}_{block}'
        modules[name] = OSABlock(in_channels if block == 1 else out_channels, conv_channels, out_channels, num_layers,
                                 name, identity=block > 1, with_cp=with_cp)
    return nn.Sequential(modules)


@BACKBONES.register_module()
class VoVNet(BaseModule):
    """VoVNet-eSE backbone.

    Args:
        spec_name (str): architecture, one of :data:`VOVNET_SPECS`
            (CMT uses ``'V-99-eSE'``).
        input_ch (int): input image channels.
        out_features (Sequence[str]): outputs to return, any of ``'stem'``,
            ``'stage2'`` .. ``'stage5'``; returned in network order.
        frozen_stages (int): -1 freezes nothing; ``k >= 0`` freezes the stem
            and stages ``2 .. k + 1`` (no gradients, BN in eval mode).
        norm_eval (bool): keep every BatchNorm in eval mode while training.
        with_cp (bool): activation checkpointing of every OSA block, as
            mmdet's ``ResNet(with_cp=True)``: a block keeps only its input for
            the backward and recomputes the rest there, so training needs far
            less memory for one more forward of each block. Same
            outputs and gradients; with ``norm_eval=False`` the recomputation
            updates the BatchNorm running statistics a second time.
        init_cfg (dict, optional): mmcv initialisation config.

    Strides / channels of the outputs (V-99-eSE): stem 4 / 128, stage2 4 / 256,
    stage3 8 / 512, stage4 16 / 768, stage5 32 / 1024.
    """

    def __init__(self,
                 spec_name: str,
                 input_ch: int = 3,
                 out_features: Sequence[str] = ('stage4', 'stage5'),
                 frozen_stages: int = -1,
                 norm_eval: bool = True,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg)
        if spec_name not in VOVNET_SPECS:
            raise KeyError(f'unknown VoVNet spec_name {spec_name!r}; available: {sorted(VOVNET_SPECS)}')
        valid = ('stem', ) + STAGE_NAMES
        unknown = [name for name in out_features if name not in valid]
        if unknown or not out_features:
            raise ValueError(f'out_features must be a non-empty subset of {valid}, got {tuple(out_features)}')
        if not -1 <= frozen_stages <= len(STAGE_NAMES):
            raise ValueError(f'frozen_stages must be in [-1, {len(STAGE_NAMES)}], got {frozen_stages}')
        spec = VOVNET_SPECS[spec_name]
        self.out_features = tuple(name for name in valid if name in out_features)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

        stem_ch = spec['stem']
        self.stem = nn.Sequential(OrderedDict(
            list(conv_norm_act(input_ch, stem_ch[0], 3, 2, 'stem_1').named_children()) +
            list(conv_norm_act(stem_ch[0], stem_ch[1], 3, 1, 'stem_2').named_children()) +
            list(conv_norm_act(stem_ch[1], stem_ch[2], 3, 2, 'stem_3').named_children())))
        in_channels = (stem_ch[2], ) + tuple(spec['stage_out_ch'][:-1])
        for i, name in enumerate(STAGE_NAMES):
            self.add_module(name, build_osa_stage(i + 2, in_channels[i], spec['stage_conv_ch'][i],
                                                  spec['stage_out_ch'][i], spec['block_per_stage'][i],
                                                  spec['layer_per_block'], with_cp))
        self.out_channels = {'stem': stem_ch[2], **dict(zip(STAGE_NAMES, spec['stage_out_ch']))}
        self._freeze_stages()

    def _frozen_modules(self):
        if self.frozen_stages < 0:
            return []
        return [self.stem] + [getattr(self, name) for name in STAGE_NAMES[:self.frozen_stages]]

    def _freeze_stages(self) -> None:
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """``x [N, input_ch, H, W]`` -> tuple of the ``out_features`` maps, e.g.
        ``([N, 768, H/16, W/16], [N, 1024, H/32, W/32])`` for ``('stage4', 'stage5')``."""
        outputs = []
        x = self.stem(x)
        if 'stem' in self.out_features:
            outputs.append(x)
        for name in STAGE_NAMES:
            x = getattr(self, name)(x)
            if name in self.out_features:
                outputs.append(x)
        return tuple(outputs)

    def train(self, mode: bool = True) -> 'VoVNet':
        """Set train mode; frozen stages and (with ``norm_eval``) all BatchNorms stay in eval mode."""
        super().train(mode)
        if mode:
            for module in self._frozen_modules():
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, _BatchNorm):
                        module.eval()
        return self
