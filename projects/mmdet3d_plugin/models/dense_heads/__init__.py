"""Detection heads."""
from .bev_aux_head import BevAuxHead
from .cmt_head import CmtHead
from .image_aux_head import ImageAuxHead
from .separate_task_head import SeparateTaskHead

__all__ = ['BevAuxHead', 'CmtHead', 'ImageAuxHead', 'SeparateTaskHead']
