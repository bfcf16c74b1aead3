"""pipelines.memory: freed heap pages go back to the system, and off glibc the call does nothing."""

import ctypes
import sys

import psutil
import pytest

from pipelines import memory


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.skipif(memory._libc() is None, reason="needs glibc")
def test_release_free_memory_returns_freed_heap_pages_that_malloc_keeps():
    libc = memory._libc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunk = 64 * 1024  # under the mmap threshold: these come from the heap
    blocks = [libc.malloc(chunk) for _ in range(3200)]  # 200 MiB
    for block in blocks:
        ctypes.memset(block, 1, chunk)
    keeper = blocks.pop()  # a live chunk at the heap's top stops free() from trimming below it
    for block in blocks:
        libc.free(block)
    kept = rss_mib()
    assert memory.release_free_memory() is True
    assert rss_mib() < kept - 150
    libc.free(keeper)


@pytest.mark.skipif(memory._libc() is None, reason="needs glibc")
def test_a_fixed_mmap_threshold_gives_freed_blocks_above_it_back_at_once():
    libc = memory._libc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    assert memory.fix_mmap_threshold() is True
    # freeing a mapped 4 MiB block raises glibc's adaptive threshold to 4 MiB: later 2 MiB blocks would come
    # from the heap, where the live chunk allocated after them keeps them resident; a fixed threshold does not move
    libc.free(libc.malloc(4 << 20))
    block = 2 << 20  # above the 1 MiB threshold: each block is its own mapping
    before = rss_mib()
    blocks = [libc.malloc(block) for _ in range(100)]  # 200 MiB
    for b in blocks:
        ctypes.memset(b, 1, block)
    assert rss_mib() > before + 150
    keeper = libc.malloc(512 << 10)  # a live chunk after them would pin heap memory below it; mappings it cannot
    ctypes.memset(keeper, 1, 512 << 10)
    for b in blocks:
        libc.free(b)
    assert rss_mib() < before + 50  # no malloc_trim needed
    libc.free(keeper)


def test_release_free_memory_is_a_no_op_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    memory._libc.cache_clear()
    try:
        assert memory.release_free_memory() is False
        assert memory.fix_mmap_threshold() is False
    finally:
        monkeypatch.undo()
        memory._libc.cache_clear()
