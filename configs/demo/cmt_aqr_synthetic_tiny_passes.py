# CMT-AQR demo with per-modality decoding passes (MEFormer / MoME stage 1, "cameras that see"):
# configs/demo/cmt_aqr_synthetic_tiny.py, plus the head decoding the same queries three times per training
# step, against [BEV ; camera] tokens, the BEV tokens only and the camera tokens only, each pass with its
# own matching, DN and losses (lidar.* / camera.* in the log). Inference decodes the fused pass, except for a
# frame without LiDAR points, which the camera pass decodes (lidar_free_pass); same parameters as the demo
# model. Cost per training step: docs/models.md "Per-modality decoding passes".
_base_ = ['./cmt_aqr_synthetic_tiny.py']

model = dict(pts_bbox_head=dict(modality_passes=('fused', 'lidar', 'camera'), lidar_free_pass='camera'))
