# CMT fusion R50 800x320 fine-tuned for 1 epoch from a trained CMT: the baseline twin of
# cmt_aqr_voxel0100_r50_800x320_finetune_1e.py (the same data, schedule and learning rate, no AQR), so that
# "CMT-AQR against the same CMT trained as long" is one pair of commands (docs/train_test.md).
# load_from: the CMT checkpoint (default: where `tools/train.py configs/cmt_voxel0100_r50_800x320_cbgs.py` writes
# it; --cfg-options load_from=<file> for another). No GT sampling, as in the last epochs of its 15e + 5e schedule;
# AdamW at 2e-5, linear warm-up over 500 iterations, cosine to 0 by iteration.
_base_ = ['../cmt_voxel0100_r50_800x320_cbgs.py']

load_from = 'work_dirs/cmt_voxel0100_r50_800x320_cbgs/latest.pth'
optimizer = dict(lr=2e-5)
lr_config = dict(_delete_=True, policy='CosineAnnealing', by_epoch=False, min_lr=0.0, warmup='linear',
                 warmup_iters=500, warmup_ratio=0.1)
momentum_config = None
runner = dict(max_epochs=1)
custom_hooks = [dict(type='DisableObjectSampleHook', disable_after_epoch=0)]
