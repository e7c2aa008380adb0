"""experiments/lie_probe_features.py: capturing the router, its windows, the passes' disagreement."""
import pytest
import torch
from torch import nn

from projects.mmdet3d_plugin.experiments.lie_probe_features import (PROBE_PASSES, RouterCapture, capture_router,
                                                                    disagreement_features, masked_mean,
                                                                    nearby_best_score, pass_features,
                                                                    router_features, window_means)
from projects.mmdet3d_plugin.models.aqr.weight_generator import AQRWeightGenerator
from projects.mmdet3d_plugin.models.dense_heads.pass_plan import FUSED

C = 8


def _generator():
    return AQRWeightGenerator(embed_dims=C, num_heads=2, window_sizes=[3, 3], feedforward_channels=16)


def _memory():
    """A 5 x 5 BEV map and 2 camera views of 4 x 4 whose channel 0 is the token's index in the fused memory."""
    bev = torch.zeros(1, C, 5, 5)
    bev[0, 0] = torch.arange(25.0).view(5, 5)
    img = torch.zeros(2, C, 4, 4)
    img[:, 0] = 25 + torch.arange(32.0).view(2, 4, 4)
    return bev, img


def _projection():
    # query 0: BEV cell (2, 2), camera cell (view 1, 1, 1); query 1: BEV corner (0, 0), seen by no camera
    return dict(pts_bev=torch.tensor([[[2, 2], [0, 0]]]), pts_idx=torch.tensor([[12, 0]]),
                pts_pers_idx=torch.tensor([[[1, 1, 1], [-1, -1, -1]]]), visible=torch.tensor([[True, False]]))


def test_masked_mean_averages_the_valid_tokens_only():
    tokens = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert masked_mean(tokens, torch.tensor([[True, True, False]])).tolist() == [[2.0, 3.0]]
    assert masked_mean(tokens, torch.zeros(1, 3, dtype=torch.bool)).tolist() == [[0.0, 0.0]]


def test_window_means_average_the_routers_bev_and_camera_windows():
    bev, img = _memory()
    bev_mean, camera_mean, share = window_means(_generator(), bev, img, _projection())
    assert bev_mean.shape == camera_mean.shape == (1, 2, C) and share.shape == (1, 2, 2)
    # an interior 3 x 3 window of a linear ramp averages to its centre; the corner keeps 4 cells: 0, 1, 5, 6
    assert bev_mean[0, :, 0].tolist() == pytest.approx([12.0, 3.0])
    assert camera_mean[0, 0, 0].item() == pytest.approx(25 + 16 + 4 + 1)
    assert camera_mean[0, 1].abs().sum() == 0  # no camera sees query 1
    assert share[0].flatten().tolist() == pytest.approx([1.0, 1.0, 4 / 9, 0.0])


def test_router_features_concatenate_hidden_state_query_and_windows():
    bev, img = _memory()
    capture = RouterCapture(inputs=dict(query_embed=torch.ones(1, 2, C), bev_feat=bev, img_feat=img),
                            projection_info=_projection(), hidden=torch.full((1, 2, C), 2.0))
    features = router_features(capture, _generator())
    assert features.shape == (1, 2, 4 * C + 2)
    assert features[0, 0, 0] == 2.0 and features[0, 0, C] == 1.0 and features[0, 0, 2 * C] == 12.0
    assert features[0, 1, -2:].tolist() == pytest.approx([4 / 9, 0.0])


def _pass(scores, centres):
    """One task of two classes: ``scores [Q, 2]`` (probabilities), ``centres [Q, 2]``, one decoder layer, bs 1."""
    logits = torch.logit(torch.as_tensor(scores))
    return ([dict(cls_logits=logits[None, None], center=torch.as_tensor(centres)[None, None])], )


def test_nearby_best_score_is_the_best_prediction_within_2_m():
    centres = torch.tensor([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]])
    scores = torch.tensor([0.2, 0.6, 0.9])
    reference = torch.tensor([[0.5, 0.0], [5.0, 0.0], [10.0, 1.5]])
    assert nearby_best_score(centres, scores, reference).tolist() == pytest.approx([0.6, 0.0, 0.9])


