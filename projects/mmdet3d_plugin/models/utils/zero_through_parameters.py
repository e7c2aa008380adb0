"""A zero that depends on every trainable parameter of some modules, for a training step that skips them."""
import torch
from torch import Tensor, nn


def zero_through_parameters(*modules: nn.Module) -> Tensor:
    """A zero scalar computed from every trainable parameter of ``modules``.

    ``DistributedDataParallel`` without ``find_unused_parameters`` waits in
    every iteration for a gradient of each parameter it registered. A step
    that skips a module for its input (the LiDAR encoders of a batch in which
    no sample has a point left: ``lidar_drop`` on every sample of a process)
    adds this to its output, so the skipped parameters get a zero gradient
    instead of none and the reduction completes.

    Returns:
        Tensor: ``[]``, 0 (on the parameters' device; a CPU zero without any).
    """
    terms = [parameter.sum() for module in modules for parameter in module.parameters() if parameter.requires_grad]
    return torch.stack(terms).sum() * 0 if terms else torch.zeros(())
