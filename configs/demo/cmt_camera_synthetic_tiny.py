# Camera-only CMT for the CPU demo (make demo MODEL=cmt_camera): configs/demo/cmt_synthetic_tiny.py without
# its LiDAR branch, on the same synthetic data, so that the camera branch's own ceiling is a number. As
# upstream's camera-only config (configs/cmt_camera_vov_1600x640_cbgs.py): CmtImageHead / CmtImageTransformer,
# no points loaded, no GT-database pasting (it pastes LiDAR points), GlobalRotScaleTransImage for the BEV
# augmentation (it moves the boxes and the camera matrices together).
_base_ = ['./cmt_synthetic_tiny.py']

input_modality = dict(use_lidar=False, use_camera=True, use_radar=False, use_map=False, use_external=False)
class_names = {{_base_.class_names}}
point_cloud_range = {{_base_.point_cloud_range}}
ida_aug_conf = {{_base_.ida_aug_conf}}
img_norm_cfg = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
meta_keys = {{_base_.meta_keys}}
train_pipeline = [
    dict(type='LoadMultiViewImageFromFiles'),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='GlobalRotScaleTransImage', rot_range=[-0.3925, 0.3925], scale_ratio_range=[0.95, 1.05],
         translation_std=[0.2, 0.2, 0.2], training=True, flip_dx_ratio=0.5, flip_dy_ratio=0.5),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectNameFilter', classes=class_names),
    dict(type='ResizeCropFlipImage', data_aug_conf=ida_aug_conf, training=True),
    dict(type='NormalizeMultiviewImage', **img_norm_cfg),
    dict(type='PadMultiViewImage', size_divisor=32),
    dict(type='DefaultFormatBundle3D', class_names=class_names),
    dict(type='Collect3D', keys=['img', 'gt_bboxes_3d', 'gt_labels_3d'], meta_keys=meta_keys),
]
test_pipeline = [
    dict(type='LoadMultiViewImageFromFiles'),
    dict(
        type='MultiScaleFlipAug3D',
        img_scale=(1333, 800),
        pts_scale_ratio=1,
        flip=False,
        transforms=[
            dict(type='ResizeCropFlipImage', data_aug_conf=ida_aug_conf, training=False),
            dict(type='NormalizeMultiviewImage', **img_norm_cfg),
            dict(type='PadMultiViewImage', size_divisor=32),
            dict(type='DefaultFormatBundle3D', class_names=class_names, with_label=False),
            dict(type='Collect3D', keys=['img'], meta_keys=meta_keys),
        ]),
]
data = dict(
    train=dict(pipeline=train_pipeline, modality=input_modality),
    val=dict(pipeline=test_pipeline, modality=input_modality),
    test=dict(pipeline=test_pipeline, modality=input_modality))

model = dict(
    pts_voxel_layer=None,
    pts_voxel_encoder=None,
    pts_middle_encoder=None,
    pts_backbone=None,
    pts_neck=None,
    pts_bbox_head=dict(
        type='CmtImageHead',
        transformer=dict(type='CmtImageTransformer'),
        # the camera learning aids: the locality prior CMT-AQR's router starts
        # with, 2D centre-heatmap + object-depth supervision, and camera tokens embedded at their predicted depth
        camera_window_prior=dict(window_size=5, bias=4.0),
        image_aux_config=dict(type='ImageAuxHead'),
        camera_depth_position=True))
# a camera-only step costs less than a fusion step, so it trains 20 epochs in the demo's 20-minute budget
runner = dict(type='EpochBasedRunner', max_epochs=20)