def test_pass_features_hold_scores_best_offset_and_nearby_best():
    preds = _pass([[0.1, 0.8], [0.3, 0.2]], [[1.0, 1.0], [30.0, 0.0]])
    features, centres = pass_features(preds, 0, torch.tensor([[0.0, 0.0], [0.0, 0.0]]))
    assert features.shape == (2, 2 + 4)
    assert features[0].tolist() == pytest.approx([0.1, 0.8, 0.8, 1.0, 1.0, 0.8])
    assert features[1].tolist() == pytest.approx([0.3, 0.2, 0.3, 30.0, 0.0, 0.8])  # query 0's box is near
    assert centres.tolist() == [[1.0, 1.0], [30.0, 0.0]]


def test_disagreement_features_compare_the_lidar_and_camera_passes():
    reference = torch.zeros(1, 2, 2)
    passes = dict(fused=_pass([[0.5, 0.5], [0.5, 0.5]], [[0.0, 0.0], [0.0, 0.0]]),
                  lidar=_pass([[0.9, 0.1], [0.1, 0.1]], [[0.0, 0.0], [0.0, 0.0]]),
                  camera=_pass([[0.2, 0.1], [0.1, 0.1]], [[3.0, 4.0], [0.0, 0.0]]))
    bev_mean = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    camera_mean = torch.tensor([[[0.0, 1.0], [2.0, 0.0]]])
    features = disagreement_features(passes, reference, bev_mean, camera_mean)
    assert features.shape == (1, 2, 3 * (2 + 4) + 6)
    extra = features[0, 0, -6:]
    # LiDAR best 0.9 vs camera 0.2; nearby 0.9 vs 0.1 (the camera's box of query 0 is 5 m away); centres 5 m apart
    assert extra.tolist() == pytest.approx([0.7, 0.8, 5.0, 0.0, 5.0, 0.0], abs=1e-5)
    assert features[0, 1, -1].item() == pytest.approx(1.0)  # parallel windows


class _Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight_head = nn.Linear(C, 2)

    def forward(self, query_embed, reference_points, bev_feat, img_feat, geometry, pc_range, bev_pos=None,
                img_pos=None):
        weights = self.weight_head(query_embed * 3).sigmoid()
        return weights[..., 0], weights[..., 1], dict(visible=torch.ones(query_embed.shape[:2], dtype=torch.bool))


class _Head(nn.Module):
    """What capture_router reads of a CmtHead: the router, then the fused pass's decoding."""

    def __init__(self):
        super().__init__()
        self.aqr_weight_generator = _Router()
        self.decoded = []

    def forward(self, pts_feats, img_feats, img_metas):
        query = torch.ones(1, 3, C)
        self.aqr_weight_generator(query, torch.zeros(1, 3, 3), pts_feats[0], img_feats[0], None, [0] * 6)
        return self._decode_pass(FUSED, 'memory', 'reference')

    def _decode_pass(self, modality_pass, memory, reference):
        self.decoded.append((modality_pass.name, memory, reference))
        return modality_pass.name


def test_capture_router_keeps_the_routers_view_and_decodes_the_other_passes():
    head = _Head()
    with capture_router(head) as capture:
        assert head(['bev'], ['img'], img_metas=[dict(sample_idx='a')]) == 'fused'
        assert [capture.decode(name) for name in PROBE_PASSES] == list(PROBE_PASSES)
    assert capture.hidden.shape == (1, 3, C) and torch.all(capture.hidden == 3.0)
    assert capture.inputs['bev_feat'] == 'bev' and capture.inputs['pc_range'] == [0] * 6
    assert capture.img_metas == [dict(sample_idx='a')] and capture.projection_info['visible'].all()
    assert head.decoded[-1] == ('camera', 'memory', 'reference')
    # outside the block the head is as it was
    assert '_decode_pass' not in vars(head) and not head._forward_hooks and not head._forward_pre_hooks
    assert not head.aqr_weight_generator._forward_hooks


def test_capture_router_refuses_a_head_without_a_router():
    with pytest.raises(ValueError, match='AQR'):
        with capture_router(nn.Linear(2, 2)):
            pass
    with pytest.raises(RuntimeError, match='has not run'):
        RouterCapture().decode('lidar')
