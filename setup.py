"""CMT-AQR: an mmdetection3d 1.x plugin (CMT detector + Adaptive Query Routing).

The heavy dependencies (torch, a CPU/CUDA build of mmcv-full, a patched
mmdet3d) are installed by ``tools/setup_env.sh``; it installs this project
with ``pip install -e .`` and puts the checkout's root on ``sys.path`` (a
``.pth`` file, whatever editable mode pip chose): ``projects.mmdet3d_plugin``
and the tools' ``tools.data_converter`` import from any working directory,
so the scripts in ``tools/`` (``python tools/x.py``) need no ``sys.path`` edit.
"""
from setuptools import find_packages, setup

setup(
    name='cmt-aqr',
    version='0.1.0',
    description='CMT (Cross Modal Transformer) with Adaptive Query Routing for mmdetection3d 1.x',
    packages=find_packages(include=['projects', 'projects.*']),
    # the CPU slot kernel's source, compiled by tools/setup_env.sh (attention/slots/cpu_slot_dot.py)
    package_data={'projects.mmdet3d_plugin.attention.slots': ['*.cpp']},
    python_requires='>=3.11',
    license='Apache-2.0',
    extras_require={'flash': ['flash-attn']},
)
