"""Box assignment, coding and matching costs."""
from . import bbox  # noqa: F401
