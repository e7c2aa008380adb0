"""nuScenes dataset with the multi-view camera geometry CMT needs.

Info file (``ann_file``, a pickle written by ``tools/create_data.py`` in the upstream CMT / mmdet3d format),
the keys read here:

* ``metadata.version`` (str): nuScenes version, e.g. ``'v1.0-trainval'``.
* ``infos`` (list[dict]), one per key frame, each with
    * ``token`` (str), ``timestamp`` (int, microseconds), ``lidar_path`` (str), ``sweeps`` (list[dict], read by
      mmdet3d's ``LoadPointsFromMultiSweeps``: ``data_path``, ``sensor2lidar_rotation``,
      ``sensor2lidar_translation``, ``timestamp``),
    * ``cams`` (dict camera name -> dict) when the camera is used, each with ``data_path`` (str),
      ``sensor2lidar_rotation`` ``[3, 3]``, ``sensor2lidar_translation`` ``[3]``, ``cam_intrinsic`` ``[3, 3]``
      and optionally ``timestamp`` (int, microseconds),
    * for training / evaluation (mmdet3d's ``get_ann_info``): ``gt_boxes`` ``[N, 7]`` (centre x, y, z, sizes
      along x, y, z, yaw), ``gt_names`` ``[N]``, ``gt_velocity`` ``[N, 2]``, ``num_lidar_pts`` ``[N]``,
      ``valid_flag`` ``[N]`` (with ``use_valid_flag=True``),
    * ``ego2global_*`` / ``lidar2ego_*`` for the nuScenes evaluation.

``get_data_info`` adds per camera (in the order of ``cams``) ``camera_names``, ``img_filename``,
``img_timestamp`` (s), ``lidar2cam``, ``cam_intrinsic`` and ``lidar2img = cam_intrinsic @ lidar2cam`` (``[4, 4]``
each), with ``intrinsics`` / ``extrinsics`` the same list objects as ``cam_intrinsic`` / ``lidar2cam``; it
raises ``FileNotFoundError`` naming the sample and a missing LiDAR file or image. ``evaluate`` (mmdet3d's) runs
the devkit's ``DetectionEval`` on the validation split (``val`` or ``mini_val``) of the info file's version,
with ``data_root`` the nuScenes root holding its ``<version>/`` tables.
"""
import os.path as osp
from typing import IO, Dict, List, Optional, Union

import mmcv
from mmcv.utils import print_log
from mmdet.datasets import DATASETS
from mmdet3d.datasets import NuScenesDataset

from .camera_geometry import compose_lidar2img, lidar2cam_from_sensor2lidar, pad_intrinsic

_FRAME_KEYS = ('token', 'timestamp', 'lidar_path', 'sweeps')
_CAMERA_KEYS = ('data_path', 'sensor2lidar_rotation', 'sensor2lidar_translation', 'cam_intrinsic')
_ANNOTATION_KEYS = ('gt_boxes', 'gt_names', 'gt_velocity', 'num_lidar_pts')


