# The robustness study's CMT-AQR with per-query routing targets (tools/robustness_study.py, arm `aqr_targets`):
# stage 2 as configs/demo/cmt_aqr_synthetic_tiny_stage2.py (only the router and alpha train, from a stage-1
# checkpoint), plus the per-query routing loss (query_loss_weight=1, models/aqr/routing_targets.py): each query
# matched to an object learns LiDAR = "its box still holds >= min_lidar_points points", camera = "its centre is in
# a live camera view". The targets follow whatever the training pipeline removed: ModalMask3D here; the study
# adds train-time object_drop / camera_fail / mixed corruptions (RandomSensorCorruption, its arm's
# train_corruptions in projects/mmdet3d_plugin/experiments/study_arms.py) for per-query variation.
_base_ = ['./cmt_aqr_synthetic_tiny_stage2.py']

model = dict(pts_bbox_head=dict(aqr_config=dict(query_loss_weight=1.0)))
