"""Object shapes whose heading can be seen: a tall front part ("cab") and a lower rear part.

A symmetric cuboid looks the same from the front and from the back, so a detector
cannot learn its heading. Every synthetic object is therefore two boxes that fill
its annotated box exactly in x-y and height: the front :data:`FRONT_LENGTH_SHARE`
of its length at full height, the rest at :data:`REAR_HEIGHT_SHARE` of it. The
LiDAR sees the step in height (and, with ``front_intensity_offset``, a brighter,
retro-reflective front: one 0.4 m pillar shows it, where the step in height needs a
comparison across cells), and the cameras see the front face in
:data:`FRONT_FACE_BGR`. The annotation stays the object's full bounding box,
heading along its length axis towards the tall front.
"""
from typing import Tuple

import numpy as np

from .lidar import BoxSet

#: Share of an object's length taken by its full-height front part.
FRONT_LENGTH_SHARE = 0.4
#: Height of the rear part as a share of the object's height.
REAR_HEIGHT_SHARE = 0.6
#: Colour (BGR) of the front face of every object in the camera images.
FRONT_FACE_BGR = (255, 255, 255)


def object_parts(boxes: BoxSet, front_intensity_offset: float = 0.0) -> Tuple[BoxSet, np.ndarray, np.ndarray]:
    """The two boxes of every object.

    Args:
        boxes: ``B`` objects (box centres, full length / width / height, headings).
        front_intensity_offset: LiDAR intensity added to the front parts (the rear keeps its object's).

    Returns:
        tuple: the parts (a :class:`BoxSet` of ``2 * B`` boxes: object ``b``'s
        front part at ``2 * b``, its rear part at ``2 * b + 1``), the owner
        object of each part ``[2 * B]`` and whether a part is the front one
        ``[2 * B]`` bool.
    """
    length, width, height = boxes.lwh[:, 0], boxes.lwh[:, 1], boxes.lwh[:, 2]
    heading = np.stack([np.cos(boxes.yaws), np.sin(boxes.yaws), np.zeros_like(boxes.yaws)], axis=1)
    front_length = FRONT_LENGTH_SHARE * length
    rear_length, rear_height = length - front_length, REAR_HEIGHT_SHARE * height
    front_centers = boxes.centers + heading * ((length - front_length) / 2)[:, None]
    rear_centers = boxes.centers - heading * ((length - rear_length) / 2)[:, None]
    rear_centers[:, 2] -= (height - rear_height) / 2
    parts = BoxSet(
        centers=np.stack([front_centers, rear_centers], axis=1).reshape(-1, 3),
        lwh=np.stack([np.stack([front_length, width, height], 1), np.stack([rear_length, width, rear_height], 1)],
                     axis=1).reshape(-1, 3),
        yaws=np.repeat(boxes.yaws, 2),
        intensities=np.stack([boxes.intensities + front_intensity_offset, boxes.intensities], 1).reshape(-1))
    owner = np.repeat(np.arange(len(boxes)), 2)
    is_front = np.tile([True, False], len(boxes))
    return parts, owner, is_front
