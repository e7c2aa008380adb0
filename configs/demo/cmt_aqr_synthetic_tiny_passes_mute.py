# make demo's CMT-AQR (configs/demo/cmt_aqr_synthetic_tiny_passes.py) with the mute term of AttentionBiasGenerator
# (mute_scale): next to the +-alpha window bias, -beta * (1 - w) on every key of each modality, beta learned from 5.
# At the router's initial weights (0.9 for both modalities) the term is about -0.5 on every key, which a softmax
# ignores, so a stage-1 checkpoint decodes as before; a query that routes a modality away (w -> 0) lowers all of
# its keys by up to beta, not only its window. The robustness study's lever for a stronger mute.
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']

model = dict(pts_bbox_head=dict(attention_bias_config=dict(mute_scale=5.0)))
