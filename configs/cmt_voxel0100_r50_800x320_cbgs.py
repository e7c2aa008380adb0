# CMT fusion, ResNet-50 at 800x320, voxel 0.1, CBGS, 20 epochs (15 with GT sampling + 5 without, as upstream).
# Published nuScenes val: 67.9 mAP / 70.8 NDS (upstream initialises the image backbone from
# 'ckpts/nuim_r50.pth': pass --cfg-options load_from=<that file> to do the same).
_base_ = [
    './_base_/datasets/nus-3d-cmt.py',
    './_base_/models/cmt_fusion_voxel0075_vov.py',
    './_base_/schedules/cmt_cyclic_20e.py',
    './_base_/default_runtime.py',
]
plugin = True
plugin_dir = 'projects/mmdet3d_plugin/'
# imports the plugin wherever the config is loaded: mmdet3d's own tools too (browse_dataset, benchmark, get_flops)
custom_imports = dict(imports=['projects.mmdet3d_plugin'], allow_failed_imports=False)

point_cloud_range = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]
class_names = [
    'car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier', 'motorcycle', 'bicycle', 'pedestrian',
    'traffic_cone'
]
data_root = 'data/nuscenes/'
img_norm_cfg = dict(mean=[103.530, 116.280, 123.675], std=[57.375, 57.120, 58.395], to_rgb=False)
voxel_size = [0.1, 0.1, 0.2]
ida_aug_conf = dict(
    resize_lim=(0.47, 0.625), final_dim=(320, 800), bot_pct_lim=(0.0, 0.0), rot_lim=(0.0, 0.0), H=900, W=1600,
    rand_flip=True)
meta_keys = ('filename', 'ori_shape', 'img_shape', 'lidar2img', 'depth2img', 'cam2img', 'pad_shape', 'scale_factor',
             'flip', 'pcd_horizontal_flip', 'pcd_vertical_flip', 'box_mode_3d', 'box_type_3d', 'img_norm_cfg',
             'pcd_trans', 'sample_idx', 'pcd_scale_factor', 'pcd_rotation', 'pts_filename',
             'transformation_3d_flow', 'rot_degree', 'dropped_modalities')
points_loader = dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=[0, 1, 2, 3, 4])
db_sampler = dict(
    type='UnifiedDataBaseSampler',
    data_root=None,
    info_path=data_root + 'nuscenes_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(
        filter_by_difficulty=[-1],
        filter_by_min_points=dict(
            car=5, truck=5, bus=5, trailer=5, construction_vehicle=5, traffic_cone=5, barrier=5, motorcycle=5,
            bicycle=5, pedestrian=5)),
    classes=class_names,
    sample_groups=dict(
        car=2, truck=3, construction_vehicle=7, bus=4, trailer=6, barrier=2, motorcycle=6, bicycle=6, pedestrian=2,
        traffic_cone=2),
    points_loader=points_loader)
train_pipeline = [
    points_loader,
    dict(type='LoadPointsFromMultiSweeps', sweeps_num=10, use_dim=[0, 1, 2, 3, 4]),
    dict(type='LoadMultiViewImageFromFiles'),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='UnifiedObjectSample', sample_2d=True, mixup_rate=0.5, db_sampler=db_sampler),
    dict(type='ModalMask3D', mode='train'),
    dict(
        type='GlobalRotScaleTransAll',
        rot_range=[-0.3925 * 2, 0.3925 * 2],
        scale_ratio_range=[0.9, 1.1],
        translation_std=[0.5, 0.5, 0.5]),
    dict(type='CustomRandomFlip3D', sync_2d=False, flip_ratio_bev_horizontal=0.5, flip_ratio_bev_vertical=0.5),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectNameFilter', classes=class_names),
    dict(type='PointShuffle'),
    dict(type='ResizeCropFlipImage', data_aug_conf=ida_aug_conf, training=True),
    dict(type='NormalizeMultiviewImage', **img_norm_cfg),
    dict(type='PadMultiViewImage', size_divisor=32),
    dict(type='DefaultFormatBundle3D', class_names=class_names),
    dict(type='Collect3D', keys=['points', 'img', 'gt_bboxes_3d', 'gt_labels_3d'], meta_keys=meta_keys),
]
test_pipeline = [
    points_loader,
    dict(type='LoadPointsFromMultiSweeps', sweeps_num=10, use_dim=[0, 1, 2, 3, 4]),
    dict(type='LoadMultiViewImageFromFiles'),
    dict(
        type='MultiScaleFlipAug3D',
        img_scale=(1333, 800),
        pts_scale_ratio=1,
        flip=False,
        transforms=[
            dict(type='GlobalRotScaleTrans', rot_range=[0, 0], scale_ratio_range=[1.0, 1.0],
                 translation_std=[0, 0, 0]),
            dict(type='RandomFlip3D'),
            dict(type='ResizeCropFlipImage', data_aug_conf=ida_aug_conf, training=False),
            dict(type='NormalizeMultiviewImage', **img_norm_cfg),
            dict(type='PadMultiViewImage', size_divisor=32),
            dict(type='DefaultFormatBundle3D', class_names=class_names, with_label=False),
            dict(type='Collect3D', keys=['points', 'img'], meta_keys=meta_keys),
        ]),
]
model = dict(
    img_backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=50,
        num_stages=4,
        out_indices=(2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=True,
        with_cp=True,
        style='pytorch'),
    img_neck=dict(in_channels=[1024, 2048]),
    pts_voxel_layer=dict(voxel_size=voxel_size),
    pts_middle_encoder=dict(sparse_shape=[41, 1024, 1024]),
    pts_bbox_head=dict(bbox_coder=dict(voxel_size=voxel_size)),
    train_cfg=dict(pts=dict(grid_size=[1024, 1024, 40], voxel_size=voxel_size)),
    test_cfg=dict(pts=dict(grid_size=[1024, 1024, 40], voxel_size=voxel_size)))
data = dict(
    samples_per_gpu=4,
    train=dict(dataset=dict(pipeline=train_pipeline)),
    val=dict(pipeline=test_pipeline),
    test=dict(pipeline=test_pipeline))
optimizer = dict(
    lr=0.00014,
    paramwise_cfg=dict(custom_keys={
        'img_backbone': dict(lr_mult=0.01, decay_mult=5),
        'img_neck': dict(lr_mult=0.1),
    }))
lr_config = dict(target_ratio=(6, 0.0001))
# Upstream's "15e + 5e" in one run: GT sampling for 15 epochs, the last 5 without it (DisableObjectSampleHook).
# --cfg-options custom_hooks.0.disable_after_epoch=None keeps GT sampling for all 20 epochs.
custom_hooks = [dict(type='DisableObjectSampleHook', disable_after_epoch=15)]
