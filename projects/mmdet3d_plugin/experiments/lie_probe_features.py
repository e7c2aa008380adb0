"""What the lie probe reads per query: what today's router sees, and the modalities' disagreement.

:func:`capture_router` hooks a CMT-AQR head while the detector runs its ordinary test forward and keeps the
router's inputs and its hidden state before the weight head, and the fused pass's decoding arguments, so that
the same queries can be decoded again against the BEV tokens only (the shared decoder, the fused bias restricted
to them) and the camera tokens only (the camera pass: its decoder and prior) (:meth:`RouterCapture.decode`).

Per query (``C`` channels, ``K`` classes):

* :func:`router_features` ``[bs, Q, 4 C + 2]``: the hidden state, the query embedding, the mean of its gathered BEV
  window and of its camera window (the router's LAM windows) and the windows' valid shares;
* :func:`disagreement_features` ``[bs, Q, 3 (K + 4) + 6]``: per pass (fused, LiDAR-only, camera-only) the query's
  class scores, best score, its best class's centre offset from the reference point and the best score of the
  pass's predictions within 2 m of the reference point; the LiDAR-only minus camera-only best and nearby scores,
  the distances between the passes' centres and the cosine similarity of the two windows.
"""
import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..apis.object_metrics import MAX_DISTANCE_M, centres_within
from ..apis.sample_recorder import query_predictions
from ..models.aqr.weight_generator import flatten_memory
from ..models.dense_heads.pass_plan import FUSED, MODALITY_PASSES

#: The decoding passes the disagreement features compare, in feature order.
PROBE_PASSES = ('fused', 'lidar', 'camera')


@dataclass
class RouterCapture:
    """The router's view of the last batch and the fused pass's decoding arguments.

    Attributes:
        inputs (dict[str, Any]): ``AQRWeightGenerator.forward``'s arguments by name (``query_embed [bs, Q, C]``,
            ``reference_points [bs, Q, 3]``, ``bev_feat``, ``img_feat``, ``geometry``, ``pc_range``, ...).
        projection_info (dict[str, Tensor]): its third output (``pts_bev``, ``pts_pers_idx``, ``visible``).
        hidden (Tensor): ``[bs, Q, C]`` the input of its weight head.
        img_metas (list[dict]): the head's metas.
        fused_decoding (tuple): ``CmtHead._decode_pass``'s arguments after the pass of the fused call.
        decode_pass: the head's own ``_decode_pass``.
    """

    inputs: Dict[str, Any] = field(default_factory=dict)
    projection_info: Dict[str, Tensor] = field(default_factory=dict)
    hidden: Optional[Tensor] = None
    img_metas: List[dict] = field(default_factory=list)
    fused_decoding: Tuple = ()
    decode_pass: Any = None

    def decode(self, pass_name: str) -> Tuple[List[dict], ...]:
        """The queries of the last batch decoded by pass ``pass_name`` (:data:`PROBE_PASSES`): per task
        ``[dict]`` of ``[L, bs, Q, .]`` (``center`` in metres, ``cls_logits``)."""
        if not self.fused_decoding:
            raise RuntimeError('the head has not run inside capture_router')
        memory, *rest = self.fused_decoding
        return self.decode_pass(MODALITY_PASSES[pass_name], memory, *rest)


