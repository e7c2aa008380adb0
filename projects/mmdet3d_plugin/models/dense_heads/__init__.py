"""Detection heads."""
from .cmt_head import CmtHead, CmtImageHead, CmtLidarHead
from .separate_task_head import SeparateTaskHead

__all__ = ['CmtHead', 'CmtImageHead', 'CmtLidarHead', 'SeparateTaskHead']
