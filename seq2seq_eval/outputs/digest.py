"""The content digest the record keeps of every file the tool publishes (outputs/record.py).

The digest of a file is the sha256 of the concatenated sha256 digests (32 bytes each) of its
4 MiB blocks, in order, the last block possibly shorter; an empty file has no block, and its
digest is the sha256 of nothing. Equal bytes give equal digests, whoever wrote them and however:

- a file written in one stream is hashed as it is written (ContentHash), with no second pass;
- with --shared_tail the ranks write their slices of one file at offsets: each hashes the blocks
  that lie wholly inside its slice as it writes them (SliceHash), and rank 0, which completes the
  file, reads back only the blocks no rank hashed whole (those a slice boundary or the legacy
  list's brackets cut: at most one per rank and one more, 4 MiB each) and combines the lot
  (assemble);
- a file checked later is read once (file_digest).

`sha256sum` gives another value: a reader who wants to check a file by hand uses file_digest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

BLOCK = 4 << 20
"""Bytes per block of the digest (fixed: it is part of the digest's definition)."""


def combine(block_digests: Iterable[bytes]) -> str:
    """The file's digest from its blocks' sha256 digests, in order."""
    return hashlib.sha256(b"".join(block_digests)).hexdigest()


class ContentHash:
    """The digest of bytes fed in order, as they are written."""

    def __init__(self) -> None:
        self._blocks: list[bytes] = []
        self._block = hashlib.sha256()
        self._fill = 0
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.size += len(view)
        while view:
            take = min(BLOCK - self._fill, len(view))
            self._block.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == BLOCK:
                self._blocks.append(self._block.digest())
                self._block, self._fill = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        tail = [self._block.digest()] if self._fill else []
        return combine([*self._blocks, *tail])


class SliceHash:
    """The sha256 of each block that lies wholly inside a slice of a file, fed the slice's bytes
    in order from offset `start`: what one rank of the shared tail can hash of the file alone."""

    def __init__(self, start: int) -> None:
        self.first = -(-start // BLOCK)  # the first block that starts inside the slice
        self._skip = self.first * BLOCK - start  # bytes before it (a block shared with the slice before)
        self._hash = ContentHash()

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if self._skip:
            cut = min(self._skip, len(view))
            view, self._skip = view[cut:], self._skip - cut
        self._hash.update(view)

    def result(self) -> dict[str, Any]:
        """{"first": index of the first block, "blocks": hex sha256 of each whole block}: the
        partial block at the slice's end is left to rank 0 (it may hold the next slice's bytes)."""
        return {"first": self.first, "blocks": [d.hex() for d in self._hash._blocks]}


def _read_block(fd: int, index: int, length: int) -> bytes:
    start = index * BLOCK
    want = min(BLOCK, length - start)
    chunks = []
    while want:
        chunk = os.pread(fd, want, start)
        if not chunk:
            raise OSError(f"ends before byte {start + want} of {length}")
        chunks.append(chunk)
        start, want = start + len(chunk), want - len(chunk)
    return hashlib.sha256(b"".join(chunks)).digest()


def assemble(path: Path, length: int, slices: Iterable[Mapping[str, Any]]) -> str:
    """The digest of a file of `length` bytes the ranks wrote in slices (SliceHash.result of
    each): the blocks they hashed whole, the others read back from the file."""
    n_blocks = -(-length // BLOCK)
    known: dict[int, bytes] = {}
    for s in slices:
        for k, hexd in enumerate(s["blocks"]):
            known[s["first"] + k] = bytes.fromhex(hexd)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        digests = [known[i] if i in known else _read_block(fd, i, length) for i in range(n_blocks)]
    finally:
        os.close(fd)
    return combine(digests)


def file_digest(path: Path, chunk: int = BLOCK) -> str:
    """A file's digest, read once (a symbolic link is not followed: OSError)."""
    h = ContentHash()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while data := os.read(fd, chunk):
            h.update(data)
    finally:
        os.close(fd)
    return h.hexdigest()
