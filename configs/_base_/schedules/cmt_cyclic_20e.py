# CMT's schedule: AdamW, one cyclic learning-rate / momentum cycle over 20 epochs,
# mixed precision with gradient clipping (8 GPUs x 2 samples in the published runs).
# The configs' paramwise_cfg options go into one parameter group per distinct set of options, not one per
# parameter (the same update; see projects/mmdet3d_plugin/mmcv_custom/merged_param_groups.py).
optimizer = dict(type='AdamW', lr=0.0001, weight_decay=0.01, constructor='MergedParamGroupsOptimizerConstructor')
optimizer_config = dict(
    type='CustomFp16OptimizerHook',
    loss_scale='dynamic',
    grad_clip=dict(max_norm=35, norm_type=2),
    custom_fp16=dict(pts_voxel_encoder=False, pts_middle_encoder=False, pts_bbox_head=False))
lr_config = dict(policy='cyclic', target_ratio=(8, 0.0001), cyclic_times=1, step_ratio_up=0.4)
momentum_config = dict(policy='cyclic', target_ratio=(0.8947368421052632, 1), cyclic_times=1, step_ratio_up=0.4)
runner = dict(type='EpochBasedRunner', max_epochs=20)
