"""One object at a time to a CUDA device through a ring of pinned host staging buffers: the upload
of what the weight stream (weight_stream.py: whole objects read from the artifact file) does not
carry: a --tp rank's shard copies, the objects of an artifact that is not a file.

A copy from pageable memory (the artifact's mmap) is staged by the driver through its own small
pinned buffers, synchronously, one object at a time (~8 GB/s measured on an H200). Here the upload
is a pipeline: the CPU copies a piece of an object from the mmap into a pinned staging buffer
(torch `copy_`: multi-threaded, the GIL released), queues the piece's host-to-device copy on a
dedicated stream and goes on with the next piece, so the CPU copy of piece i+1 overlaps the DMA of
piece i. Objects larger than a buffer are split into pieces; small ones share a buffer. A CUDA event
per buffer (recorded after each copy out of it) guards the buffer's reuse.

- `StagingRing(buffer_bytes, buffers).place(nbytes)`: where the next object's bytes are staged, as
  `Piece`s (pure; `staging_schedule(sizes, ...)` is the whole schedule of a list of objects).
- `PinnedUploader(device)`: pins the ring (`PinningFailed`, one line, when the host refuses);
  `upload(host, nbytes)` -> the object's 1-D uint8 device tensor, its copies queued, not done;
  `finish()` waits for every queued copy (call it before anything reads the weights, also when a
  load fails) and releases the ring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Large enough that each piece's DMA runs at full bandwidth and its CPU copy spreads over all torch
# threads; small enough that pinning the ring takes milliseconds.
STAGING_BUFFER_BYTES = 64 << 20
# One buffer being filled by the CPU, one in DMA, one queued: the CPU waits only when the DMA falls behind.
STAGING_BUFFERS = 3
# Pieces start on the device allocator's alignment in the staging buffer (aligned CPU copy and DMA source).
STAGING_ALIGN = 512


@dataclass(frozen=True)
class Piece:
    """`nbytes` of an object from `src_offset` on, staged in buffer `buffer` at `buffer_offset`
    (a piece at buffer_offset 0 is the first one in that buffer since the ring came back to it)."""

    src_offset: int
    nbytes: int
    buffer: int
    buffer_offset: int


class StagingRing:
    """Places objects' bytes in a ring of `buffers` staging buffers of `buffer_bytes` each, in order:
    each object fills the current buffer's free space (from the next aligned offset), then the next
    buffers; a 0-byte object has no pieces."""

    def __init__(self, buffer_bytes: int = STAGING_BUFFER_BYTES, buffers: int = STAGING_BUFFERS,
                 align: int = STAGING_ALIGN):
        if align <= 0 or buffer_bytes <= 0 or buffer_bytes % align:
            raise ValueError(f"staging buffer of {buffer_bytes} bytes: must be a positive multiple of {align}")
        if buffers < 1:
            raise ValueError(f"staging ring of {buffers} buffers: needs at least one")
        self.buffer_bytes, self.buffers, self.align = buffer_bytes, buffers, align
        self._buffer, self._offset = 0, 0

    def place(self, nbytes: int) -> list[Piece]:
        if nbytes < 0:
            raise ValueError(f"an object of {nbytes} bytes")
        pieces, src = [], 0
        while src < nbytes:
            if self._offset >= self.buffer_bytes:
                self._buffer, self._offset = (self._buffer + 1) % self.buffers, 0
            n = min(nbytes - src, self.buffer_bytes - self._offset)
            pieces.append(Piece(src, n, self._buffer, self._offset))
            src += n
            self._offset = -(-(self._offset + n) // self.align) * self.align
        return pieces


def staging_schedule(sizes, buffer_bytes: int = STAGING_BUFFER_BYTES, buffers: int = STAGING_BUFFERS,
                     align: int = STAGING_ALIGN) -> list[tuple[int, Piece]]:
    """(object index, piece) for objects of `sizes` bytes uploaded in order."""
    ring = StagingRing(buffer_bytes, buffers, align)
    return [(i, p) for i, n in enumerate(sizes) for p in ring.place(int(n))]


class PinningFailed(RuntimeError):
    """The host refused to pin the staging ring (cudaHostAlloc error, locked-memory limit)."""


class PinnedUploader:
    """The pipelined upload to CUDA `device` (see the module docstring)."""

    def __init__(self, device: torch.device, buffer_bytes: int = STAGING_BUFFER_BYTES,
                 buffers: int = STAGING_BUFFERS):
        self.device = device
        self._ring = StagingRing(buffer_bytes, buffers)
        try:
            self._staging = torch.empty(buffers * buffer_bytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:
            lines = str(exc).strip().splitlines()
            raise PinningFailed(lines[0][:200] if lines else type(exc).__name__) from None
        self._stream = torch.cuda.Stream(device=device)
        # the destinations are allocated on the current stream: its earlier work comes first
        self._stream.wait_stream(torch.cuda.current_stream(device))
        self._events = [torch.cuda.Event() for _ in range(buffers)]

    def upload(self, host: torch.Tensor, nbytes: int) -> torch.Tensor:
        """The 1-D uint8 device tensor of `nbytes` that will hold `host`'s bytes after `finish()`."""
        if self._staging is None:
            raise RuntimeError("pinned upload: upload after finish()")
        src = host.reshape(-1)
        if src.dtype != torch.uint8 or src.numel() != nbytes:
            raise ValueError(f"upload: a host tensor of {src.numel()} {src.dtype} elements, expected {nbytes} uint8")
        dst = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        dst.record_stream(self._stream)  # freed early (a failed load): reused only after its copies
        for p in self._ring.place(nbytes):
            event = self._events[p.buffer]
            if p.buffer_offset == 0:
                event.synchronize()  # the buffer's copies from its previous round are done
            start = p.buffer * self._ring.buffer_bytes + p.buffer_offset
            stage = self._staging[start:start + p.nbytes]
            stage.copy_(src[p.src_offset:p.src_offset + p.nbytes])
            with torch.cuda.stream(self._stream):
                dst[p.src_offset:p.src_offset + p.nbytes].copy_(stage, non_blocking=True)
                event.record(self._stream)
        return dst

    def finish(self) -> None:
        """Wait until every queued copy is on the device; release the staging ring."""
        if self._staging is not None:
            self._stream.synchronize()
            self._staging = None
