"""Parameter-wise optimizer options in one parameter group per distinct set of options.

With a ``paramwise_cfg`` (CMT's configs: the image backbone at ``lr_mult=0.01, decay_mult=5``, the image neck
at ``lr_mult=0.1``) mmcv's ``DefaultOptimizerConstructor`` gives **every parameter its own group**: over 400
groups for the R50 models, with three distinct sets of options among them. A PyTorch optimizer steps group by
group, so every group costs a pass of Python and, on a GPU, its own kernel launches (AdamW's ``foreach`` path
runs about a dozen multi-tensor kernels per group): thousands of tiny launches per training step.

:class:`MergedParamGroupsOptimizerConstructor` gives every parameter the options ``DefaultOptimizerConstructor``
gives it and then puts the parameters with equal options in one group (:func:`merge_param_groups`), in the
order of first appearance, each group's parameters in the model's order. The update is the same: a group's
options apply to each of its tensors independently (mmcv's optimizers update every tensor element-wise), so
the parameters after any number of steps are identical to the per-parameter groups' (tested bit for bit).
Learning-rate and momentum hooks set every group from its own ``initial_lr`` and momentum, so merged groups
stay merged.

A checkpoint saved with the per-parameter groups still resumes: a ``load_state_dict`` pre-hook of the optimizer
(:func:`regroup_optimizer_state`) renumbers its per-parameter state into the merged layout and checks that the
groups it merges still hold equal options. A state saved in another merged layout (a changed
``paramwise_cfg``) is refused by PyTorch's own check of the group count.
"""
from functools import partial
from itertools import accumulate
from typing import Dict, List, Optional, Sequence, Tuple

from mmcv.runner import OPTIMIZER_BUILDERS, OPTIMIZERS, DefaultOptimizerConstructor
from mmcv.utils import build_from_cfg
from torch import nn
from torch.optim import Optimizer


def _options(group: dict) -> dict:
    """A parameter group's options: everything but its ``params``."""
    return {key: value for key, value in group.items() if key != 'params'}


def merge_param_groups(groups: Sequence[dict]) -> Tuple[List[dict], List[int]]:
    """Merge parameter groups with equal options.

    Args:
        groups (Sequence[dict]): optimizer parameter groups (``params`` a
            list of tensors, the other keys options), e.g. one per parameter.

    Returns:
        tuple: the merged groups (one per distinct set of options, in order of
        first appearance; each keeps its parameters in the given order) and,
        for every parameter of ``groups`` in their order, its position in the
        merged groups' parameters (flattened in group order), the numbering
        ``Optimizer.state_dict()`` uses.
    """
    merged: List[dict] = []
    members: List[List[int]] = []
    position = 0
    for group in groups:
        options = _options(group)
        target = next((index for index, known in enumerate(merged) if _options(known) == options), None)
        if target is None:
            merged.append(dict(options, params=[]))
            members.append([])
            target = len(merged) - 1
        for param in group['params']:
            merged[target]['params'].append(param)
            members[target].append(position)
            position += 1
    new_position = [0] * position
    for flat, old in enumerate(old for group_members in members for old in group_members):
        new_position[old] = flat
    return merged, new_position


def regroup_optimizer_state(state_dict: dict, new_position: Sequence[int], group_sizes: Sequence[int]) -> dict:
    """An optimizer state dict saved with the unmerged groups, renumbered into the merged layout.

    Args:
        state_dict (dict): ``Optimizer.state_dict()`` of the unmerged groups
            (``param_groups`` whose ``params`` are the parameters' numbers in
            the unmerged order, ``state`` per number).
        new_position (Sequence[int]): from :func:`merge_param_groups`: the
            merged position of every parameter of the unmerged order.
        group_sizes (Sequence[int]): parameters of each merged group.

    Returns:
        dict: the state dict for the merged groups; each merged group takes the
        saved options of its parameters (a learning-rate schedule's current
        ``lr`` and ``initial_lr`` included).

    Raises:
        ValueError: the saved state holds another number of parameters, or
            parameters the merged layout puts in one group were saved with
            different options.
    """
    saved_numbers = [number for group in state_dict['param_groups'] for number in group['params']]
    if len(saved_numbers) != len(new_position):
        raise ValueError(f'the optimizer state holds {len(saved_numbers)} parameters, the optimizer '
                         f'{len(new_position)}: it was saved for another model')
    saved_options = [_options(group) for group in state_dict['param_groups'] for _ in group['params']]
    group_of = [group for group, size in enumerate(group_sizes) for _ in range(size)]
    first_member: Dict[int, int] = {}
    for old, new in enumerate(new_position):
        first = first_member.setdefault(group_of[new], old)
        if saved_options[old] != saved_options[first]:
            raise ValueError(f'parameters {first} and {old} share an optimizer group now but were saved with '
                             f'different options ({saved_options[first]} and {saved_options[old]}): the '
                             f'checkpoint was made with another paramwise_cfg')
    state = {new_position[old]: state_dict['state'][number]
             for old, number in enumerate(saved_numbers) if number in state_dict['state']}
    starts = [0, *accumulate(group_sizes)]
    param_groups = [dict(saved_options[first_member[group]], params=list(range(starts[group], starts[group + 1])))
                    for group in range(len(group_sizes))]
    return dict(state=state, param_groups=param_groups)


def _regroup_unmerged_state(optimizer: Optimizer, state_dict: dict, new_position: Sequence[int]) -> Optional[dict]:
    """``load_state_dict`` pre-hook: a state dict saved with one group per parameter (mmcv's layout) is regrouped;
    any other layout is left to ``Optimizer.load_state_dict`` (which refuses another number of groups)."""
    groups = state_dict['param_groups']
    if len(groups) == len(optimizer.param_groups) or any(len(group['params']) != 1 for group in groups):
        return None
    return regroup_optimizer_state(state_dict, new_position, [len(group['params']) for group in optimizer.param_groups])


@OPTIMIZER_BUILDERS.register_module()
class MergedParamGroupsOptimizerConstructor(DefaultOptimizerConstructor):
    """``DefaultOptimizerConstructor`` whose parameters with equal options share one group.

    Configured like mmcv's constructor (``optimizer = dict(type='AdamW', ...,
    paramwise_cfg=dict(custom_keys=...), constructor=
    'MergedParamGroupsOptimizerConstructor')``); without a ``paramwise_cfg``
    it builds what mmcv builds (one group holding every parameter). See the
    module docstring.
    """

    def __call__(self, model: nn.Module) -> Optimizer:
        if hasattr(model, 'module'):
            model = model.module
        if not self.paramwise_cfg:
            return super().__call__(model)
        groups: List[Dict] = []
        self.add_params(groups, model)
        # compared with the optimizer's defaults filled in: mmcv writes some options out (a bias's lr) and not others
        unmerged = build_from_cfg(dict(self.optimizer_cfg, params=groups), OPTIMIZERS)
        merged, new_position = merge_param_groups(unmerged.param_groups)
        optimizer = build_from_cfg(dict(self.optimizer_cfg, params=merged), OPTIMIZERS)
        optimizer.register_load_state_dict_pre_hook(partial(_regroup_unmerged_state, new_position=new_position))
        return optimizer
