"""Arrow IPC files read through a memory map: the OS pages rows in as they are read, and the
processes of one node share those pages."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pyarrow as pa


def read_mapped(path: Path) -> tuple[mmap.mmap | None, pa.Table]:
    """The file's map (None for an empty file) and its table over that map, having read only the
    pages of the record batches' headers.

    Opening reads one header per record batch, and a page fault in a map reads the kernel's whole
    read-around window about it (the disk's read_ahead_kb: 8 MB on some virtual disks). Without
    the advice, a 12 GB rank file of 10 MB batches was read 10 GB deep just to be opened, by every
    rank that opened it; with it, 10 MB."""
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return None, pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    advise = hasattr(mmap, "MADV_RANDOM")
    if advise:
        mapping.madvise(mmap.MADV_RANDOM)
    try:
        return mapping, pa.ipc.open_file(pa.py_buffer(mapping)).read_all()
    finally:
        if advise:
            mapping.madvise(mmap.MADV_NORMAL)
