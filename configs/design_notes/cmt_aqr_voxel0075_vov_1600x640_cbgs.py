# CMT-AQR, VoVNet-99 at 1600x640, voxel 0.075, in the design notes' vocabulary (shared/seeds 000
# and 002): ../cmt_aqr_voxel0075_vov_1600x640_cbgs.py with enable_aqr=True, the routing layer as an
# mmcv encoder config, and both decoder attentions as PETRMultiheadFlashAttention with
# use_flashbias=True (flashbias where it applies exactly, else what backend='auto' picks, logged).
# Same parameters and state dict as the plain config. The self-attention keeps mmcv
# MultiheadAttention's dropout=0.1 meaning (on the attention probabilities and the residual):
# attn_drop=0.1, dropout=0.1. See docs/aqr.md, "The design notes' vocabulary".
_base_ = ['../cmt_voxel0075_vov_1600x640_cbgs.py']

model = dict(
    pts_bbox_head=dict(
        enable_aqr=True,
        aqr_config=dict(
            type='AQRWeightGenerator',
            embed_dims=256,
            window_sizes=[15, 5],
            encoder_config=dict(
                type='DetrTransformerEncoder',
                num_layers=1,
                transformerlayers=dict(
                    type='BaseTransformerLayer',
                    attn_cfgs=[
                        dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8, dropout=0.1,
                             use_flashbias=True),
                    ],
                    feedforward_channels=1024,
                    ffn_dropout=0.1,
                    operation_order=('cross_attn', 'norm', 'ffn', 'norm')))),
        attention_bias_config=dict(
            type='AttentionBiasGenerator', window_size=15, bias_scale=1.0, use_local_bias=True, fp16=True),
        transformer=dict(
            decoder=dict(
                transformerlayers=dict(attn_cfgs=[
                    dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8, attn_drop=0.1, dropout=0.1,
                         use_flashbias=True),
                    dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8, dropout=0.1,
                         use_flashbias=True),
                ])))))
