"""mmcv runner extensions used by CMT's configs, CPU fixes for spconv and mmdet3d's mesh export (applied on import)."""
from .checkpoint import AtomicCheckpointHook, find_latest_valid_checkpoint
from .device_log import DeviceLogBuffer, DeviceLogOptimizerHook
from .disable_object_sample import DisableObjectSampleHook
from .fp16_optimizer_hook import CustomFp16OptimizerHook
from .host_sync_report import HostSyncReportHook
from .merged_param_groups import MergedParamGroupsOptimizerConstructor
from .seeding import EpochSeedHook
from .spconv_cpu import patch_spconv_cpu_algorithm, patch_spconv_cpu_stream
from .spconv_cpu_scatter import patch_spconv_cpu_scatter_add
from .trimesh_io import patch_trimesh_io

patch_spconv_cpu_stream()
patch_spconv_cpu_algorithm()
patch_spconv_cpu_scatter_add()
patch_trimesh_io()

__all__ = [
    'AtomicCheckpointHook', 'CustomFp16OptimizerHook', 'DeviceLogBuffer', 'DeviceLogOptimizerHook', 'DisableObjectSampleHook',
    'EpochSeedHook',
    'HostSyncReportHook', 'MergedParamGroupsOptimizerConstructor', 'find_latest_valid_checkpoint', 'patch_spconv_cpu_algorithm',
    'patch_spconv_cpu_scatter_add', 'patch_spconv_cpu_stream', 'patch_trimesh_io'
]
