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


def test_release_free_memory_is_a_no_op_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    memory._libc.cache_clear()
    try:
        assert memory.release_free_memory() is False
    finally:
        monkeypatch.undo()
        memory._libc.cache_clear()
