# A tiny CMT for the CPU demo on synthetic nuScenes (tools/make_synthetic_nuscenes.py, make demo).
# The published fusion model's head, decoder and training recipe, with encoders chosen to train fast on 2 CPU
# cores (tools/profile_train_step.py shows where a step's time goes):
# +-25.6 m around the ego (the demo's objects stay within 22 m); LiDAR as 0.4 m pillars (PointPillars'
# PillarFeatureNet + scatter, cheaper on the CPU than spconv's sparse convolutions) into SECOND / FPN,
# 32 x 32 BEV tokens of 1.6 m; a half-width ResNet-18 (base 32 channels) at 96 x 192 (6 x 6 x 12 camera
# tokens); width 128, 200 queries, 3 decoder layers.
# configs/demo/cmt_aqr_synthetic_tiny.py adds AQR to exactly this model.
_base_ = ['../_base_/default_runtime.py']
plugin = True
plugin_dir = 'projects/mmdet3d_plugin/'

data_root = 'data/synthetic_nuscenes/'
class_names = [
    'car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier', 'motorcycle', 'bicycle', 'pedestrian',
    'traffic_cone'
]
point_cloud_range = [-25.6, -25.6, -5.0, 25.6, 25.6, 3.0]
voxel_size = [0.4, 0.4, 8.0]  # pillars
grid_size = [128, 128, 1]
out_size_factor = 4
embed_dims = 128
num_decoder_layers = 3
code_weights = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2]
input_modality = dict(use_lidar=True, use_camera=True, use_radar=False, use_map=False, use_external=False)
img_norm_cfg = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
# the synthetic cameras are 384 x 216 (make_synthetic_nuscenes.py --image-size 384 216), read at half size
ida_aug_conf = dict(
    resize_lim=(0.475, 0.525), final_dim=(96, 192), bot_pct_lim=(0.0, 0.1), rot_lim=(0.0, 0.0), H=216, W=384,
    rand_flip=True)
meta_keys = ('filename', 'ori_shape', 'img_shape', 'lidar2img', 'pad_shape', 'scale_factor', 'flip',
             'pcd_horizontal_flip', 'pcd_vertical_flip', 'box_mode_3d', 'box_type_3d', 'img_norm_cfg', 'pcd_trans',
             'sample_idx', 'pcd_scale_factor', 'pcd_rotation', 'pts_filename', 'transformation_3d_flow',
             'dropped_modalities', 'corruption')
points_loader = dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=[0, 1, 2, 3, 4])
sweeps_loader = dict(type='LoadPointsFromMultiSweeps', sweeps_num=3, use_dim=[0, 1, 2, 3, 4])
db_sampler = dict(
    type='UnifiedDataBaseSampler',
    data_root=data_root,
    info_path=data_root + 'nuscenes_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(filter_by_difficulty=[-1], filter_by_min_points={name: 5 for name in class_names}),
    classes=class_names,
    sample_groups={name: 1 for name in class_names},
    points_loader=points_loader)
train_pipeline = [
    points_loader,
    sweeps_loader,
    dict(type='LoadMultiViewImageFromFiles'),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='UnifiedObjectSample', sample_2d=True, mixup_rate=0.5, db_sampler=db_sampler),
    dict(type='ModalMask3D', mode='train'),
    dict(type='GlobalRotScaleTransAll', rot_range=[-0.3925, 0.3925], scale_ratio_range=[0.95, 1.05],
         translation_std=[0.2, 0.2, 0.2]),
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
    sweeps_loader,
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
            dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
            dict(type='ResizeCropFlipImage', data_aug_conf=ida_aug_conf, training=False),
            dict(type='NormalizeMultiviewImage', **img_norm_cfg),
            dict(type='PadMultiViewImage', size_divisor=32),
            dict(type='DefaultFormatBundle3D', class_names=class_names, with_label=False),
            dict(type='Collect3D', keys=['points', 'img'], meta_keys=meta_keys),
        ]),
]
dataset = dict(
    type='CustomNuScenesDataset',
    data_root=data_root,
    classes=class_names,
    modality=input_modality,
    box_type_3d='LiDAR',
    version='v1.0-trainval')
data = dict(
    samples_per_gpu=2,
    workers_per_gpu=1,
    train=dict(dataset, ann_file=data_root + 'nuscenes_infos_train.pkl', pipeline=train_pipeline, test_mode=False),
    val=dict(dataset, ann_file=data_root + 'nuscenes_infos_val.pkl', pipeline=test_pipeline, test_mode=True),
    test=dict(dataset, ann_file=data_root + 'nuscenes_infos_val.pkl', pipeline=test_pipeline, test_mode=True))

