"""Data converters: nuScenes (real or synthetic) → info ``.pkl`` files and the GT database."""
