"""keep_freed_memory: glibc serves re-allocated host memory from the heap instead of faulting fresh pages in."""
import os
import resource
import subprocess
import sys

import pytest

from projects.mmdet3d_plugin.utils import cpu_allocator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _FakeMallopt:
    """A C library's ``mallopt`` that records its calls and answers ``answer`` (1: done, 0: refused)."""

    def __init__(self, answer: int):
        self.calls, self.answer = [], answer

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.answer


class _OlderMallopt(_FakeMallopt):
    """An older glibc's ``mallopt``: an mmap threshold above 32 MiB is refused."""

    def __init__(self):
        super().__init__(1)

    def __call__(self, param, value):
        self.calls.append((param, value))
        return int(param != -3 or value <= 32 * 1024**2)


class _FakeLibc:
    def __init__(self, answer: int):
        self.mallopt = _FakeMallopt(answer)


def test_the_settings_are_made_and_a_refusal_is_reported(monkeypatch):
    libc = _FakeLibc(1)
    monkeypatch.setattr(cpu_allocator, '_glibc', lambda: libc)
    assert cpu_allocator.keep_freed_memory()
    assert libc.mallopt.calls == [(-3, 1024**3), (-2, 256 * 1024**2), (-1, -1)]
    monkeypatch.setattr(cpu_allocator, '_glibc', lambda: _FakeLibc(0))
    assert not cpu_allocator.keep_freed_memory()


def test_an_older_glibc_gets_the_largest_threshold_it_accepts(monkeypatch):
    """A glibc that refuses an mmap threshold above 32 MiB (its largest in older releases) gets 32 MiB."""
    libc = _FakeLibc(1)
    libc.mallopt = _OlderMallopt()
    monkeypatch.setattr(cpu_allocator, '_glibc', lambda: libc)
    assert cpu_allocator.keep_freed_memory()
    assert libc.mallopt.calls == [(-3, 1024**3), (-3, 32 * 1024**2), (-2, 256 * 1024**2), (-1, -1)]


def test_another_platform_is_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_allocator.sys, 'platform', 'darwin')
    assert cpu_allocator._glibc() is None and not cpu_allocator.keep_freed_memory()


#: run in a process of its own: the settings stay with the process that makes them
FAULT_CHECK = """
import ctypes, resource, sys
from projects.mmdet3d_plugin.utils import cpu_allocator
BLOCK = 64 * 1024 * 1024  # above glibc's default mmap threshold (128 KiB) and its dynamic maximum (32 MiB)
libc = cpu_allocator._glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def faults_of_a_fresh_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pointer = libc.malloc(BLOCK)
    ctypes.memset(pointer, 1, BLOCK)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(pointer)
    return faults

if sys.argv[1] == 'kept':
    assert cpu_allocator.keep_freed_memory()
faults_of_a_fresh_block()
print(max(faults_of_a_fresh_block() for _ in range(3)))
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, '-c', FAULT_CHECK, mode], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_memory_freed_and_allocated_again_is_not_faulted_in_again():
    """After keep_freed_memory a 64 MiB block freed and allocated again reuses its pages; with glibc's defaults every
    page of a block freed and allocated anew faults in again (16 384 of them)."""
    if cpu_allocator._glibc() is None:
        pytest.skip('the C library is not glibc')
    pages = 64 * 1024 * 1024 // resource.getpagesize()
    assert _faults('kept') < pages // 10
