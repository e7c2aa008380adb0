"""CMT-AQR's losses and boxes stay those of the recorded reference while AQR's code is optimised.

``tests/data/reference/cmt_aqr_r50/outputs.pt`` holds the training losses and
every query's test-time box code and class logits of the reduced R50 CMT-AQR config (fixed weights and inputs,
fp32 CPU), recorded before AQR's router was moved to sparse window products
(issue 24). Regenerate it only for an intended change of the outputs::

    python tests/models/aqr/test_aqr_outputs_unchanged.py
"""
import os
import random
import sys

import numpy as np
import torch

REFERENCE = os.path.join(os.path.dirname(__file__), '..', '..', 'data', 'reference', 'cmt_aqr_r50', 'outputs.pt')
BOX_OUTPUTS = ('center', 'height', 'dim', 'rot', 'vel', 'cls_logits')
#: widths of the box fields before the class logits, in BOX_OUTPUTS order
BOX_WIDTHS = (2, 1, 3, 2, 2)


def reference_outputs(cmt_test_data) -> dict:
    """Training losses and test boxes of the reduced R50 CMT-AQR config, everything seeded."""
    from mmdet3d.models import build_model

    import projects.mmdet3d_plugin  # noqa: F401
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    data = cmt_test_data['random_batch']((3, 2))
    model.train()
    torch.manual_seed(1)
    losses = model.forward_train(**data)
    model.eval()
    with torch.no_grad():
        img_feats, pts_feats = model.extract_feat(data['points'], img=data['img'], img_metas=data['img_metas'])
        outs = model.pts_bbox_head(pts_feats, img_feats, data['img_metas'])
    # every query's decoded box code and class logits of the last layer (the boxes simple_test ranks)
    boxes = [torch.cat([task[0][key][-1] for key in BOX_OUTPUTS], -1) for task in outs]
    return dict(losses={name: value.detach() for name, value in losses.items()}, boxes=boxes)


def test_losses_and_boxes_equal_the_recorded_reference(cmt_test_data):
    expected = torch.load(REFERENCE)
    actual = reference_outputs(cmt_test_data)
    differs = cmt_test_data['differs_from_reference']
    assert sorted(actual['losses']) == sorted(expected['losses'])
    for name, value in expected['losses'].items():
        assert not differs(actual['losses'][name], value), name
    assert len(actual['boxes']) == len(expected['boxes'])
    for task, (boxes, ref_boxes) in enumerate(zip(actual['boxes'], expected['boxes'])):
        assert boxes.shape == ref_boxes.shape
        widths = list(BOX_WIDTHS) + [boxes.size(-1) - sum(BOX_WIDTHS)]  # the rest: the task's class logits
        for key, field, ref_field in zip(BOX_OUTPUTS, boxes.split(widths, -1), ref_boxes.split(widths, -1)):
            assert not differs(field, ref_field), (task, key)


if __name__ == '__main__':
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
    from conftest import cmt_test_data as fixture  # noqa: E402
    torch.save(reference_outputs(fixture.__wrapped__()), REFERENCE)
    print(f'wrote {REFERENCE}')
