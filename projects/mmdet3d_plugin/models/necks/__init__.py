"""Image necks."""
from .cp_fpn import CPFPN

__all__ = ['CPFPN']
