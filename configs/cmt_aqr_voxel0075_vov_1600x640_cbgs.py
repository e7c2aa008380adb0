# CMT-AQR: cmt_voxel0075_vov_1600x640_cbgs.py plus Adaptive Query Routing in the head, and nothing else.
# Per query, AQRWeightGenerator decides how much to trust LiDAR and camera (one local-window
# transformer layer, windows [camera 15, LiDAR 5] cells); AttentionBiasGenerator turns that into
# an additive bias on every decoder layer's cross-attention scores (windowed, linear decay).
# The features are not modified. See README "Turn a CMT config into CMT-AQR" and docs/aqr.md.
_base_ = ['./cmt_voxel0075_vov_1600x640_cbgs.py']

model = dict(
    pts_bbox_head=dict(
        aqr_config=dict(type='AQRWeightGenerator', window_sizes=[15, 5]),
        attention_bias_config=dict(
            type='AttentionBiasGenerator', window_size=15, bias_scale=1.0, use_local_bias=True, fp16=True)))
