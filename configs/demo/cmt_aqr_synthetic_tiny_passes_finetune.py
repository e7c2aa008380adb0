# The published CMT-AQR fine-tune recipe (configs/finetune/cmt_aqr_*_finetune_1e.py) at the demo's scale: the
# robustness study's stage 1 (routing off), standing in for a trained CMT, fine-tuned 1 epoch exactly as its
# baseline twin cmt_aqr_synthetic_tiny_passes_fixed_routing_finetune.py, but with the router and alpha learning
# (at 10x the learning rate) from the detection loss alone (no routing targets, as the published recipe). Loaded
# from stage 1, it starts exactly where stage 1 is.
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']

model = dict(pts_bbox_head=dict(aqr_config=dict(query_loss_weight=0.0)))
optimizer = dict(lr=3.5e-5, paramwise_cfg=dict(custom_keys={
    'aqr_weight_generator': dict(lr_mult=10.0),
    'attention_bias_generator': dict(lr_mult=10.0),
}))
lr_config = dict(_delete_=True, policy='CosineAnnealing', by_epoch=False, min_lr=0.0, warmup='linear',
                 warmup_iters=4, warmup_ratio=0.1)
runner = dict(max_epochs=1)
custom_hooks = [dict(type='DisableObjectSampleHook', disable_after_epoch=0)]
