"""Host memory on CPU training: stop glibc's heap from keeping freed activation buffers.

Training on a CPU allocates and frees the same large activation buffers (megabytes each) at every micro-batch.
glibc's malloc raises its mmap threshold each time such a buffer is freed (up to 32 MiB), so later buffers come
from the heap, where they fragment it and the process's resident memory only grows. With the threshold fixed
(`mallopt(M_MMAP_THRESHOLD)`, what the MALLOC_MMAP_THRESHOLD_ variable does) buffers above it are mapped and
returned to the OS when freed, at the price of page faults each time they are mapped again. Measured on
SmolLM2-135M QLoRA, 2 AMD EPYC cores, quiet (bench/results/host_memory-vm.json): peak RSS 5.9-6.3 GB and 89-96
supervised tokens/s with glibc's default, 3.4 GB and 69 tokens/s with a 1 MiB threshold; a 4 MiB one saves 6%.
So it is a setting (`host_memory: lean`), not the default. Nothing else changes: the same tensors, the same results.
It applies to glibc's malloc: training runs on mimalloc where it is installed (mens/train/allocator.py), which
peaks about as low as lean without its page faults, and then the threshold is left alone.

Written by hand (ctypes) because no library wraps mallopt; a user's own MALLOC_MMAP_THRESHOLD_ wins, and where
the C library is not glibc nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD = 1 << 20
"""Buffers from this size up are mapped (and unmapped when freed); smaller ones stay on the heap."""


def fix_mmap_threshold(threshold: int = THRESHOLD) -> str | None:
    """Fix glibc's mmap threshold for this process; what was done, in one line, or None when nothing was."""
    if not sys.platform.startswith("linux"):
        return None
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return f"glibc mmap threshold {os.environ['MALLOC_MMAP_THRESHOLD_']} bytes (MALLOC_MMAP_THRESHOLD_)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries: no mallopt
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(threshold)) != 1:
        return None
    return (f"glibc mmap threshold fixed at {threshold // 1024} KiB: freed activation buffers go back to the OS "
            "(MALLOC_MMAP_THRESHOLD_ overrides)")


def host_memory_note(setting: str, allocator: str, heap: str | None) -> str:
    """The preflight's line on host memory: which allocator the run is on and what `host_memory` did."""
    if allocator == "mimalloc":
        note = "mimalloc, preloaded by mens (MENS_ALLOCATOR=system for the C library's malloc)"
        if setting == "lean":
            note += "; lean's fixed mmap threshold is for glibc's malloc, and mimalloc already peaks about as low"
        return note
    if setting == "lean":
        return heap or "lean asked for, but this C library has no mallopt: its default kept"
    return "the C library's malloc, its default settings (host_memory: lean caps the peak at some speed)"
