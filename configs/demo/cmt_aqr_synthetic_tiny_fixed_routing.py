# The robustness study's stage 1 (tools/robustness_study.py, arm `stage1` of experiments/study_arms.py): CMT-AQR whose
# AQR modules never train. The router stays at its initialisation, so every query trusts both modalities
# equally (weights 0.9 +- 0.01: init_weight with a near-zero weight head) and gets the same +4 window bias
# around its BEV cell and its camera cell (alpha stays at bias_scale = 5): CMT with a fixed locality prior and
# no routing, while everything else trains. The plain demo CMT (configs/demo/cmt_synthetic_tiny.py) does not
# learn to localise its queries within a CPU budget (docs/demo.md), so a study started from it compares
# models that detect nothing. From this checkpoint the study trains (a) only the router and alpha
# (configs/demo/cmt_aqr_synthetic_tiny_stage2.py) and (b) this config further: the same iterations without routing.
_base_ = ['./cmt_aqr_synthetic_tiny.py']

custom_imports = dict(imports=['projects.mmdet3d_plugin.mmcv_custom.freeze_parameters'], allow_failed_imports=False)
custom_hooks = [
    dict(type='FreezeParametersHook',
         frozen=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator'])
]
