# CMT fusion VoV 1600x640 fine-tuned for 1 epoch from a trained CMT: the baseline twin of
# cmt_aqr_voxel0075_vov_1600x640_finetune_1e.py; everything as in cmt_voxel0100_r50_800x320_finetune_1e.py
# (no GT sampling, AdamW at 2e-5 with warm-up and cosine decay), for the VoV config.
_base_ = ['../cmt_voxel0075_vov_1600x640_cbgs.py']

load_from = 'work_dirs/cmt_voxel0075_vov_1600x640_cbgs/latest.pth'
optimizer = dict(lr=2e-5)
lr_config = dict(_delete_=True, policy='CosineAnnealing', by_epoch=False, min_lr=0.0, warmup='linear',
                 warmup_iters=500, warmup_ratio=0.1)
momentum_config = None
runner = dict(max_epochs=1)
custom_hooks = [dict(type='DisableObjectSampleHook', disable_after_epoch=0)]
