"""tools/visualize_aqr.py and its drawing helpers (projects/mmdet3d_plugin/core/visualization)."""
import os.path as osp

import mmcv
import numpy as np
import pytest
import torch
from matplotlib.image import imread

from projects.mmdet3d_plugin.attention import AttentionBias, SegmentBias
from projects.mmdet3d_plugin.core.visualization import (camera_names, denormalize_image, plot_bev, plot_cameras,
                                                        plot_query_bias, query_bias_row, query_centres,
                                                        query_pixels, save_figure, split_key_bias)
from projects.mmdet3d_plugin.core.visualization.bias_plot import biased_extent
from projects.mmdet3d_plugin.core.visualization.camera_plot import view_grid
from tools import visualize_aqr

NUSCENES_CAMERAS = ['CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT', 'CAM_BACK_RIGHT']
PC_RANGE = [-10.0, -20.0, -5.0, 30.0, 20.0, 3.0]


def _png(path: str, min_height: int, min_width: int) -> np.ndarray:
    """The RGB(A) pixels of a PNG, checked to be a real picture (large enough, not one flat colour)."""
    assert osp.isfile(path) and path.endswith('.png')
    pixels = imread(path)
    assert pixels.shape[0] >= min_height and pixels.shape[1] >= min_width, pixels.shape
    assert pixels[..., :3].std() > 0.05
    return pixels


