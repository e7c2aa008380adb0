"""Scene layout of the synthetic dataset: object classes, ego path and object trajectories.

Everything lives in the nuScenes *global* frame: the ground is the plane ``z = 0``,
the ego moves on it along a constant-curvature path, and every object is a box standing
on the ground that moves with a constant velocity (static objects have zero velocity).
Positions at any time are closed-form, so LiDAR sweeps, camera frames and annotations
of the same instant agree exactly and the devkit's finite-difference velocity equals
the true one.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

# The 10 nuScenes detection classes, in the order of the CMT configs.
DETECTION_CLASSES: Tuple[str, ...] = (
    'car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier',
    'motorcycle', 'bicycle', 'pedestrian', 'traffic_cone')


@dataclass(frozen=True)
class ClassSpec:
    """What objects of one detection class look like.

    Args:
        categories: nuScenes category names the class is drawn from (first = most common).
        wlh: typical (width, length, height) in metres.
        max_speed: top speed in m/s (0 for objects that never move).
        moving_prob: probability that an instance moves.
        max_distance: farthest placement from the ego in metres (inside the devkit's
            per-class evaluation range).
        colour: BGR colour of the object in the camera images.
        intensity: mean LiDAR intensity of its surface.
    """

    categories: Tuple[str, ...]
    wlh: Tuple[float, float, float]
    max_speed: float
    moving_prob: float
    max_distance: float
    colour: Tuple[int, int, int]
    intensity: float


CLASS_SPECS = {
    'car': ClassSpec(('vehicle.car', ), (1.95, 4.6, 1.7), 8.0, 0.5, 45.0, (40, 40, 220), 60.0),
    'truck': ClassSpec(('vehicle.truck', ), (2.5, 6.9, 2.9), 6.0, 0.4, 45.0, (40, 160, 230), 55.0),
    'construction_vehicle': ClassSpec(('vehicle.construction', ), (2.8, 6.3, 3.2), 1.5, 0.2, 45.0,
                                      (30, 220, 230), 50.0),
    'bus': ClassSpec(('vehicle.bus.rigid', 'vehicle.bus.bendy'), (2.9, 11.0, 3.5), 6.0, 0.5, 45.0,
                     (200, 60, 40), 45.0),
    'trailer': ClassSpec(('vehicle.trailer', ), (2.9, 12.0, 3.9), 0.0, 0.0, 45.0, (130, 60, 130), 40.0),
    'barrier': ClassSpec(('movable_object.barrier', ), (2.5, 0.5, 1.0), 0.0, 0.0, 26.0, (200, 200, 200), 80.0),
    'motorcycle': ClassSpec(('vehicle.motorcycle', ), (0.8, 2.1, 1.5), 6.0, 0.6, 36.0, (220, 40, 220), 65.0),
    'bicycle': ClassSpec(('vehicle.bicycle', ), (0.6, 1.7, 1.3), 4.0, 0.5, 36.0, (60, 220, 60), 70.0),
    'pedestrian': ClassSpec(('human.pedestrian.adult', 'human.pedestrian.child',
                             'human.pedestrian.construction_worker'), (0.7, 0.75, 1.75), 1.5, 0.6, 36.0,
                            (230, 230, 40), 35.0),
    'traffic_cone': ClassSpec(('movable_object.trafficcone', ), (0.4, 0.4, 1.0), 0.0, 0.0, 26.0,
                              (0, 110, 255), 90.0),
}


@dataclass(frozen=True)
class EgoPath:
    """Ego motion with constant speed and yaw rate (a circle arc, or a line when ``yaw_rate == 0``).

    Args:
        start_xy: global (x, y) at ``t0`` in metres.
        start_yaw: heading at ``t0`` in radians.
        speed: m/s.
        yaw_rate: rad/s.
        t0: start time in seconds.
    """

    start_xy: Tuple[float, float]
    start_yaw: float
    speed: float
    yaw_rate: float
    t0: float

    def pose(self, t: float) -> Tuple[np.ndarray, float]:
        """Global ego pose at time ``t``: translation ``[3]`` (z = 0) and yaw."""
        dt = t - self.t0
        yaw = self.start_yaw + self.yaw_rate * dt
        if abs(self.yaw_rate) < 1e-9:
            dx = self.speed * dt * np.cos(self.start_yaw)
            dy = self.speed * dt * np.sin(self.start_yaw)
        else:
            radius = self.speed / self.yaw_rate
            dx = radius * (np.sin(yaw) - np.sin(self.start_yaw))
            dy = -radius * (np.cos(yaw) - np.cos(self.start_yaw))
        xy = np.array([self.start_xy[0] + dx, self.start_xy[1] + dy, 0.0])
        return xy, float(yaw)


@dataclass(frozen=True)
class SceneObject:
    """One annotated object: a box on the ground moving with constant velocity.

    Args:
        class_name: detection class (key of :data:`CLASS_SPECS`).
        category: nuScenes category name.
        wlh: (width, length, height) in metres.
        yaw: heading in the global frame (the box's length axis), radians.
        center_ref: global box centre ``[3]`` at ``t_ref`` (z = height / 2).
        velocity: global velocity ``[2]`` in m/s.
        t_ref: reference time in seconds.
        attribute: nuScenes attribute name, or ``''`` for classes without attributes.
    """

    class_name: str
    category: str
    wlh: Tuple[float, float, float]
    yaw: float
    center_ref: Tuple[float, float, float]
    velocity: Tuple[float, float]
    t_ref: float
    attribute: str

    def center(self, t: float) -> np.ndarray:
        """Global box centre ``[3]`` at time ``t``."""
        dt = t - self.t_ref
        return np.array([self.center_ref[0] + self.velocity[0] * dt,
                         self.center_ref[1] + self.velocity[1] * dt,
                         self.center_ref[2]])

    @property
    def bev_radius(self) -> float:
        """Half of the footprint diagonal: a circle that contains the box in BEV."""
        return 0.5 * float(np.hypot(self.wlh[0], self.wlh[1]))


def choose_attribute(class_name: str, moving: bool, rng: np.random.Generator) -> str:
    """nuScenes attribute consistent with the class and whether the object moves."""
    if class_name in ('barrier', 'traffic_cone'):
        return ''
    if class_name == 'pedestrian':
        if moving:
            return 'pedestrian.moving'
        return 'pedestrian.standing' if rng.random() < 0.8 else 'pedestrian.sitting_lying_down'
    if class_name in ('bicycle', 'motorcycle'):
        if moving:
            return 'cycle.with_rider'
        return 'cycle.without_rider' if rng.random() < 0.7 else 'cycle.with_rider'
    if moving:
        return 'vehicle.moving'
    return 'vehicle.parked' if rng.random() < 0.7 else 'vehicle.stopped'


def sample_ego_path(rng: np.random.Generator, t0: float, origin_xy: Tuple[float, float]) -> EgoPath:
    """A random slow ego path starting at ``origin_xy``."""
    return EgoPath(start_xy=(float(origin_xy[0]), float(origin_xy[1])),
                   start_yaw=float(rng.uniform(-np.pi, np.pi)),
                   speed=float(rng.uniform(0.0, 4.0)),
                   yaw_rate=float(rng.uniform(-0.08, 0.08)),
                   t0=t0)


def _ego_frame_offsets(obj: SceneObject, ego: EgoPath, times: Sequence[float]) -> np.ndarray:
    """Object centre in the ego frame ``[T, 2]`` at each time."""
    out = []
    for t in times:
        ego_xy, ego_yaw = ego.pose(t)
        d = obj.center(t)[:2] - ego_xy[:2]
        c, s = np.cos(ego_yaw), np.sin(ego_yaw)
        out.append([c * d[0] + s * d[1], -s * d[0] + c * d[1]])
    return np.asarray(out)


def _is_placeable(obj: SceneObject, placed: List[SceneObject], ego: EgoPath, times: Sequence[float],
                  max_abs_xy: float) -> bool:
    """Whether ``obj`` stays in range, clear of the ego and of every placed object at all ``times``."""
    offsets = _ego_frame_offsets(obj, ego, times)
    if np.abs(offsets).max() > max_abs_xy:
        return False
    if np.linalg.norm(offsets, axis=1).min() < obj.bev_radius + 3.5:
        return False
    for other in placed:
        gap = obj.bev_radius + other.bev_radius + 0.5
        for t in times:
            if np.linalg.norm(obj.center(t)[:2] - other.center(t)[:2]) < gap:
                return False
    return True


def _propose_object(class_name: str, rng: np.random.Generator, ego: EgoPath, t_ref: float,
                    azimuth: Optional[float], min_distance: float, max_distance: float) -> SceneObject:
    """Draw one object of ``class_name`` around the ego pose at ``t_ref``."""
    spec = CLASS_SPECS[class_name]
    wlh = tuple(float(v * rng.uniform(0.9, 1.1)) for v in spec.wlh)
    if azimuth is None:
        azimuth = rng.uniform(-np.pi, np.pi)
    distance = rng.uniform(min_distance, min(max_distance, spec.max_distance))
    ego_xy, ego_yaw = ego.pose(t_ref)
    angle = ego_yaw + azimuth
    center = (float(ego_xy[0] + distance * np.cos(angle)), float(ego_xy[1] + distance * np.sin(angle)),
              wlh[2] / 2.0)
    yaw = float(rng.uniform(-np.pi, np.pi))
    moving = spec.max_speed > 0 and rng.random() < spec.moving_prob
    speed = float(rng.uniform(0.4, 1.0) * spec.max_speed) if moving else 0.0
    velocity = (speed * float(np.cos(yaw)), speed * float(np.sin(yaw)))
    category = spec.categories[0] if rng.random() < 0.7 else spec.categories[int(rng.integers(len(spec.categories)))]
    return SceneObject(class_name=class_name, category=category, wlh=wlh, yaw=yaw, center_ref=center,
                       velocity=velocity, t_ref=t_ref, attribute=choose_attribute(class_name, moving, rng))


def sample_scene_objects(rng: np.random.Generator, ego: EgoPath, times: Sequence[float], num_objects: int,
                         max_abs_xy: float = 48.0, max_tries: int = 60) -> List[SceneObject]:
    """Place up to ``num_objects`` non-overlapping objects that stay within ``max_abs_xy`` of the ego.

    The first ``len(DETECTION_CLASSES)`` objects take one class each, spread evenly in
    azimuth at moderate distance (or, if that sector is blocked, anywhere), so every scene
    contains every class; the rest have random classes, positions and distances.

    Args:
        rng: random generator (the only source of randomness).
        ego: the ego path.
        times: every frame time in seconds (key frames and sweeps) at which the layout must be valid.
        num_objects: wanted number of objects; fewer are returned if no free spot is found.
        max_abs_xy: bound on |x| and |y| of every object centre in the ego frame, in metres;
            objects are drawn at most this far away (the guaranteed ones at most ``0.8 *`` as far).
        max_tries: proposals per object before giving up on it (twice as many for the
            guaranteed classes).

    Returns:
        list[SceneObject]: the placed objects.
    """
    if num_objects < 0:
        raise ValueError(f'num_objects must be >= 0, got {num_objects}')
    if max_abs_xy < 10.0:
        raise ValueError(f'max_abs_xy must be >= 10 m (objects keep 5 m from the ego), got {max_abs_xy}')
    near_limit, far_limit = min(20.0, 0.8 * max_abs_xy), min(45.0, max_abs_xy)
    t_ref = float(np.mean(times))
    placed: List[SceneObject] = []
    num_classes = len(DETECTION_CLASSES)
    for index in range(num_objects):
        guaranteed = index < num_classes
        class_name = DETECTION_CLASSES[index] if guaranteed else DETECTION_CLASSES[int(rng.integers(num_classes))]
        # A guaranteed class first tries its own azimuth sector nearby, then anywhere (a long trailer can find
        # its sector blocked by the bus next to it); the other objects go anywhere from the start.
        for attempt in range(2 * max_tries if guaranteed else max_tries):
            if guaranteed and attempt < max_tries:
                azimuth = 2 * np.pi * index / num_classes + rng.uniform(-0.2, 0.2)
                obj = _propose_object(class_name, rng, ego, t_ref, azimuth, 6.0, near_limit)
            else:
                obj = _propose_object(class_name, rng, ego, t_ref, None, 5.0, far_limit)
            if _is_placeable(obj, placed, ego, times, max_abs_xy):
                placed.append(obj)
                break
    return placed