@DATASETS.register_module()
class CustomNuScenesDataset(NuScenesDataset):
    """mmdet3d's ``NuScenesDataset`` plus per-view camera matrices.

    Args:
        version (str, optional): expected nuScenes version; when given, an info
            file whose ``metadata.version`` differs raises ``ValueError``.
        **kwargs: the arguments of mmdet3d's ``NuScenesDataset``.
    """

    def __init__(self, ann_file: str, *args, version: Optional[str] = None, **kwargs) -> None:
        if not osp.isfile(ann_file):
            raise FileNotFoundError(f'nuScenes info file not found: {ann_file} (create it with '
                                    f'tools/create_data.py nuscenes)')
        self.expected_version = version
        super().__init__(ann_file, *args, **kwargs)
        if self.data_root is not None and not osp.isdir(self.data_root):
            raise FileNotFoundError(f'nuScenes data root not found: {self.data_root}')

    def load_annotations(self, ann_file: Union[str, IO[bytes]]) -> List[Dict]:
        """Load and check the info pickle; sets ``self.metadata`` and ``self.version``.

        Args:
            ann_file: the path, or the open file mmdet3d's ``Custom3DDataset`` passes.

        Raises:
            KeyError: the file lacks ``infos`` / ``metadata.version`` or an info
                lacks a required key.
            ValueError: ``metadata.version`` differs from the configured ``version``.
        """
        data = mmcv.load(ann_file, file_format='pkl')
        ann_file = self.ann_file
        if not isinstance(data, dict) or 'infos' not in data or 'version' not in data.get('metadata', {}):
            raise KeyError(f'{ann_file} is not a CMT/mmdet3d nuScenes info file: it needs "infos" and '
                           f'"metadata.version"')
        version = data['metadata']['version']
        if self.expected_version is not None and version != self.expected_version:
            raise ValueError(f'{ann_file} holds nuScenes version {version!r} but the config expects '
                             f'{self.expected_version!r}')
        infos = list(sorted(data['infos'], key=lambda info: info['timestamp']))[::self.load_interval]
        if infos:
            self._check_info_keys(infos[0], ann_file)
        self.metadata = data['metadata']
        self.version = version
        return infos

    def _check_info_keys(self, info: Dict, ann_file: str) -> None:
        required = list(_FRAME_KEYS)
        if not self.test_mode:
            required += list(_ANNOTATION_KEYS) + (['valid_flag'] if self.use_valid_flag else [])
        if self.modality is not None and self.modality.get('use_camera', False):
            required.append('cams')
        missing = [key for key in required if key not in info]
        if missing:
            raise KeyError(f'infos in {ann_file} lack {missing}')
        for name, cam_info in info.get('cams', {}).items():
            missing = [key for key in _CAMERA_KEYS if key not in cam_info]
            if missing:
                raise KeyError(f'camera {name} of the infos in {ann_file} lacks {missing}')

    def get_data_info(self, index: int) -> Dict:
        """Inputs of the pipeline for sample ``index``.

        Returns:
            dict: ``sample_idx``, ``pts_filename``, ``sweeps``, ``timestamp``
            (s); with the camera also ``img_filename``, ``img_timestamp``,
            ``lidar2cam``, ``cam_intrinsic``, ``lidar2img`` (lists of ``[4, 4]``
            per view), ``intrinsics`` / ``extrinsics`` (aliases); ``ann_info``
            in training, and in test mode when the info has annotations (only
            test-time corruptions such as ``object_drop`` read it there; the
            test pipelines collect no annotation for the model).
        """
        info = self.data_infos[index]
        self._check_files(info)
        input_dict = dict(
            sample_idx=info['token'],
            pts_filename=info['lidar_path'],
            sweeps=info['sweeps'],
            timestamp=info['timestamp'] / 1e6,
        )
        if self.modality['use_camera']:
            input_dict.update(self._camera_inputs(info))
        if not self.test_mode or 'gt_boxes' in info:
            input_dict['ann_info'] = self.get_ann_info(index)
        return input_dict

    def _check_files(self, info: Dict) -> None:
        files = [(info['lidar_path'], 'LiDAR file')] if self.modality.get('use_lidar', False) else []
        if self.modality.get('use_camera', False):
            files += [(cam_info['data_path'], f'{name} image') for name, cam_info in info['cams'].items()]
        for path, what in files:
            if not osp.isfile(path):
                raise FileNotFoundError(f'sample {info["token"]}: {what} not found: {path}')

    def _evaluate_single(self, result_path: str, logger=None, metric: str = 'bbox',
                         result_name: str = 'pts_bbox') -> Dict[str, float]:
        """mmdet3d's devkit evaluation, after checking that the tables it loads exist."""
        table_dir = osp.join(self.data_root or '', self.version)
        if not osp.isdir(table_dir):
            raise FileNotFoundError(f'nuScenes evaluation needs the {self.version} tables at {table_dir}: set the '
                                    f'dataset data_root to the nuScenes root the infos were made from')
        if not any(mmcv.load(result_path)['results'].values()):
            return self._no_detection_metrics(result_name, logger)
        return super()._evaluate_single(result_path, logger=logger, metric=metric, result_name=result_name)

    def _no_detection_metrics(self, result_name: str, logger=None) -> Dict[str, float]:
        """The metrics of a detector that outputs no box at all: every AP 0, every TP error 1, mAP = NDS = 0.

        The devkit's ``DetectionEval`` cannot load a result file without boxes
        (it raises ``Invalid box type: None``), so they are filled in here
        with the values it assigns to a class without predictions.
        """
        print_log('nuScenes evaluation: the results hold no box at all; reporting mAP = NDS = 0', logger=logger)
        prefix = f'{result_name}_NuScenes'
        metrics = {f'{prefix}/{name}_AP_dist_{dist}': 0.0
                   for name in self.CLASSES for dist in self.eval_detection_configs.dist_ths}
        metrics.update({f'{prefix}/{name}_{error}': 1.0 for name in self.CLASSES for error in self.ErrNameMapping})
        metrics.update({f'{prefix}/{short}': 1.0 for short in self.ErrNameMapping.values()})
        metrics.update({f'{prefix}/NDS': 0.0, f'{prefix}/mAP': 0.0})
        return metrics

    @staticmethod
    def _camera_inputs(info: Dict) -> Dict:
        filenames, timestamps, lidar2cams, intrinsics = [], [], [], []
        for cam_info in info['cams'].values():
            filenames.append(cam_info['data_path'])
            timestamps.append(cam_info.get('timestamp', info['timestamp']) / 1e6)
            lidar2cams.append(lidar2cam_from_sensor2lidar(cam_info['sensor2lidar_rotation'],
                                                          cam_info['sensor2lidar_translation']))
            intrinsics.append(pad_intrinsic(cam_info['cam_intrinsic']))
        return dict(
            camera_names=list(info['cams']),
            img_filename=filenames,
            img_timestamp=timestamps,
            lidar2cam=lidar2cams,
            cam_intrinsic=intrinsics,
            lidar2img=compose_lidar2img(intrinsics, lidar2cams),
            intrinsics=intrinsics,
            extrinsics=lidar2cams,
        )
