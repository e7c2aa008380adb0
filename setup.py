"""CMT-AQR: an mmdetection3d 1.x plugin (CMT detector + Adaptive Query Routing).

The heavy dependencies (torch, a CPU/CUDA build of mmcv-full, a patched
mmdet3d) are installed by ``tools/setup_env.sh``; ``pip install -e .`` only
makes ``projects.mmdet3d_plugin`` importable.
"""
from setuptools import find_packages, setup

setup(
    name='cmt-aqr',
    version='0.1.0',
    description='CMT (Cross Modal Transformer) with Adaptive Query Routing for mmdetection3d 1.x',
    packages=find_packages(include=['projects', 'projects.*']),
    python_requires='>=3.11',
    extras_require={'flash': ['flash-attn']},
)