def test_aqr_pictures_of_a_sample(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint('cmt_aqr_synthetic_tiny')
    pictures = visualize_aqr.main([config, checkpoint, '--sample', '1', '--out', str(tmp_path), '--score-thr', '0'])
    assert sorted(pictures.files) == ['bev', 'bias', 'cameras']
    _png(pictures.files['bev'], 600, 600)
    _png(pictures.files['cameras'], 300, 900)
    _png(pictures.files['bias'], 400, 1200)
    assert pictures.files['bias'] == str(tmp_path / f'sample0001_query{pictures.query}_bias.png')

    # The bias picture shows the window of the highest-scoring query, centred on its own BEV cell.
    cfg = mmcv.Config.fromfile(config)
    state = torch.load(checkpoint, map_location='cpu')['state_dict']
    reference = state['pts_bbox_head.reference_points.weight'][pictures.query].numpy()
    bev = pictures.bev_bias
    grid = cfg.model.test_cfg.pts.grid_size[0] // cfg.model.test_cfg.pts.out_size_factor
    assert bev.shape == (grid, grid)
    cell = tuple(np.minimum((reference[[1, 0]] * grid).astype(int), grid - 1))  # (row from y, column from x)
    assert np.unravel_index(np.abs(bev).argmax(), bev.shape) == cell and bev[cell] != 0
    window = cfg.model.pts_bbox_head.attention_bias_config.window_size
    assert 1 < np.count_nonzero(bev) <= window * window
    biased_views = [view for view in range(len(pictures.camera_bias)) if pictures.camera_bias[view].any()]
    assert len(biased_views) <= 1  # the window lies in the one view the query was projected to (if any)


def test_chosen_query_and_corruption_name_the_files(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint('cmt_aqr_synthetic_tiny')
    pictures = visualize_aqr.main([config, checkpoint, '--sample', '0', '--out', str(tmp_path), '--query', '3',
                                   '--corruption', 'camera_drop'])
    assert pictures.query == 3
    assert sorted(osp.basename(path) for path in pictures.files.values()) == [
        'sample0000_camera_drop_bev.png', 'sample0000_camera_drop_cameras.png',
        'sample0000_camera_drop_query3_bias.png']
    with pytest.raises(IndexError, match='--query 999 is not a query'):
        visualize_aqr.main([config, checkpoint, '--out', str(tmp_path), '--query', '999'])
    with pytest.raises(IndexError, match='--sample 7 is not a test sample'):
        visualize_aqr.main([config, checkpoint, '--out', str(tmp_path), '--sample', '7'])


def test_plain_cmt_has_no_routing_to_show(demo_checkpoint, tmp_path, caplog):
    config, checkpoint = demo_checkpoint('cmt_synthetic_tiny')
    pictures = visualize_aqr.main([config, checkpoint, '--out', str(tmp_path)])
    assert list(pictures.files) == ['bev'] and pictures.bev_bias is None
    _png(pictures.files['bev'], 600, 600)
    assert 'has no AQR routing' in caplog.text
    assert sorted(path.name for path in tmp_path.iterdir()) == ['sample0000_bev.png']


def test_split_key_bias_follows_cmt_key_order():
    bev_shape, camera_shape = (3, 4), (2, 2, 5)
    row = np.arange(3 * 4 + 2 * 2 * 5)
    bev, camera = split_key_bias(row, bev_shape, camera_shape)
    assert bev[2, 1] == 2 * 4 + 1  # BEV token y * W + x
    assert camera[1, 0, 3] == 12 + (1 * 2 + 0) * 5 + 3  # camera tokens after the BEV ones, (view, h, w)
    with pytest.raises(ValueError, match='does not cover'):
        split_key_bias(row[:-1], bev_shape, camera_shape)


def test_query_bias_row_reads_one_query_averaged_over_heads():
    values = torch.arange(2 * 5 * 2, dtype=torch.float32).view(1, 2, 5, 2)  # [bs, heads, Q, (lidar, camera)]
    bias = AttentionBias(SegmentBias(values, (3, 4)), 7)
    row, heads = query_bias_row(bias, 1)
    assert heads == 2 and row.tolist() == [(2 + 12) / 2] * 3 + [(3 + 13) / 2] * 4
    # matching queries come after the DN queries: matching query 0 of 3 is query 2 of 5
    assert query_bias_row(bias, 0, num_matching=3)[0].tolist() == query_bias_row(bias, 2)[0].tolist()
    assert query_bias_row((bias, AttentionBias(SegmentBias(-values, (3, 4)), 7)), 1)[0][0] == -(2 + 12) / 2
    with pytest.raises(IndexError):
        query_bias_row(bias, 3, num_matching=3)


def test_query_geometry():
    centres = query_centres(np.array([[0.0, 0.0, 0.0], [1.0, 0.5, 2.0]]), PC_RANGE)
    assert centres.tolist() == [[-10.0, -20.0, -5.0], [30.0, 0.0, 3.0]]  # clamped to [0, 1] like AQR
    lidar2img = np.stack([np.eye(4), np.eye(4)])
    lidar2img[1, :3, :3] = [[100.0, 0.0, 50.0], [0.0, 100.0, 40.0], [0.0, 0.0, 1.0]]
    pixels = query_pixels(np.array([[0.0, 0.0, 10.0], [1.0, 2.0, 10.0]]), lidar2img, np.array([1, -1]))
    assert pixels[0].tolist() == [50.0, 40.0] and np.isnan(pixels[1]).all()
    with pytest.raises(ValueError, match='views'):
        query_pixels(centres, lidar2img, np.array([0, 2]))


def test_denormalize_image_inverts_the_pipeline_normalisation():
    mean, std = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
    bgr = np.random.default_rng(0).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    for to_rgb in (True, False):
        normalised = mmcv.imnormalize(bgr, mean, std, to_rgb).transpose(2, 0, 1)
        assert (denormalize_image(torch.from_numpy(normalised), mean, std, to_rgb) == bgr[..., ::-1]).all()
    assert camera_names(['data/samples/CAM_BACK/x.jpg', 'x.jpg']) == ['CAM_BACK', 'view 1']


def test_view_grid_places_nuscenes_cameras_front_row_first():
    rows, columns, places = view_grid(NUSCENES_CAMERAS)
    assert (rows, columns) == (2, 3)
    assert dict(zip(NUSCENES_CAMERAS, places)) == {
        'CAM_FRONT_LEFT': (0, 0), 'CAM_FRONT': (0, 1), 'CAM_FRONT_RIGHT': (0, 2),
        'CAM_BACK_LEFT': (1, 0), 'CAM_BACK': (1, 1), 'CAM_BACK_RIGHT': (1, 2)}
    assert view_grid(['a', 'b', 'c', 'd']) == (2, 3, [(0, 0), (0, 1), (0, 2), (1, 0)])


def test_biased_extent_zooms_on_the_window():
    bias = np.zeros((40, 40))
    bias[20:23, 10:13] = 1.0  # cells of 1 m x 1 m over PC_RANGE
    assert biased_extent(bias, PC_RANGE) == (-10.0 + 6, -10.0 + 17, -20.0 + 16, -20.0 + 27)
    assert biased_extent(np.zeros((4, 4)), PC_RANGE) == (-10.0, 30.0, -20.0, 20.0)


def test_plots_draw_what_they_are_given(tmp_path):
    boxes = np.array([[0.0, 0.0, -1.0, 4.0, 2.0, 1.5, 0.3]])
    query_xy = np.array([[5.0, 5.0], [-5.0, 10.0]])
    coloured = plot_bev(PC_RANGE, gt_boxes=boxes, pred_boxes=boxes + 1, query_xy=query_xy,
                        query_values=np.array([0.2, 0.8]), highlight=1)
    ax = coloured.axes[0]
    assert ax.get_xlim() == (-10.0, 30.0) and ax.get_ylim() == (-20.0, 20.0)
    assert len(coloured.axes) == 2  # with a colorbar
    assert len(plot_bev(PC_RANGE, query_xy=query_xy).axes) == 1  # plain CMT: no colorbar
    _png(save_figure(coloured, str(tmp_path / 'sub' / 'bev.png')), 600, 600)

    images = [np.full((40, 80, 3), 90 + 20 * view, dtype=np.uint8) for view in range(6)]
    cameras = plot_cameras(images, NUSCENES_CAMERAS, np.array([[10.0, 20.0], [np.nan, np.nan]]), np.array([2, -1]),
                           np.array([0.3, 0.9]), highlight=0)
    titles = {ax.get_title() for ax in cameras.axes}
    assert 'CAM_FRONT_LEFT (1 queries)' in titles and 'CAM_FRONT (0 queries)' in titles

    camera_bias = np.zeros((6, 2, 4))
    camera_bias[2, 1, 1] = -0.5
    bev_bias = np.zeros((40, 40))
    bev_bias[5, 5] = 0.25
    figure = plot_query_bias(bev_bias, camera_bias, PC_RANGE, NUSCENES_CAMERAS, images, query_xy=(-4.5, -14.5),
                             query_pixel=(2, 30.0, 30.0))
    heat = figure.axes[0].images[0]
    assert heat.norm.vmin == -0.5 and heat.norm.vmax == 0.5  # one symmetric scale for BEV and cameras
    _png(save_figure(figure, str(tmp_path / 'bias.png')), 400, 1200)
