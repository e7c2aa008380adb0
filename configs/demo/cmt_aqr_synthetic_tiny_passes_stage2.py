# Stage 2 of the robustness study on the camera-pass detector (arm `aqr_targets` of apis/study_arms.py): from a
# checkpoint of configs/demo/cmt_aqr_synthetic_tiny_passes_fixed_routing.py (load_from=...), train only the AQR
# modules (the weight generator and the attention bias generator, whose bias_scale is alpha) with make demo's
# per-query routing targets (query_loss_weight=1: LiDAR = the matched object's box keeps >= 5 points, camera = its
# centre is in a live view); everything else keeps the checkpoint's weights and BatchNorm statistics
# (projects/mmdet3d_plugin/mmcv_custom/freeze_parameters.py).
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']

custom_imports = dict(imports=['projects.mmdet3d_plugin.mmcv_custom.freeze_parameters'], allow_failed_imports=False)
custom_hooks = [
    dict(type='FreezeParametersHook',
         trainable=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator'])
]
