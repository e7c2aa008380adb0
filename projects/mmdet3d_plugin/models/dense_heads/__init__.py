"""Detection heads."""
from .cmt_head import CmtHead, CmtImageHead, CmtLidarHead
from .image_aux_head import ImageAuxHead
from .separate_task_head import SeparateTaskHead

__all__ = ['CmtHead', 'CmtImageHead', 'CmtLidarHead', 'ImageAuxHead', 'SeparateTaskHead']
