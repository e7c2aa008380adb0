# The robustness study's global gate on the camera-pass detector (arm `global_gate` of apis/study_arms.py): stage 2
# (configs/demo/cmt_aqr_synthetic_tiny_passes_stage2.py) with one LiDAR and one camera weight per sample (the
# router's logits averaged over the queries) and MoME's per-sample label (the modality the sample lost) instead of
# the per-query targets.
_base_ = ['./cmt_aqr_synthetic_tiny_passes_stage2.py']

model = dict(pts_bbox_head=dict(aqr_config=dict(granularity='sample', aux_loss_weight=1.0, query_loss_weight=0.0)))
