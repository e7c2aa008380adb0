"""Pictures of AQR's routing on one test sample of a checkpoint (``tools/visualize_aqr.py``).

:func:`draw_aqr_pictures` runs the model's ordinary test forward on one test
sample (:func:`run_sample`, capturing the decoder) and writes:

* ``<prefix>_bev.png``: bird's-eye view with the LiDAR points, the ground
  truth (green), the predictions scoring at least ``score_thr`` (red) and
  every query's reference point coloured by its LiDAR weight;
* ``<prefix>_cameras.png``: the six input images (as the model saw them)
  with each query drawn in the camera AQR projected it to, coloured by its
  camera weight;
* ``<prefix>_query<Q>_bias.png``: the cross-attention bias of query ``Q``
  (default: the highest-scoring one) over the BEV keys and each camera's keys.

``<prefix>`` is ``sample<N>`` (``sample<N>_<corruption>`` under a
corruption). A plain CMT config has no routing: only the BEV picture with the
boxes is written. The drawing helpers are in ``core/visualization``.
"""
import logging
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from mmcv.parallel import collate
from mmdet.utils import get_root_logger
from mmdet3d.datasets import build_dataset
from torch import nn

from ..core.visualization import (camera_names, denormalize_image, plot_bev, plot_cameras, plot_query_bias,
                                  query_bias_row, query_centres, query_pixels, save_figure, split_key_bias)
from ..mmcv_custom.launch import default_device
from ..mmcv_custom.parallel import wrap_model
from .decoder_capture import DecoderSnapshot, capture_decoder, query_scores
from .test import apply_corruption, build_test_model, load_test_config, prepare_test_config


@dataclass
class AQRPictures:
    """What :func:`draw_aqr_pictures` drew.

    Attributes:
        files (dict[str, str]): ``'bev'``, ``'cameras'``, ``'bias'`` -> PNG path
            (only ``'bev'`` without routing).
        query (int): the query of the bias picture (among the matching queries).
        bev_bias (np.ndarray, optional): ``[H_bev, W_bev]`` its bias over the BEV keys.
        camera_bias (np.ndarray, optional): ``[N, H_img, W_img]`` over the camera keys.
    """

    files: Dict[str, str] = field(default_factory=dict)
    query: Optional[int] = None
    bev_bias: Optional[np.ndarray] = None
    camera_bias: Optional[np.ndarray] = None


def load_sample(dataset, index: int) -> dict:
    """Test sample ``index`` of ``dataset`` as a batch of one (``DataContainer`` s, as the data loader gives)."""
    if not 0 <= index < len(dataset):
        raise IndexError(f'--sample {index} is not a test sample: the test set has {len(dataset)} (0..'
                         f'{len(dataset) - 1})')
    return collate([dataset[index]], samples_per_gpu=1)


@dataclass
class SampleRun:
    """One test sample and what the model made of it (batch of one, first test-time augmentation).

    Attributes:
        data (dict): the collated model input.
        meta (dict): its ``img_metas``.
        result (dict): ``boxes_3d``, ``scores_3d``, ``labels_3d``.
        snapshot (DecoderSnapshot): the head's predictions, routing and bias.
        head (nn.Module): the detector's head.
        centres (np.ndarray): ``[Q, 3]`` metric reference points of the matching queries.
    """

    data: dict
    meta: dict
    result: dict
    snapshot: DecoderSnapshot
    head: nn.Module
    centres: np.ndarray


def run_sample(detector: nn.Module, dataset, index: int) -> SampleRun:
    """Run the detector's ordinary test forward on sample ``index`` of ``dataset``, capturing its decoder."""
    data = load_sample(dataset, index)
    model = wrap_model(detector, default_device(), False)
    model.eval()
    head = detector.pts_bbox_head
    with torch.no_grad(), capture_decoder(head) as snapshot:
        result = model(return_loss=False, rescale=True, **data)[0]['pts_bbox']
    centres = query_centres(head.reference_points.weight.detach().cpu().numpy(), head.pc_range)
    return SampleRun(data, data['img_metas'][0].data[0][0], result, snapshot, head, centres)


