"""Checkpoints that survive a kill: atomic saving, and finding the newest loadable checkpoint to resume from.

mmcv's ``CheckpointHook`` writes ``epoch_N.pth`` in place and then replaces
the ``latest.pth`` link by removing it and creating a new one. A kill during
either step leaves a truncated checkpoint, possibly the very file
``latest.pth`` points to (a resumed run re-saves the epochs after its
checkpoint), or no ``latest.pth`` at all. :class:`AtomicCheckpointHook` makes
every file appear complete or not at all: the checkpoint is written into a
staging directory inside the output directory, flushed to disk with
``fsync`` and moved into place with ``os.replace`` (atomic on POSIX and
Windows within one file system); ``latest.pth`` is replaced the same way.
A kill leaves at most a hidden staging entry, removed by the next run.

:func:`find_latest_valid_checkpoint` is ``--auto-resume``'s search: the
numbered checkpoints of a work dir, newest first, skipping (with a warning)
those that cannot be loaded. :func:`find_resume_checkpoint_once` runs it on
rank 0 only and gives every process of a distributed run rank 0's answer.
"""
import logging
import os
import os.path as osp
import re
import shutil
import tempfile
from typing import List, Optional, Pattern, Tuple

import torch
import torch.distributed as dist
from mmcv.fileio.file_client import FileClient, HardDiskBackend
from mmcv.runner import HOOKS, CheckpointHook
from mmcv.runner.dist_utils import master_only
from mmcv.utils import print_log

#: Prefix of the hidden staging directories and temporary links in a checkpoint directory.
STAGING_PREFIX = '.checkpoint-staging-'
LATEST_NAME = 'latest.pth'
_NUMBERED_CHECKPOINT = re.compile(r'^[^.].*_(\d+)\.pth$')


def fsync_path(path: str) -> None:
    """Flush a file, or a directory's entries (POSIX only), to disk."""
    if osp.isdir(path):
        if os.name != 'posix':
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    with open(path, 'rb') as file:
        os.fsync(file.fileno())


def replace_link(target_name: str, link_path: str) -> None:
    """Make ``link_path`` point to ``target_name`` (a file of the same directory) atomically.

    A relative symlink where the system allows one, else a copy. The new link
    (or copy) is made under a temporary name and moved over ``link_path`` with
    ``os.replace``, so ``link_path`` always names a complete checkpoint: the old
    one or the new one.
    """
    directory = osp.dirname(link_path)
    temporary = osp.join(directory, f'{STAGING_PREFIX}{osp.basename(link_path)}')
    if osp.lexists(temporary):
        os.remove(temporary)
    try:
        os.symlink(target_name, temporary)
    except (OSError, NotImplementedError):
        shutil.copyfile(osp.join(directory, target_name), temporary)
        fsync_path(temporary)
    os.replace(temporary, link_path)
    fsync_path(directory)


