"""Hand freed heap memory back to the operating system, so a long CPU run's resident size stays at its
working set instead of its allocator's high-water mark.

torch frees each batch's tensors, but glibc's malloc keeps the freed pages of its heaps (an arena's top
is trimmed only past ``M_TRIM_THRESHOLD``, and memory below a live chunk never), and its mmap threshold
adapts upward after large frees, so later per-batch tensors of up to 32 MiB land in those heaps too. RSS
then ratchets up with run length, not with data the program keeps (bench_scaling.py measured it).
``release_free_memory`` calls ``malloc_trim(0)``, which returns every free page of every arena, top or
not (``madvise(MADV_DONTNEED)``); it costs about a millisecond per call, so call it between batches.
Off glibc (macOS, musl) it does nothing. Why not pin the mmap threshold instead, and the figures:
docs/benchmarks.md (annotation scaling).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_free_memory() -> bool:
    """``malloc_trim(0)``: True when glibc returned memory to the system, False when none or off glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
