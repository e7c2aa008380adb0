"""PassPlan: the head's key set, its passes' keys and biases, decoders and inference fallbacks."""
import pytest
import torch
from torch import nn

from projects.mmdet3d_plugin.models.dense_heads.pass_plan import (FUSED, MODALITY_PASSES, DecoderMemory, PassPlan,
                                                                  merge_sample_predictions)

LIDAR, CAMERA = MODALITY_PASSES['lidar'], MODALITY_PASSES['camera']
BS, C, H, W, N, h, w, P = 2, 4, 3, 5, 2, 2, 3, 7


def memory(bias=None):
    return DecoderMemory(torch.randn(BS, C, H, W), torch.randn(H * W, C), torch.randn(BS * N, C, h, w),
                         torch.randn(BS * N, h, w, C), bias)


def test_the_head_tokens_decide_which_pass_decodes_camera_tokens_only():
    fusion, camera_head = PassPlan(modality_passes=('fused', 'lidar', 'camera')), PassPlan(modalities=('camera', ))
    assert (fusion.uses_lidar, fusion.uses_camera) == (True, True)
    assert fusion.passes == (FUSED, LIDAR, CAMERA) and fusion.camera_only_passes == (CAMERA, )
    assert (camera_head.uses_lidar, camera_head.uses_camera) == (False, True)
    assert camera_head.camera_only_passes == (FUSED, ), "a camera-only head's fused pass decodes camera tokens only"
    assert PassPlan(modalities=('lidar', )).camera_only_passes == ()


def test_memory_of_a_pass_leaves_out_the_other_tokens_and_restricts_the_bias_to_its_keys():
    plan = PassPlan(modality_passes=('fused', 'lidar', 'camera'))
    bias = torch.randn(BS, 1, P, H * W + N * h * w)
    fused = memory(bias)
    assert plan.memory_of(FUSED, fused) is fused
    lidar = plan.memory_of(LIDAR, fused)
    assert lidar.img_feat is None and lidar.rv_pos is None and lidar.bev_feat is fused.bev_feat
    assert torch.equal(lidar.cross_attn_bias, bias[..., :H * W])
    camera = plan.memory_of(CAMERA, fused)
    assert camera.bev_feat is None and camera.bev_pos is None and camera.img_feat is fused.img_feat
    assert torch.equal(camera.cross_attn_bias, bias[..., H * W:])
    prior = torch.ones(BS, 1, P, N * h * w)
    assert plan.memory_of(CAMERA, fused, lambda: prior).cross_attn_bias is prior
    assert torch.equal(plan.memory_of(LIDAR, fused, lambda: prior).cross_attn_bias, bias[..., :H * W])
    assert plan.memory_of(LIDAR, memory()).cross_attn_bias is None


def test_separate_decoders_belong_to_the_single_modality_passes():
    plan = PassPlan(modality_passes=('fused', 'camera'), pass_decoders='separate')
    decoders = plan.build_separate_decoders(lambda: (nn.Linear(1, 1), nn.ModuleList([nn.Linear(1, 1)])))
    assert list(decoders) == ['camera'] and set(decoders['camera']) == {'transformer', 'task_heads'}
    shared = (nn.Linear(1, 1), nn.ModuleList())
    assert plan.decoder_of(FUSED, shared) is shared
    assert plan.decoder_of(CAMERA, shared)[0] is decoders['camera']['transformer']
    shared_plan = PassPlan(modality_passes=('fused', 'camera'))
    assert len(shared_plan.build_separate_decoders(lambda: 1 / 0)) == 0
    assert shared_plan.decoder_of(CAMERA, shared) is shared


def test_inference_passes_take_the_samples_without_a_sensor():
    plan = PassPlan(modality_passes=('fused', 'lidar', 'camera'), lidar_free_pass='camera', camera_free_pass='lidar')
    assert plan.needs_points_in_metas and plan.needs_blank_views_in_metas
    metas = [dict(lidar_points=torch.zeros(count, 3), blank_views=[blank] * 2)
             for count, blank in ((0, False), (4, True), (0, True), (4, False))]
    assert plan.inference_passes(metas) == ((FUSED, None), (CAMERA, (True, False, False, False)),
                                            (LIDAR, (False, True, False, False)))
    assert plan.inference_passes(metas[3:]) == ((FUSED, None), ), 'a pass that takes no sample is not decoded'
    assert not PassPlan().needs_points_in_metas and PassPlan().inference_passes([dict()]) == ((FUSED, None), )


def test_merge_takes_the_flagged_samples_from_the_other_pass():
    fused = ([dict(cls_logits=torch.zeros(1, 3, 2, 1))], )
    other = ([dict(cls_logits=torch.ones(1, 3, 2, 1))], )
    merged = merge_sample_predictions(fused, other, torch.tensor([False, True, False]))
    assert merged[0][0]['cls_logits'][0, :, 0, 0].tolist() == [0.0, 1.0, 0.0]


def test_bad_plans_raise():
    with pytest.raises(ValueError, match='modalities must be a non-empty subset'):
        PassPlan(modalities=('radar', ))
    with pytest.raises(ValueError, match=r"CmtHead\(modalities=\('camera',\)\) decodes camera tokens only"):
        PassPlan(modalities=('camera', ), modality_passes=('fused', 'camera'))
    with pytest.raises(ValueError, match="lacks 'fused'"):
        PassPlan(modality_passes=('lidar', ))
