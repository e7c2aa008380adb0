"""mmcv runner extensions used by CMT's configs, and a CPU fix for spconv (applied on import)."""
from .fp16_optimizer_hook import CustomFp16OptimizerHook
from .spconv_cpu import patch_spconv_cpu_stream

patch_spconv_cpu_stream()

__all__ = ['CustomFp16OptimizerHook', 'patch_spconv_cpu_stream']
