# CMT-AQR for the CPU demo: configs/demo/cmt_synthetic_tiny.py plus the two AQR dicts, nothing else.
# Windows are smaller than the full-size configs' [15, 5] / 15 because the demo's feature maps are
# small (64 x 64 BEV, 6 x 12 per camera view).
_base_ = ['./cmt_synthetic_tiny.py']

model = dict(
    pts_bbox_head=dict(
        aqr_config=dict(type='AQRWeightGenerator', window_sizes=[5, 5], feedforward_channels=256),
        attention_bias_config=dict(
            type='AttentionBiasGenerator', window_size=5, bias_scale=1.0, use_local_bias=True, fp16=True)))
