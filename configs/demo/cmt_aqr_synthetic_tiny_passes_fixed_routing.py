# The robustness study's stage 1 on the camera-pass detector (tools/robustness_study.py, arm `stage1` of
# experiments/study_arms.py): make demo's CMT-AQR (configs/demo/cmt_aqr_synthetic_tiny_passes.py: fused and camera
# passes, the camera-only model's locality prior on the camera pass, the camera learning aids) whose AQR modules never
# train. The router stays at its initialisation, so every query of the fused pass trusts both modalities equally
# (weights 0.9 +- 0.01) and gets the same +4 window bias around its BEV and camera cells (alpha stays at
# bias_scale): routing off, everything else trains. The study's control trains this config further with the
# stage-2 corruptions; its routing arms train make demo's config (and its global gate) from its checkpoint.
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']

custom_imports = dict(imports=['projects.mmdet3d_plugin.mmcv_custom.freeze_parameters'], allow_failed_imports=False)
custom_hooks = [
    dict(type='FreezeParametersHook',
         frozen=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator'])
]
