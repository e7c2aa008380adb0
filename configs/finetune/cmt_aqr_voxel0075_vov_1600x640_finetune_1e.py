# CMT-AQR VoV 1600x640 from a trained CMT: as cmt_aqr_voxel0100_r50_800x320_finetune_1e.py, for the VoV config
# (baseline twin: cmt_voxel0075_vov_1600x640_finetune_1e.py).
_base_ = ['./cmt_voxel0075_vov_1600x640_finetune_1e.py']

model = dict(
    pts_bbox_head=dict(
        aqr_config=dict(type='AQRWeightGenerator', window_sizes=[15, 5]),
        attention_bias_config=dict(
            type='AttentionBiasGenerator', window_size=15, bias_scale=1.0, use_local_bias=True, fp16=True)))
optimizer = dict(paramwise_cfg=dict(custom_keys={
    'aqr_weight_generator': dict(lr_mult=10.0),
    'attention_bias_generator': dict(lr_mult=10.0),
}))
