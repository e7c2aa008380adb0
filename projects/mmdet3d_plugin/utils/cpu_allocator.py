"""Host memory that stays with the process once freed: glibc's allocator told not to give it back after each step.

With glibc's defaults a block above the mmap threshold (128 KiB, raised
dynamically up to 32 MiB) is mapped for each allocation and unmapped when
freed, and the top of the heap is trimmed once 128 KiB of it are free. A
training step on the CPU frees and allocates again hundreds of activations of
megabytes, so every step faults their pages in anew, and how many depends on
how the previous step left the heap: step times then vary from run to run,
even for parts whose code is identical in two models (the image backbone).
:func:`keep_freed_memory` serves blocks up to 1 GiB from the heap and never
trims it, so a step reuses the memory of the step before: what the jemalloc or
tcmalloc that PyTorch's CPU tuning guide recommends also do. The process keeps its peak resident memory instead
of returning memory between steps. The same settings from the environment,
for any command: ``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456
MALLOC_TRIM_THRESHOLD_=68719476736``.
"""
import ctypes
import ctypes.util
import sys

#: ``mallopt`` parameters (glibc ``malloc.h``)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: blocks up to this size come from the heap: 1 GiB, every activation of the R50 / VoV steps (glibc 2.36 accepts
#: it; a glibc that refuses it gets :data:`FALLBACK_MMAP_THRESHOLD`)
MMAP_THRESHOLD = 1024**3
#: the largest mmap threshold older glibc accept on 64-bit systems (``4 * 1024 * 1024 * sizeof(long)``)
FALLBACK_MMAP_THRESHOLD = 32 * 1024**2
#: the settings :func:`keep_freed_memory` makes besides the mmap threshold: the heap grown 256 MiB at a time and
#: never trimmed (a trim threshold of -1 "disables trimming completely", mallopt(3))
SETTINGS = ((M_TOP_PAD, 256 * 1024**2), (M_TRIM_THRESHOLD, -1))


def _glibc():
    """The process's C library if it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``), else None."""
    if not sys.platform.startswith('linux'):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    except OSError:
        return None
    return libc if hasattr(libc, 'mallopt') and hasattr(libc, 'gnu_get_libc_version') else None


def keep_freed_memory() -> bool:
    """Have glibc serve blocks up to :data:`MMAP_THRESHOLD` from its heap and keep freed host memory for reuse
    (:data:`SETTINGS`); from then on, for the whole process.

    Returns:
        bool: True where the settings were made (the threshold at least :data:`FALLBACK_MMAP_THRESHOLD`); False
        where the C library is not glibc (macOS, musl) or refused a setting, which changes nothing else.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    threshold = any(libc.mallopt(M_MMAP_THRESHOLD, value) == 1 for value in (MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD))
    return threshold and all(libc.mallopt(param, value) == 1 for param, value in SETTINGS)
