# CMT-AQR stage 2 for the demo (MoME's recipe; tools/robustness_study.py): start from a checkpoint of
# configs/demo/cmt_synthetic_tiny.py (load_from=...; the AQR modules are not in it and keep their initialisation,
# mmcv loads it non-strictly) and train only the AQR modules: the weight generator and the attention bias
# generator, whose bias_scale is alpha. Everything else keeps the checkpoint's weights and BatchNorm statistics
# (projects/mmdet3d_plugin/mmcv_custom/freeze_parameters.py).
_base_ = ['./cmt_aqr_synthetic_tiny.py']

custom_imports = dict(imports=['projects.mmdet3d_plugin.mmcv_custom.freeze_parameters'], allow_failed_imports=False)
custom_hooks = [
    dict(type='FreezeParametersHook',
         trainable=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator'])
]
