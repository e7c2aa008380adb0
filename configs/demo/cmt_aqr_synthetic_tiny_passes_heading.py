# make demo's CMT-AQR (configs/demo/cmt_aqr_synthetic_tiny_passes.py) with boxes that point the right way
# (make demo MODEL=cmt_aqr_heading, whose data gives every object a LiDAR-bright front:
# make_synthetic_nuscenes.py --front-intensity-offset 40):
# * a dense heading (and heatmap, velocity) target on the BEV memory at each object's centre cell (BevAuxHead,
#   CenterPoint's targets), whose heading map also gives the fused pass's boxes their yaw at inference;
# * the box-axis term in the decoder's L1 loss (heading_axis_weight), which rewards the axis before the front.
# CMT's decoder reads the BEV features through attention and, in the demo's 12 epochs, learns no heading from its L1
# on (sin, cos) alone. What this costs in mAP and gains in mAOE: docs/demo.md, "Heading and velocity".
_base_ = ['./cmt_aqr_synthetic_tiny_passes.py']
model = dict(
    pts_bbox_head=dict(bev_aux_config=dict(type='BevAuxHead', heading_at_inference=True)),
    train_cfg=dict(pts=dict(heading_axis_weight=2.0)))