def _numbered_files(directory: str, pattern: Pattern) -> List[Tuple[int, str]]:
    """``(number, name)`` of the entries of ``directory`` matching ``pattern`` (group 1: the number), ascending."""
    matches = ((pattern.match(name), name) for name in os.listdir(directory))
    return sorted((int(match.group(1)), name) for match, name in matches if match)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` whose checkpoints and ``latest.pth`` are written atomically.

    Same arguments and files as mmcv's ``CheckpointHook`` (``interval``,
    ``by_epoch``, ``max_keep_ckpts``, ``filename_tmpl``, ``create_symlink``,
    ...); only local directories are supported (``os.replace`` is what makes
    the write atomic). ``configs/_base_/default_runtime.py`` selects it with
    ``checkpoint_config = dict(type='AtomicCheckpointHook', ...)``.
    """

    def before_run(self, runner) -> None:
        out_dir = self.out_dir or runner.work_dir
        backend = FileClient.infer_client(self.file_client_args, out_dir)
        if not isinstance(backend.client, HardDiskBackend):
            raise ValueError(f'AtomicCheckpointHook writes to a local directory, but out_dir {out_dir!r} uses the '
                             f'{backend.name} backend; use CheckpointHook for remote storage')
        super().before_run(runner)
        if runner.rank == 0 and osp.isdir(self.out_dir):
            # what a run killed while saving left behind
            names = [name for name in os.listdir(self.out_dir) if name.startswith(STAGING_PREFIX)]
            for path in (osp.join(self.out_dir, name) for name in names):
                if osp.isdir(path) and not osp.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)

    @master_only
    def _save_checkpoint(self, runner) -> None:
        """Save the current checkpoint atomically, point ``latest.pth`` at it, delete the unwanted old ones."""
        os.makedirs(self.out_dir, exist_ok=True)
        args = dict(self.args, create_symlink=False)
        with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX, dir=self.out_dir) as staging:
            runner.save_checkpoint(staging, save_optimizer=self.save_optimizer, **args)
            written = os.listdir(staging)
            if len(written) != 1:
                raise RuntimeError(f'{type(runner).__name__}.save_checkpoint wrote {written} instead of one file')
            name = written[0]
            fsync_path(osp.join(staging, name))
            os.replace(osp.join(staging, name), osp.join(self.out_dir, name))
        fsync_path(self.out_dir)
        if self.args.get('create_symlink', True):
            replace_link(name, osp.join(self.out_dir, LATEST_NAME))
        if runner.meta is not None:
            runner.meta.setdefault('hook_msgs', dict())['last_ckpt'] = osp.join(self.out_dir, name)
        self._remove_old_checkpoints(name)

    def _remove_old_checkpoints(self, current_name: str) -> None:
        """Keep ``max_keep_ckpts`` checkpoints: ``current_name`` and the newest ones numbered below it."""
        if self.max_keep_ckpts <= 0:
            return
        template = self.args.get('filename_tmpl', 'epoch_{}.pth' if self.by_epoch else 'iter_{}.pth')
        pattern = re.compile('^' + re.escape(template).replace(re.escape('{}'), r'(\d+)') + '$')
        current = pattern.match(current_name)
        if current is None:
            return
        older = [(number, name) for number, name in _numbered_files(self.out_dir, pattern)
                 if number < int(current.group(1))]
        for _, name in older[:max(0, len(older) - (self.max_keep_ckpts - 1))]:
            os.remove(osp.join(self.out_dir, name))


def checkpoint_problem(path: str) -> Optional[str]:
    """Why a run cannot resume from ``path``, or None when it can.

    The checkpoint is loaded on the CPU exactly as ``runner.resume`` loads it,
    and must hold a ``state_dict`` and a ``meta`` with ``epoch`` and ``iter``.
    """
    try:
        checkpoint = torch.load(path, map_location='cpu')
    except Exception as error:  # truncated or corrupt files fail in many ways (zip, pickle, storage errors)
        return f'it cannot be loaded ({type(error).__name__}: {error})'
    if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint:
        return 'it has no state_dict'
    meta = checkpoint.get('meta')
    if not isinstance(meta, dict) or 'epoch' not in meta or 'iter' not in meta:
        return "its meta has no 'epoch' and 'iter' (not a training checkpoint)"
    return None


def check_resumable(path: str) -> None:
    """Raise ``ValueError`` naming ``path`` and the reason when a run cannot resume from it."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'cannot resume from {path}: no such file')
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f'cannot resume from {path}: {problem}')


def find_latest_valid_checkpoint(work_dir: str, logger: Optional[logging.Logger] = None) -> Optional[str]:
    """The newest checkpoint of ``work_dir`` a run can resume from, or None.

    Candidates are the numbered checkpoints (``epoch_N.pth``, ``iter_N.pth``,
    any ``*_N.pth``), highest ``N`` first, then ``latest.pth`` when it is not
    one of them. Candidates that fail :func:`checkpoint_problem` are skipped
    with a warning.

    Args:
        work_dir (str): the run's work dir.
        logger (logging.Logger, optional): where the warnings go (default: print).

    Returns:
        str | None: the checkpoint's path.
    """
    if not osp.isdir(work_dir):
        return None
    numbered = _numbered_files(work_dir, _NUMBERED_CHECKPOINT)
    candidates: List[str] = [osp.join(work_dir, name) for _, name in reversed(numbered)]
    latest = osp.join(work_dir, LATEST_NAME)
    if osp.isfile(latest) and osp.realpath(latest) not in {osp.realpath(path) for path in candidates}:
        candidates.append(latest)
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        print_log(f'auto-resume: skipping {path}: {problem}', logger=logger, level=logging.WARNING)
    return None


def find_resume_checkpoint_once(work_dir: str, logger: Optional[logging.Logger] = None) -> Optional[str]:
    """:func:`find_latest_valid_checkpoint`, searched by rank 0 alone and broadcast to every process of the group.

    The processes of a distributed run resume from one checkpoint even when
    they would see the work dir differently (a checkpoint half written, a node
    with a stale copy). A process that cannot see the chosen file raises: the
    work dir must be on a file system every node shares. Without a process
    group, the search itself.

    Returns:
        str | None: rank 0's checkpoint path, None for every process when rank 0 found none.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return find_latest_valid_checkpoint(work_dir, logger)
    rank = dist.get_rank()
    choice = [find_latest_valid_checkpoint(work_dir, logger) if rank == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    path = choice[0]
    if path is not None and not osp.isfile(path):
        raise FileNotFoundError(f'auto-resume: rank 0 chose {path}, which rank {rank} cannot see: the work dir '
                                f'must be on a file system every node shares')
    return path