model = dict(
    type='CmtDetector',
    use_grid_mask=False,
    img_backbone=dict(
        type='ResNet', depth=18, base_channels=32, num_stages=4, out_indices=(2, 3), frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True), norm_eval=False, style='pytorch'),
    img_neck=dict(type='CPFPN', in_channels=[128, 256], out_channels=embed_dims, num_outs=2),
    pts_voxel_layer=dict(
        num_point_features=5, max_num_points=10, voxel_size=voxel_size, max_voxels=(20000, 20000),
        point_cloud_range=point_cloud_range),
    pts_voxel_encoder=dict(
        type='PillarFeatureNet', in_channels=5, feat_channels=[64], with_distance=False, voxel_size=voxel_size,
        point_cloud_range=point_cloud_range, norm_cfg=dict(type='BN1d', eps=1e-3, momentum=0.01)),
    pts_middle_encoder=dict(type='BatchPillarScatter', in_channels=64, output_shape=grid_size[:2]),
    pts_backbone=dict(
        type='SECOND', in_channels=64, out_channels=[64, 128], layer_nums=[2, 2], layer_strides=[2, 2],
        norm_cfg=dict(type='BN', eps=0.001, momentum=0.01), conv_cfg=dict(type='Conv2d', bias=False)),
    pts_neck=dict(
        type='SECONDFPN', in_channels=[64, 128], out_channels=[128, 128], upsample_strides=[0.5, 1],
        norm_cfg=dict(type='BN', eps=0.001, momentum=0.01), upsample_cfg=dict(type='deconv', bias=False),
        use_conv_for_no_stride=True),
    pts_bbox_head=dict(
        type='CmtHead',
        in_channels=256,
        hidden_dim=embed_dims,
        num_query=200,
        depth_num=32,
        downsample_scale=out_size_factor,
        scalar=10,
        noise_scale=1.0,
        noise_trans=0.0,
        dn_weight=1.0,
        split=0.75,
        common_heads=dict(center=(2, 2), height=(1, 2), dim=(3, 2), rot=(2, 2), vel=(2, 2)),
        tasks=[dict(num_class=10, class_names=class_names)],
        bbox_coder=dict(
            type='MultiTaskBBoxCoder', post_center_range=[-30.6, -30.6, -10.0, 30.6, 30.6, 10.0],
            pc_range=point_cloud_range, max_num=100, voxel_size=voxel_size, num_classes=10),
        separate_head=dict(type='SeparateTaskHead', init_bias=-2.19, final_kernel=1),
        transformer=dict(
            type='CmtTransformer',
            decoder=dict(
                type='PETRTransformerDecoder',
                return_intermediate=True,
                num_layers=num_decoder_layers,
                transformerlayers=dict(
                    type='PETRTransformerDecoderLayer',
                    with_cp=False,
                    attn_cfgs=[
                        dict(type='MultiheadAttention', embed_dims=embed_dims, num_heads=4, dropout=0.1),
                        dict(type='PETRMultiheadFlashAttention', embed_dims=embed_dims, num_heads=4, dropout=0.1),
                    ],
                    ffn_cfgs=dict(type='FFN', embed_dims=embed_dims, feedforward_channels=512, num_fcs=2,
                                  ffn_drop=0., act_cfg=dict(type='ReLU', inplace=True)),
                    operation_order=('self_attn', 'norm', 'cross_attn', 'norm', 'ffn', 'norm')))),
        loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2, alpha=0.25, reduction='mean', loss_weight=2.0),
        loss_bbox=dict(type='L1Loss', reduction='mean', loss_weight=0.25)),
    train_cfg=dict(
        pts=dict(
            dataset='nuScenes',
            assigner=dict(
                type='HungarianAssigner3D',
                cls_cost=dict(type='FocalLossCost', weight=2.0),
                reg_cost=dict(type='BBox3DL1Cost', weight=0.25),
                iou_cost=dict(type='IoUCost', weight=0.0),
                pc_range=point_cloud_range,
                code_weights=code_weights),
            grid_size=grid_size,
            voxel_size=voxel_size,
            out_size_factor=out_size_factor,
            code_weights=code_weights,
            point_cloud_range=point_cloud_range)),
    test_cfg=dict(
        pts=dict(dataset='nuScenes', grid_size=grid_size, out_size_factor=out_size_factor, pc_range=point_cloud_range,
                 voxel_size=voxel_size)))

optimizer = dict(type='AdamW', lr=1e-3, weight_decay=0.01)
optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2))
lr_config = dict(policy='CosineAnnealing', warmup='linear', warmup_iters=50, warmup_ratio=0.1, min_lr_ratio=0.05)
runner = dict(type='EpochBasedRunner', max_epochs=12)
checkpoint_config = dict(interval=1, max_keep_ckpts=2)
log_config = dict(interval=10, hooks=[dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')])
evaluation = dict(interval=1000)
