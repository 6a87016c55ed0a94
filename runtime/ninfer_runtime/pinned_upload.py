"""One object at a time to a CUDA device through a ring of pinned host staging buffers: the upload
of what the weight stream (weight_stream.py, whole objects read from the artifact file) does not
carry: a --tp rank's shard copies, objects of an artifact that is not a file.

A copy from pageable memory (the artifact's mmap) is staged by the driver through its own small
pinned buffers, synchronously, one object at a time (~8 GB/s measured on an H200). Here the upload
is a pipeline: the CPU copies a piece of an object from the mmap into a pinned staging buffer
(torch `copy_`: multi-threaded, the GIL released), queues the piece's host-to-device copy on a
dedicated stream and goes on with the next piece, so the CPU copy of piece i+1 overlaps the DMA of
piece i. Objects larger than a buffer are split into pieces; small ones share a buffer. A CUDA event
per buffer (recorded after each copy out of it) guards the buffer's reuse.

- The staging schedule is weight_stream.py's `StagingRing`.
- `PinnedUploader(device)`: pins the ring (`PinningFailed`, one line, when the host refuses);
  `upload(host, nbytes)` -> the object's 1-D uint8 device tensor, its copies queued, not done;
  `finish()` waits for every queued copy (call it before anything reads the weights, also when a
  load fails) and releases the ring.
"""

from __future__ import annotations

import torch

from .weight_stream import StagingRing

# Large enough that each piece's DMA runs at full bandwidth and its CPU copy spreads over all torch
# threads; small enough that pinning the ring takes milliseconds.
STAGING_BUFFER_BYTES = 64 << 20
# One buffer being filled by the CPU, one in DMA, one queued: the CPU waits only when the DMA falls behind.
STAGING_BUFFERS = 3


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
