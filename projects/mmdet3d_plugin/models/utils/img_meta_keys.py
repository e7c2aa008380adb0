"""Keys that ``CmtDetector`` writes into each sample's img_meta at test time when its head asks for them.

``LIDAR_POINTS_KEY``: the sample's LiDAR points ``[P, 3]`` (the head's
``needs_points_in_metas``: oracle routing, ``lidar_free_pass``).
``BLANK_VIEWS_KEY``: ``N`` bools, per camera view whether its image is blank
(the head's ``needs_blank_views_in_metas``: ``camera_free_pass``).
"""
LIDAR_POINTS_KEY = 'lidar_points'
BLANK_VIEWS_KEY = 'blank_views'
