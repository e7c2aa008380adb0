"""HeadOutputs: the typed record of CmtHead's forward, also upstream CMT's per-task sequence."""
import torch

from projects.mmdet3d_plugin.models.dense_heads.head_outputs import HeadOutputs, PassOutputs, fp32_predictions


def tasks(dtype=torch.float32):
    return ([dict(center=torch.zeros(2, 1, 3, 2, dtype=dtype), cls_logits=torch.ones(2, 1, 3, 1, dtype=dtype))],
            [dict(center=torch.zeros(2, 1, 3, 2, dtype=dtype), cls_logits=torch.ones(2, 1, 3, 2, dtype=dtype))])


def test_outputs_are_the_sequence_of_the_decoded_passs_task_predictions():
    fused = tasks()
    outputs = HeadOutputs(fused, passes=dict(camera=PassOutputs(tasks(), (True, False))))
    assert len(outputs) == 2 and outputs[1] is fused[1] and list(outputs) == list(fused)
    assert outputs[0][0]['cls_logits'].shape == (2, 1, 3, 1)
    assert outputs.routing is None and outputs.dn_queries is None and outputs.image_aux is None
    names = [(name, trained) for name, _, trained in outputs.decoding_passes()]
    assert names == [('fused', None), ('camera', (True, False))], 'the fused pass first, every sample trained'


def test_float_casts_half_predictions_of_every_pass_and_leaves_fp32_ones_as_they_are():
    half = HeadOutputs(tasks(torch.float16), passes=dict(lidar=PassOutputs(tasks(torch.float16), (True, True))))
    cast = half.float()
    assert all(value.dtype == torch.float32 for task in cast for value in task[0].values())
    assert all(value.dtype == torch.float32 for task in cast.passes['lidar'].tasks for value in task[0].values())
    assert half[0][0]['center'].dtype == torch.float16, 'a copy: the outputs themselves are unchanged'
    fp32 = HeadOutputs(tasks())
    assert fp32.float()[0][0]['center'] is fp32[0][0]['center'], 'fp32 tensors are not copied (bit-identical)'
    index = torch.arange(3)
    assert fp32_predictions([[dict(index=index)]])[0][0]['index'] is index, 'integer tensors are kept'