def draw_routing(run: SampleRun, class_names: Sequence[str], query: Optional[int], layer: int, prefix: str,
                 what: str, bev_layers: dict, logger: logging.Logger) -> AQRPictures:
    """The three AQR pictures of a run with routing.

    Args:
        run (SampleRun): the sample and the model's decoder snapshot.
        class_names (Sequence[str]): the classes (for the titles).
        query (int, optional): query of the bias picture (a valid index);
            None: the highest-scoring one.
        layer (int): decoder layer of a per-layer bias.
        prefix (str): path prefix of the PNGs.
        what (str): first line of the titles.
        bev_layers (dict): ``plot_bev`` arguments (points, boxes, query positions).
        logger (logging.Logger): warnings.

    Returns:
        AQRPictures: the PNG paths, the query and its bias maps.
    """
    routing, head = run.snapshot.routing, run.head
    scores, labels = (values[0].cpu() for values in query_scores(run.snapshot.preds_dicts))
    query = int(scores.argmax()) if query is None else query
    lidar_weights = routing.lidar_weights[0].float().cpu().numpy()
    camera_weights = routing.camera_weights[0].float().cpu().numpy()
    views = routing.projection_info['pts_pers_idx'][0, :, 0].cpu().numpy()
    about = (f'query {query}: score {scores[query]:.3f} ({class_names[labels[query]]}), '
             f'LiDAR weight {lidar_weights[query]:.3f}, camera weight {camera_weights[query]:.3f}')
    pictures = AQRPictures(query=query)
    figure = plot_bev(head.pc_range, query_values=lidar_weights, highlight=query,
                      title=f'{what}\nqueries coloured by LiDAR weight\nstar: {about}', **bev_layers)
    pictures.files['bev'] = save_figure(figure, f'{prefix}_bev.png')

    norm_cfg = run.meta['img_norm_cfg']
    images = [denormalize_image(img, norm_cfg['mean'], norm_cfg['std'], norm_cfg['to_rgb'])
              for img in run.data['img'][0].data[0][0]]
    names = camera_names(run.meta['filename'])
    pixels = query_pixels(run.centres, np.stack(run.meta['lidar2img']), views)
    figure = plot_cameras(images, names, pixels, views, camera_weights, highlight=query,
                          title=f'{what}: queries coloured by camera weight, {int((views < 0).sum())} of '
                          f'{len(views)} seen by no camera\nstar: {about}')
    pictures.files['cameras'] = save_figure(figure, f'{prefix}_cameras.png')

    if run.snapshot.cross_attn_bias is None:
        logger.warning('the decoder got no cross-attention bias (legacy feature modulation?): no bias picture')
        return pictures
    row, num_heads = query_bias_row(run.snapshot.cross_attn_bias, query, num_matching=len(scores), layer=layer)
    pictures.bev_bias, pictures.camera_bias = split_key_bias(row, run.snapshot.bev_shape, run.snapshot.camera_shape)
    heads = f', mean of {num_heads} heads' if num_heads > 1 else ''
    figure = plot_query_bias(pictures.bev_bias, pictures.camera_bias, head.pc_range, names, images,
                             query_xy=tuple(run.centres[query, :2]),
                             query_pixel=(int(views[query]), *pixels[query]) if views[query] >= 0 else None,
                             title=f'{what}\ncross-attention bias of {about}{heads}')
    pictures.files['bias'] = save_figure(figure, f'{prefix}_query{query}_bias.png')
    return pictures


def draw_aqr_pictures(config: str, checkpoint: str, out: str, sample: int = 0, query: Optional[int] = None,
                      score_thr: float = 0.3, layer: int = -1, corruption: Optional[str] = None,
                      corruption_seed: int = 0, cfg_options: Optional[dict] = None) -> AQRPictures:
    """Draw the pictures of the module doc for test sample ``sample`` into the folder ``out``.

    Args:
        config (str): the test config (a CMT-AQR config; a plain CMT one gets the BEV picture only).
        checkpoint (str): the checkpoint file.
        out (str): the folder of the PNGs.
        sample (int): index of the test sample.
        query (int, optional): query of the bias picture (default: the highest-scoring one).
        score_thr (float): draw predictions scoring at least this.
        layer (int): decoder layer of a per-layer bias (default: the last).
        corruption (str, optional): a corruption spec applied to the test inputs.
        corruption_seed (int): seed of a random corruption.
        cfg_options (dict, optional): config settings to override.

    Raises:
        IndexError: ``query`` is not a query of the head, or ``sample`` not a test sample.
    """
    cfg = load_test_config(config, cfg_options)
    prepare_test_config(cfg)
    logger = get_root_logger(log_level=cfg.log_level)
    cfg = apply_corruption(cfg, corruption, seed=corruption_seed, logger=logger)
    dataset = build_dataset(cfg.data.test)
    detector = build_test_model(cfg, checkpoint, dataset.CLASSES, logger=logger)
    num_query = detector.pts_bbox_head.num_query
    if query is not None and not 0 <= query < num_query:
        raise IndexError(f'--query {query} is not a query: the head has {num_query} (0..{num_query - 1})')
    run = run_sample(detector, dataset, sample)

    info = dataset.data_infos[sample]
    keep = run.result['scores_3d'] >= score_thr
    bev_layers = dict(
        points=run.data['points'][0].data[0][0].numpy() if 'points' in run.data else None,
        gt_boxes=dataset.get_ann_info(sample)['gt_bboxes_3d'].tensor.numpy() if 'gt_boxes' in info else None,
        pred_boxes=run.result['boxes_3d'].tensor[keep].numpy(),
        query_xy=run.centres[:, :2])
    tag = f'_{corruption.replace(":", "")}' if corruption else ''
    prefix = osp.join(out, f'sample{sample:04d}{tag}')
    what = (f'sample {sample} ({info["token"]}), {corruption or "clean"}: {int(keep.sum())} predictions '
            f'with score >= {score_thr}')
    if run.snapshot.routing is None:
        logger.warning(f'{config} has no AQR routing (plain CMT: no aqr_config in its head); drawing only the '
                       f'boxes and the queries')
        pictures = AQRPictures(files=dict(bev=save_figure(plot_bev(run.head.pc_range, title=what, **bev_layers),
                                                          f'{prefix}_bev.png')))
    else:
        pictures = draw_routing(run, dataset.CLASSES, query, layer, prefix, what, bev_layers, logger)
    logger.info(f'wrote {", ".join(pictures.files.values())}')
    return pictures
