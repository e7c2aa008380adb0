"""Let mmdet3d 1.0's visualizer write its box meshes with the trimesh this environment installs.

mmdet3d 1.0.0rc6's ``show_result`` (mmdet3d's ``tools/misc/browse_dataset.py``,
``dataset.show``) writes the boxes with ``trimesh.io.export.export_mesh``.
trimesh 3 renamed ``trimesh.io`` to ``trimesh.exchange``, and the trimesh 2
that mmdet3d pins uses ``np.bool``, which numpy 1.24 removed: no trimesh
installs beside this numpy that mmdet3d can call. :func:`patch_trimesh_io`
gives current trimesh its old name for the same module.
"""
import types

import trimesh
from trimesh.exchange import export


def patch_trimesh_io() -> bool:
    """Make ``trimesh.io.export`` name ``trimesh.exchange.export`` when trimesh has no ``io``; whether it did."""
    if hasattr(trimesh, 'io'):
        return False
    trimesh.io = types.SimpleNamespace(export=export)
    return True
