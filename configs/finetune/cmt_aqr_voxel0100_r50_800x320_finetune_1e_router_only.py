# cmt_aqr_voxel0100_r50_800x320_finetune_1e.py training only the router and alpha (MoME's stage 2): every CMT parameter
# keeps the checkpoint's weights and BatchNorm statistics (FreezeParametersHook).
_base_ = ['./cmt_aqr_voxel0100_r50_800x320_finetune_1e.py']

custom_imports = dict(imports=['projects.mmdet3d_plugin', 'projects.mmdet3d_plugin.mmcv_custom.freeze_parameters'],
                      allow_failed_imports=False)
custom_hooks = [
    dict(type='DisableObjectSampleHook', disable_after_epoch=0),
    dict(type='FreezeParametersHook',
         trainable=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator']),
]
