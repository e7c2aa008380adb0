"""spconv's CPU scatter-add is replaced by a race-free one; every sparse conv of the demo encoder matches a dense conv."""
import torch
from mmcv import Config
from mmdet3d.models import build_middle_encoder

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.mmcv_custom.sparse_conv_check import check_sparse_convs
from projects.mmdet3d_plugin.mmcv_custom.spconv_cpu_scatter import (is_spconv_cpu_scatter_add_patched,
                                                                     scatter_add_rows)


def test_scatter_add_rows_matches_indexed_add():
    out, rows = torch.zeros(50, 3), torch.randn(60, 3)
    idx = torch.randperm(50)[:40].int()
    expected = out.clone()
    expected[idx.long()] += rows[:40]
    assert torch.equal(scatter_add_rows(out, rows, idx), expected)
    assert is_spconv_cpu_scatter_add_patched()


def test_demo_sparse_encoder_matches_dense_conv_every_run():
    cfg = Config.fromfile('configs/demo/cmt_aqr_synthetic_tiny.py')
    enc = build_middle_encoder(cfg.model.pts_middle_encoder).eval()
    depth, height, width = cfg.model.pts_middle_encoder.sparse_shape
    g = torch.Generator().manual_seed(0)
    flat = torch.randperm(depth * height * width, generator=g)[:4000]
    coors = torch.stack([torch.zeros_like(flat), flat // (height * width), flat // width % height, flat % width],
                        1).int()
    feats = torch.randn(4000, 5, generator=g)
    outputs = []
    for _ in range(3):
        report = check_sparse_convs(enc, lambda: outputs.append(enc(feats, coors, 1)))
        bad = {name: r for name, r in report.items() if not r['ok']}
        assert not bad, bad
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])
