# The robustness study's global gate (tools/robustness_study.py, arm `global_gate`): stage 2 as
# configs/demo/cmt_aqr_synthetic_tiny_stage2.py (only the router and alpha train, from a stage-1 checkpoint), with
# MoME's routing: one LiDAR and one camera weight per sample (granularity='sample': the router's logits averaged
# over the sample's queries, every query gets the same weights) and MoME's per-sample label as an auxiliary loss
# (aux_loss_weight=1: the weight of the modality ModalMask3D dropped is pushed to 0, models/aqr/aux_loss.py), next
# to the detection loss. The training pipeline's ModalMask3D (as in stage 1) makes the labels.
_base_ = ['./cmt_aqr_synthetic_tiny_stage2.py']

model = dict(pts_bbox_head=dict(aqr_config=dict(granularity='sample', aux_loss_weight=1.0)))
