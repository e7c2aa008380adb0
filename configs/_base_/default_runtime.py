# Runtime settings shared by the CMT configs (upstream CMT's values).
# checkpoints and latest.pth are written atomically (projects/mmdet3d_plugin/mmcv_custom/checkpoint.py)
checkpoint_config = dict(type='AtomicCheckpointHook', interval=1)
log_config = dict(interval=50, hooks=[dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')])
# tools/train.py switches the backend to gloo when no GPU is available
dist_params = dict(backend='nccl')
log_level = 'INFO'
work_dir = None
load_from = None
resume_from = None
workflow = [('train', 1)]
