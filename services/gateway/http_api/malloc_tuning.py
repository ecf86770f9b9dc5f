"""Make glibc give freed request bodies back to the kernel.

glibc serves an allocation over M_MMAP_THRESHOLD (128 KiB at start) with a
mapping of its own, unmapped when freed. But the threshold moves: each free
of such a block raises it to that block's size (up to 32 MiB), so once the
first 4 MiB body has been freed, the next ones come from the heap, whose
freed pages stay resident until the top of the heap is free. Measured with
benchmarks/body_flood_bench.py (150 x 4 MiB bodies from one key, 2-core AMD
EPYC): the gateway's RSS three seconds after the flood was 38-40 MB over its
RSS before it with glibc's default, 16 MB over with the threshold fixed at
128 KiB; MALLOC_ARENA_MAX=2 changed nothing (bodies are read and parsed on
one thread, in one arena). Setting the threshold once, as here, also turns
the moving rule off (mallopt(3)); what it costs is an mmap and munmap per
allocation over 128 KiB, which for a body is a few microseconds next to the
milliseconds of parsing it.
"""

import ctypes

from maas_services.common.logging import get_logger

log = get_logger(__name__)

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold; False (and nothing changed) off glibc."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.info("mmap_threshold_unchanged", reason="no glibc mallopt")
        return False
    return True
