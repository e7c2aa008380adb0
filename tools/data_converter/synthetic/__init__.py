"""Synthetic nuScenes-format dataset: scene layout, LiDAR ray casting, camera rendering, table writing."""
