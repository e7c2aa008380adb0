# CMT-AQR, ResNet-50 at 800x320, voxel 0.1, written in the design notes' vocabulary
# (shared/seeds 000 and 002): the same model as ../cmt_aqr_voxel0100_r50_800x320_cbgs.py, with
# * enable_aqr=True, the notes' switch (False would build plain CMT and log that the AQR dicts are unused);
# * the routing layer of AQRWeightGenerator given as an mmcv encoder config (encoder_config): its
#   sizes are read from it; its attention runs over each query's gathered LiDAR / camera windows;
# * use_flashbias=True: prefer the 'flashbias' attention backend where it applies exactly, else
#   what backend='auto' picks (logged). In the routing layer the window mask is a gather, so
#   flashbias never applies there; in the decoder's cross-attention it applies to the global
#   (segment) bias, and the windowed local bias used here falls back to 'auto'.
# The notes' legacy keys renderer_config / modulator_config are refused with their names here
# (weight_renderer_config / feature_modulator_config, with modulation='feature').
_base_ = ['../cmt_voxel0100_r50_800x320_cbgs.py']

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
                    dict(type='MultiheadAttention', embed_dims=256, num_heads=8, dropout=0.1),
                    dict(type='PETRMultiheadFlashAttention', embed_dims=256, num_heads=8, dropout=0.1,
                         use_flashbias=True),
                ])))))
