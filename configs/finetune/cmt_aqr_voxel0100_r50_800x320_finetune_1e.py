# CMT-AQR R50 800x320 from a trained CMT (the design notes' experiment): the CMT checkpoint of load_from plus
# cmt_aqr_voxel0100_r50_800x320_cbgs.py's AQR, fine-tuned 1 epoch exactly as its baseline twin
# cmt_voxel0100_r50_800x320_finetune_1e.py. The AQR bias starts at zero, so before the first step the model
# predicts the checkpoint's boxes and scores; the router and alpha, new, learn at 10x the learning rate.
# Every parameter trains; *_router_only.py trains the router and alpha only. The bias strength sweep:
# --cfg-options model.pts_bbox_head.attention_bias_config.bias_scale=3 (5, 7).
_base_ = ['./cmt_voxel0100_r50_800x320_finetune_1e.py']

model = dict(
    pts_bbox_head=dict(
        aqr_config=dict(type='AQRWeightGenerator', window_sizes=[15, 5]),
        attention_bias_config=dict(
            type='AttentionBiasGenerator', window_size=15, bias_scale=1.0, use_local_bias=True, fp16=True)))
optimizer = dict(paramwise_cfg=dict(custom_keys={
    'aqr_weight_generator': dict(lr_mult=10.0),
    'attention_bias_generator': dict(lr_mult=10.0),
}))
