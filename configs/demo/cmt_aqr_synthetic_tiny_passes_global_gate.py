# The robustness study's global gate on the camera-pass detector (arm `global_gate` of experiments/study_arms.py): make
# demo's CMT-AQR (configs/demo/cmt_aqr_synthetic_tiny_passes.py) with one LiDAR and one camera weight per sample
# (the router's logits averaged over the queries) and MoME's per-sample label (the modality the sample lost:
# ModalMask3D's drop or a whole-sensor corruption, lidar_drop / camera_drop) instead of the per-query targets.
# The study trains it from its stage-1 checkpoint (load_from=...), every parameter.
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']

model = dict(pts_bbox_head=dict(aqr_config=dict(granularity='sample', aux_loss_weight=1.0, query_loss_weight=0.0)))
