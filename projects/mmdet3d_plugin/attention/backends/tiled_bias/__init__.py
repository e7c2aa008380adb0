"""The ``tiled_bias`` backend: the AQR bias evaluated inside the tiles of a Triton attention kernel.

* :mod:`.backend`: :class:`TiledBiasBackend` and its autograd function;
* :mod:`.tables`: the keys' cells and segments and the queries' window
  centres, as the kernels read them (pure torch);
* :mod:`.ops`: the kernels as PyTorch custom operators with fake
  implementations (traceable on fake CUDA tensors);
* :mod:`.kernels`: the Triton forward and backward kernels (imported when
  the backend runs).
"""
from .backend import TiledBiasBackend

__all__ = ['TiledBiasBackend']