@contextlib.contextmanager
def capture_router(head: nn.Module) -> Iterator[RouterCapture]:
    """Record the router's inputs, hidden state and outputs and the fused decoding while the block runs.

    Args:
        head (nn.Module): a ``CmtHead`` with AQR (``aqr_weight_generator``).

    Yields:
        RouterCapture: filled in by every forward pass of the head.
    """
    generator = getattr(head, 'aqr_weight_generator', None)
    if generator is None:
        raise ValueError(f'{type(head).__name__} has no AQR router (aqr_weight_generator): the lie probe reads what '
                         f'the router sees; use a CMT-AQR checkpoint')
    capture = RouterCapture(decode_pass=head._decode_pass)
    generator_signature = inspect.signature(generator.forward)
    head_signature = inspect.signature(head.forward)

    def record_metas(module: nn.Module, args: tuple, kwargs: dict) -> None:
        capture.img_metas = list(head_signature.bind(*args, **kwargs).arguments['img_metas'])

    def record_router(module: nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        capture.inputs = dict(generator_signature.bind(*args, **kwargs).arguments)
        capture.projection_info = output[2]

    def record_hidden(module: nn.Module, args: tuple, output: Tensor) -> None:
        capture.hidden = args[0].detach()

    def recording_decode_pass(modality_pass, *args) -> Tuple[List[dict], ...]:
        if modality_pass is FUSED:
            capture.fused_decoding = args
        return capture.decode_pass(modality_pass, *args)

    handles = [head.register_forward_pre_hook(record_metas, with_kwargs=True),
               generator.register_forward_hook(record_router, with_kwargs=True),
               generator.weight_head.register_forward_hook(record_hidden)]
    head._decode_pass = recording_decode_pass
    try:
        yield capture
    finally:
        del head._decode_pass
        for handle in handles:
            handle.remove()


def masked_mean(tokens: Tensor, valid: Tensor) -> Tensor:
    """``[..., L, C]`` tokens averaged over the ``valid [..., L]`` ones: ``[..., C]`` (zeros where none is)."""
    weights = valid.to(tokens.dtype).unsqueeze(-1)
    return (tokens * weights).sum(dim=-2) / weights.sum(dim=-2).clamp(min=1.0)


def window_means(generator: nn.Module, bev_feat: Tensor, img_feat: Tensor,
                 projection_info: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Every query's BEV and camera window (the router's LAM windows, ``generator.window_index``), averaged.

    Args:
        generator (nn.Module): the ``AQRWeightGenerator``.
        bev_feat (Tensor): ``[bs, C, H, W]``.
        img_feat (Tensor): ``[bs * N, C, h, w]``.
        projection_info (dict[str, Tensor]): ``pts_bev``, ``pts_pers_idx``, ``visible`` of ``[bs, Q]`` queries.

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``bev_mean [bs, Q, C]``, ``camera_mean [bs, Q, C]`` and
        ``valid_share [bs, Q, 2]`` (the share of each window's cells on the map).
    """
    memory, bev_shape, camera_shape = flatten_memory(bev_feat, img_feat)
    index, valid = generator.window_index(projection_info, bev_shape, camera_shape)  # [bs, Q, L]
    bs, num_queries, length = index.shape
    channels = memory.shape[-1]
    tokens = memory.gather(1, index.reshape(bs, -1, 1).expand(-1, -1, channels)).view(bs, num_queries, length,
                                                                                         channels)
    split = generator.lidar_window ** 2
    share = torch.stack([valid[..., :split].float().mean(-1), valid[..., split:].float().mean(-1)], dim=-1)
    return (masked_mean(tokens[..., :split, :], valid[..., :split]),
            masked_mean(tokens[..., split:, :], valid[..., split:]), share)


def router_features(capture: RouterCapture, generator: nn.Module) -> Tensor:
    """Probe (a): what today's router sees, ``[bs, Q, 4 C + 2]`` (see the module docstring)."""
    inputs = capture.inputs
    bev_mean, camera_mean, share = window_means(generator, inputs['bev_feat'], inputs['img_feat'],
                                                capture.projection_info)
    return torch.cat([capture.hidden, inputs['query_embed'], bev_mean, camera_mean, share], dim=-1).float()


def nearby_best_score(centres: Tensor, scores: Tensor, reference_xy: Tensor,
                      max_distance: float = MAX_DISTANCE_M) -> Tensor:
    """Per query, the best score of the predictions whose centre lies within ``max_distance`` (BEV) of its
    reference point.

    Args:
        centres (Tensor): ``[P, 2]`` predicted centres.
        scores (Tensor): ``[P]`` their scores.
        reference_xy (Tensor): ``[Q, 2]`` reference points.
        max_distance (float): metres.

    Returns:
        Tensor: ``[Q]``; 0 where no prediction is near.
    """
    near = centres_within(reference_xy, centres, max_distance)  # [Q, P]
    return (scores[None, :] * near.to(scores.dtype)).amax(dim=1) if centres.numel() else scores.new_zeros(
        reference_xy.shape[0])


def pass_features(preds_dicts: Sequence[List[dict]], sample: int, reference_xy: Tensor) -> Tuple[Tensor, Tensor]:
    """One pass's view of one sample's queries.

    Args:
        preds_dicts (Sequence[list[dict]]): the pass's predictions (per task ``center``, ``cls_logits``).
        sample (int): index in the batch.
        reference_xy (Tensor): ``[Q, 2]`` the queries' reference points (metres).

    Returns:
        tuple[Tensor, Tensor]: ``features [Q, K + 4]`` (class scores, best score, best class's centre minus the
        reference point, best score within 2 m) and ``best_centres [Q, 2]``.
    """
    centres, scores = query_predictions(preds_dicts, sample)  # [K, Q, 2], [Q, K]
    best, label = scores.max(dim=-1)
    best_centres = centres.gather(0, label.view(1, -1, 1).expand(1, -1, 2))[0]
    nearby = nearby_best_score(best_centres, best, reference_xy)
    return torch.cat([scores, best[:, None], best_centres - reference_xy, nearby[:, None]], dim=-1), best_centres


def disagreement_features(passes: Dict[str, Sequence[List[dict]]], reference_xy: Tensor, bev_mean: Tensor,
                          camera_mean: Tensor) -> Tensor:
    """Probe (b)'s additions for a batch, ``[bs, Q, 3 (K + 4) + 6]`` (see the module docstring).

    Args:
        passes (dict[str, Sequence[list[dict]]]): the predictions of every pass of :data:`PROBE_PASSES`.
        reference_xy (Tensor): ``[bs, Q, 2]`` reference points (metres).
        bev_mean (Tensor): ``[bs, Q, C]`` mean BEV window (:func:`window_means`).
        camera_mean (Tensor): ``[bs, Q, C]`` mean camera window.
    """
    rows = []
    for sample in range(reference_xy.shape[0]):
        features, centres = zip(*(pass_features(passes[name], sample, reference_xy[sample])
                                  for name in PROBE_PASSES))
        _, lidar, camera = features
        fused_centre, lidar_centre, camera_centre = centres
        rows.append(torch.cat([
            *features, (lidar[:, -4] - camera[:, -4])[:, None], (lidar[:, -1] - camera[:, -1])[:, None],
            (lidar_centre - camera_centre).norm(dim=-1, keepdim=True),
            (fused_centre - lidar_centre).norm(dim=-1, keepdim=True),
            (fused_centre - camera_centre).norm(dim=-1, keepdim=True),
            F.cosine_similarity(bev_mean[sample], camera_mean[sample], dim=-1)[:, None]], dim=-1))
    return torch.stack(rows).float()
