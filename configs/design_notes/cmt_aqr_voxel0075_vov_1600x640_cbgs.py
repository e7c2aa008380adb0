# CMT-AQR, VoVNet-99 at 1600x640, voxel 0.075, with the decoder attentions of the design notes
# (shared/seeds 002): ../cmt_aqr_voxel0075_vov_1600x640_cbgs.py with enable_aqr=True and both decoder
# attentions as PETRMultiheadFlashAttention with use_flashbias=True (flashbias where it applies
# exactly, else what backend='auto' picks, logged). Same parameters and state dict as that config.
# The self-attention keeps mmcv MultiheadAttention's dropout=0.1 meaning (on the attention
# probabilities and on the residual): attn_drop=0.1, dropout=0.1. The routing layer as an mmcv
# encoder_config is shown in ./cmt_aqr_voxel0100_r50_800x320_cbgs.py; see docs/aqr.md.
_base_ = ['../cmt_aqr_voxel0075_vov_1600x640_cbgs.py']

flash_attention = dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8, dropout=0.1,
                       use_flashbias=True)
model = dict(
    pts_bbox_head=dict(
        enable_aqr=True,
        transformer=dict(
            decoder=dict(transformerlayers=dict(attn_cfgs=[dict(flash_attention, attn_drop=0.1), flash_attention])))))
