# The published fine-tune recipe (configs/finetune/) at the demo's scale, baseline twin: the robustness study's
# stage 1 (cmt_aqr_synthetic_tiny_passes_fixed_routing.py: routing off, a fixed window prior), standing in for a
# trained CMT, fine-tuned 1 epoch with its router still frozen: no GT sampling, AdamW at 1/40 of the demo's peak
# learning rate (as the published recipe's 2e-5 is of upstream's peaks), warm-up over a tenth of the epoch (4 of
# its 40 iterations), cosine to 0 by iteration. tools/robustness_study.py --design finetune trains it against
# cmt_aqr_synthetic_tiny_passes_finetune.py (the same fine-tune with the router learning).
_base_ = ['./cmt_aqr_synthetic_tiny_passes_fixed_routing.py']

optimizer = dict(lr=3.5e-5)
lr_config = dict(_delete_=True, policy='CosineAnnealing', by_epoch=False, min_lr=0.0, warmup='linear',
                 warmup_iters=4, warmup_ratio=0.1)
runner = dict(max_epochs=1)
custom_hooks = [
    dict(type='DisableObjectSampleHook', disable_after_epoch=0),
    dict(type='FreezeParametersHook',
         frozen=['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator']),
]
