# CMT-AQR whose cameras detect on their own ("cameras that see"): configs/demo/cmt_aqr_synthetic_tiny.py
# plus, in the head,
# * a camera decoding pass (MEFormer / MoME stage 1): every training step also decodes the queries against the
#   camera tokens alone, with their own decoder (pass_decoders='separate'), matching, DN and losses (camera.* in
#   the log); at inference a frame without LiDAR points is decoded by it (lidar_free_pass), every other frame by
#   the fused pass;
# * the camera-only model's locality prior on that pass (camera_window_prior: a +4 window around each query's
#   camera cell, DN queries included; the routed bias gives DN queries none);
# * the camera learning aids (2D centre heatmap + object depth, camera tokens at their predicted depth) and AQR's
#   per-query routing targets;
# and in the data, no training sample loses a modality (ModalMask3D drops neither images nor points): the camera pass
# learns only from samples with images, and the fused pass need not learn to detect without points, since a frame
# without them goes to the camera pass (the base's 25 % of point-less samples cost it clean mAP and robustness to
# losing its cameras). The fused pass never trains without cameras, so it loses when they fail (camera_drop).
# The effect of each change: docs/results.md.
# For the 20-minute budget of make demo (the second pass makes a step dearer) the recipe is written for
# 2 data-parallel processes of 2 samples (demo_processes: tools/demo.py starts them on a CPU machine with 2 cores,
# one thread each; one process of two threads does not keep both busy): a batch of 4, so 40 steps per epoch,
# at 1.4e-3 (the AdamW square-root scaling of the base's 1e-3 at batch 2), and PyTorch's fused AdamW (one kernel
# for all parameters instead of a loop over ~300 tensors). Processes of 1 sample each would keep
# the batch of 2 but normalise each sample by its own BatchNorm statistics, whose running averages then misfit the
# test samples (a sample without points, 25 % of them, has none) and cost much of the test mAP.
_base_ = ['./cmt_aqr_synthetic_tiny.py']
demo_processes = 2
image_drop_prob = 0.0
points_drop_prob = 0.0
class_names = {{_base_.class_names}}
point_cloud_range = {{_base_.point_cloud_range}}
ida_aug_conf = {{_base_.ida_aug_conf}}
img_norm_cfg = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
meta_keys = {{_base_.meta_keys}}
points_loader = {{_base_.points_loader}}
sweeps_loader = {{_base_.sweeps_loader}}
db_sampler = {{_base_.db_sampler}}
train_pipeline = [
    points_loader,
    sweeps_loader,
    dict(type='LoadMultiViewImageFromFiles'),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='UnifiedObjectSample', sample_2d=True, mixup_rate=0.5, db_sampler=db_sampler),
    dict(type='ModalMask3D', mode='train', image_drop_prob=image_drop_prob, points_drop_prob=points_drop_prob),
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
data = dict(train=dict(pipeline=train_pipeline))
optimizer = dict(lr=1.4e-3, fused=True)
model = dict(
    pts_bbox_head=dict(
        aqr_config=dict(query_loss_weight=1.0),
        image_aux_config=dict(type='ImageAuxHead'),
        camera_depth_position=True,
        modality_passes=('fused', 'camera'),
        pass_decoders='separate',
        lidar_free_pass='camera',
        camera_window_prior=dict(window_size=5, bias=4.0)))
