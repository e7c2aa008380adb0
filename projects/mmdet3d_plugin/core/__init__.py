"""Detection utilities outside the network: box assignment, coding and matching costs (``bbox``), and pictures of
boxes and of AQR's routing (``visualization``, imported on demand: it needs matplotlib)."""
from . import bbox  # noqa: F401
