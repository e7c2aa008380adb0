"""Synthetic spinning LiDAR: cast rays against the ground plane and the object boxes.

All geometry is in the global frame (ground ``z = 0``). Points on a box are moved a few
millimetres *inside* the box they hit, and ground points a few millimetres *below* the
ground, so that point-in-box counts are exact and robust to float32 storage.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

# Elevation limits of the nuScenes Velodyne HDL-32E, degrees.
ELEVATION_UP_DEG = 10.67
ELEVATION_DOWN_DEG = -30.67


def ray_directions(num_beams: int, num_azimuths: int) -> Tuple[np.ndarray, np.ndarray]:
    """Unit ray directions of one LiDAR revolution, in the LiDAR frame.

    Args:
        num_beams: number of laser rings (elevation angles).
        num_azimuths: rays per ring.

    Returns:
        tuple: directions ``[num_beams * num_azimuths, 3]`` and ring index ``[num_beams * num_azimuths]``.
    """
    if num_beams < 1 or num_azimuths < 1:
        raise ValueError(f'num_beams and num_azimuths must be >= 1, got {num_beams}, {num_azimuths}')
    elevation = np.deg2rad(np.linspace(ELEVATION_DOWN_DEG, ELEVATION_UP_DEG, num_beams))
    azimuth = np.linspace(-np.pi, np.pi, num_azimuths, endpoint=False)
    elev, azim = np.meshgrid(elevation, azimuth, indexing='ij')
    dirs = np.stack([np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)], axis=-1)
    ring = np.broadcast_to(np.arange(num_beams)[:, None], elev.shape)
    return dirs.reshape(-1, 3), ring.reshape(-1).astype(np.float32)


@dataclass(frozen=True)
class BoxSet:
    """Oriented boxes standing on the ground, global frame.

    Args:
        centers: ``[B, 3]`` box centres.
        lwh: ``[B, 3]`` full (length, width, height); length is along the box heading.
        yaws: ``[B]`` headings in radians.
        intensities: ``[B]`` mean LiDAR intensity of each box surface.
    """

    centers: np.ndarray
    lwh: np.ndarray
    yaws: np.ndarray
    intensities: np.ndarray

    def __len__(self) -> int:
        return int(self.centers.shape[0])


@dataclass(frozen=True)
class LidarScan:
    """Result of one revolution.

    Args:
        points: ``[N, 3]`` global hit points.
        intensity: ``[N]``.
        ring: ``[N]`` ring (beam) index.
        box_index: ``[N]`` index of the object hit, -1 for ground.
        rays_on_box: ``[B]`` rays hitting each object first (what the LiDAR sees of it).
        rays_unoccluded: ``[B]`` rays that would hit each object if no other object were there.
    """

    points: np.ndarray
    intensity: np.ndarray
    ring: np.ndarray
    box_index: np.ndarray
    rays_on_box: np.ndarray
    rays_unoccluded: np.ndarray


def _ray_box_entry(origin: np.ndarray, dirs: np.ndarray, center: np.ndarray, lwh: np.ndarray,
                   yaw: float) -> np.ndarray:
    """Distance along each ray to where it enters the box, ``inf`` when it misses (slab test).

    Only the rays that pass within the box's bounding sphere are slab-tested: a scan has tens
    of thousands of rays and a box subtends a few degrees of them.

    Args:
        origin: ``[3]`` ray origin (outside the box).
        dirs: ``[R, 3]`` unit directions.

    Returns:
        np.ndarray: ``[R]`` entry distances.
    """
    entry = np.full(dirs.shape[0], np.inf)
    to_center = center - origin
    along = dirs @ to_center
    radius_sq = float(np.sum((lwh / 2.0) ** 2))
    near = np.nonzero((along > 0) & (to_center @ to_center - along ** 2 < radius_sq))[0]
    if near.size == 0:
        return entry
    c, s = np.cos(yaw), np.sin(yaw)
    to_local = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
    o = to_local @ (origin - center)
    d = dirs[near] @ to_local.T
    half = lwh / 2.0
    with np.errstate(divide='ignore', invalid='ignore'):
        t1 = (-half - o) / d
        t2 = (half - o) / d
    t_near = np.nanmax(np.minimum(t1, t2), axis=1)
    t_far = np.nanmin(np.maximum(t1, t2), axis=1)
    hit = (t_near <= t_far) & (t_near > 0)
    entry[near] = np.where(hit, t_near, np.inf)
    return entry


def cast_scan(origin: np.ndarray, dirs: np.ndarray, ring: np.ndarray, boxes: BoxSet, max_range: float,
              rng: np.random.Generator, owner: Optional[np.ndarray] = None) -> LidarScan:
    """Cast every ray against the ground plane ``z = 0`` and the boxes; keep the first hit.

    Args:
        origin: ``[3]`` global LiDAR position (above the ground).
        dirs: ``[R, 3]`` global unit ray directions.
        ring: ``[R]`` ring index of each ray.
        boxes: the boxes.
        max_range: rays that hit nothing closer are dropped.
        rng: random generator for the measurement noise.
        owner: ``[len(boxes)]`` the object each box is a part of (objects made of several
            boxes, see ``shape.object_parts``); None: every box is an object.

    Returns:
        LidarScan: the points and per-object visibility counts (``box_index`` is the object).
    """
    num_rays = dirs.shape[0]
    owner = np.arange(len(boxes)) if owner is None else np.asarray(owner)
    num_objects = int(owner.max()) + 1 if len(owner) else 0
    with np.errstate(divide='ignore'):
        t_ground = np.where(dirs[:, 2] < -1e-6, -origin[2] / dirs[:, 2], np.inf)
    t_boxes = np.stack([_ray_box_entry(origin, dirs, boxes.centers[b], boxes.lwh[b], boxes.yaws[b])
                        for b in range(len(boxes))], axis=1) if len(boxes) else np.full((num_rays, 0), np.inf)
    t_objects = np.stack([t_boxes[:, owner == o].min(axis=1) for o in range(num_objects)], axis=1) \
        if num_objects else np.full((num_rays, 0), np.inf)
    t_box_min = t_boxes.min(axis=1) if len(boxes) else np.full(num_rays, np.inf)
    nearest_box = t_boxes.argmin(axis=1) if len(boxes) else np.zeros(num_rays, dtype=np.int64)
    hits_box = t_box_min < np.minimum(t_ground, max_range)
    hits_ground = ~hits_box & (t_ground < max_range)

    rays_unoccluded = (t_objects < np.minimum(t_ground, max_range)[:, None]).sum(axis=0)
    rays_on_box = np.bincount(owner[nearest_box[hits_box]], minlength=num_objects)

    box_rays = np.nonzero(hits_box)[0]
    part_ids = nearest_box[box_rays]
    depth_inside = rng.uniform(0.005, 0.03, size=box_rays.shape[0])
    box_points = origin + dirs[box_rays] * (t_box_min[box_rays] + depth_inside)[:, None]
    box_points = _clamp_inside(box_points, part_ids, boxes, margin=1e-3)

    ground_rays = np.nonzero(hits_ground)[0]
    ground_t = t_ground[ground_rays] + rng.normal(0.0, 0.02, size=ground_rays.shape[0])
    ground_points = origin + dirs[ground_rays] * ground_t[:, None]
    ground_points[:, 2] = -rng.uniform(0.002, 0.02, size=ground_rays.shape[0])

    points = np.concatenate([box_points, ground_points], axis=0)
    intensity = np.concatenate([
        boxes.intensities[part_ids] + rng.normal(0.0, 5.0, size=part_ids.shape[0]),
        rng.uniform(2.0, 15.0, size=ground_rays.shape[0])]).clip(0.0, 255.0)
    return LidarScan(points=points,
                     intensity=intensity,
                     ring=np.concatenate([ring[box_rays], ring[ground_rays]]),
                     box_index=np.concatenate([owner[part_ids], np.full(ground_rays.shape[0], -1)]),
                     rays_on_box=rays_on_box,
                     rays_unoccluded=rays_unoccluded)


def _clamp_inside(points: np.ndarray, box_ids: np.ndarray, boxes: BoxSet, margin: float) -> np.ndarray:
    """Clamp each point into the interior of its box shrunk by ``margin`` (global frame)."""
    out = points.copy()
    for b in np.unique(box_ids):
        sel = box_ids == b
        c, s = np.cos(boxes.yaws[b]), np.sin(boxes.yaws[b])
        rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        local = (points[sel] - boxes.centers[b]) @ rot
        half = boxes.lwh[b] / 2.0 - margin
        out[sel] = np.clip(local, -half, half) @ rot.T + boxes.centers[b]
    return out
