"""The weight stream: a plan's weights read from the artifact file by several threads into pinned
staging buffers and copied to one device allocation, with the CUDA driver API (cuda_driver.py) and
no torch, so that it can start with the process and run while `import torch` (~3 s) is going on.

Why: the upload from the artifact's mmap (pinned_upload.py, one thread faulting the mapping in page
by page) ran at ~10 GB/s, 1.7 s of the 27B's 5.8 s to a first token on an H100 (2026-12-07). Here
`READERS` threads `preadv` pieces of the file (no page faults) into a ring of `BUFFERS` pinned
buffers, each thread queueing its buffer's copies on its own stream; an event per buffer guards its
reuse. `prestart(plan, artifact, device)` begins all of it in a background thread before torch is
imported (ninfer-run and ninfer-serve call it first thing); the loader then `take`s the stream and
adopts the allocation as torch tensors (`WeightStream.adopt`), or starts one itself.

- `device_layout(sizes)`: each object's offset in the device allocation (`DEVICE_ALIGN`, the torch
  caching allocator's alignment, so kernels see the pointers they were specialised for) and the total.
- `StagingRing` / `staging_schedule`: where each object's bytes are staged (pure); `batches(...)`
  groups the pieces by buffer round: one batch fills one buffer once.
- `WeightStream(driver, path, objects)` (`objects`: (name, file offset, bytes), upload order):
  `start()`, `done_bytes`, `wait()` (raises `WeightStreamError`, one line naming the object),
  `adopt(torch)` -> {name: 1-D uint8 CUDA tensor} viewing the allocation (freed with the last
  view), `close()` (frees what `adopt` did not take). `seconds`: the stream's own wall time.
- `prestart(...)` -> whether a stream was started; `take(path, names, ordinal)` -> the prestarted
  stream for exactly these objects on that device (another one is closed), else None.
- `pinned_upload_enabled()`: NINFER_PINNED_UPLOAD (unset or "1": pinned staging; "0": the pageable copy).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

from .errors import NinferRuntimeError, PlanError

READERS = 4  # threads reading the file (page-cache copies run at ~5-10 GB/s a thread)
BUFFERS = 8  # staging buffers: two a reader, so a reader never waits on its own last copy
BUFFER_BYTES = 32 << 20  # a piece's DMA runs at full bandwidth; pinning the ring takes milliseconds
STAGING_ALIGN = 512  # pieces start aligned in a staging buffer (aligned DMA source)
DEVICE_ALIGN = 512  # the torch caching allocator's alignment
PINNED_UPLOAD_ENV = "NINFER_PINNED_UPLOAD"


def pinned_upload_enabled() -> bool:
    """NINFER_PINNED_UPLOAD: unset or "1" -> True, "0" -> False; anything else is refused (one line)."""
    value = os.environ.get(PINNED_UPLOAD_ENV, "1").strip()
    if value not in ("0", "1"):
        raise PlanError(f"{PINNED_UPLOAD_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


class WeightStreamError(NinferRuntimeError):
    """The stream failed (a read, a driver call): one line naming the object."""


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

    def __init__(self, buffer_bytes: int = BUFFER_BYTES, buffers: int = BUFFERS, align: int = STAGING_ALIGN):
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


def staging_schedule(sizes, buffer_bytes: int = BUFFER_BYTES, buffers: int = BUFFERS,
                     align: int = STAGING_ALIGN) -> list[tuple[int, Piece]]:
    """(object index, piece) for objects of `sizes` bytes uploaded in order."""
    ring = StagingRing(buffer_bytes, buffers, align)
    return [(i, p) for i, n in enumerate(sizes) for p in ring.place(int(n))]


def batches(schedule: list[tuple[int, Piece]]) -> list[list[tuple[int, Piece]]]:
    """The schedule cut where the ring enters a buffer afresh: batch j fills buffer j % buffers."""
    out: list[list[tuple[int, Piece]]] = []
    for item in schedule:
        if not out or item[1].buffer_offset == 0:
            out.append([])
        out[-1].append(item)
    return out


def device_layout(sizes, align: int = DEVICE_ALIGN) -> tuple[list[int], int]:
    """(each object's offset in one device allocation, the allocation's bytes: at least `align`)."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end = -(-(end + int(n)) // align) * align
    return offsets, max(end, align)


class _DeviceMemory:
    """One device allocation, freed when the last torch tensor viewing it goes (`adopt`)."""

    def __init__(self, driver, ptr: int, nbytes: int):
        self._driver, self.ptr, self.nbytes = driver, ptr, nbytes

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 2}

    def free(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr:
            try:
                self._driver.bind_thread()
                self._driver.free(ptr)
            except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
                pass

    def __del__(self):
        self.free()


class WeightStream:
    def __init__(self, driver, path, objects, *, readers: int = READERS, buffers: int = BUFFERS,
                 buffer_bytes: int = BUFFER_BYTES):
        if buffers < readers + 1:
            raise ValueError(f"weight stream: {buffers} staging buffers for {readers} readers (needs more)")
        self.driver, self.path = driver, str(path)
        self.objects = [(str(n), int(off), int(nb)) for n, off, nb in objects]
        self.names = tuple(n for n, _, _ in self.objects)
        sizes = [nb for _, _, nb in self.objects]
        self.offsets, self.total = device_layout(sizes)
        self._batches = batches(staging_schedule(sizes, buffer_bytes, buffers))
        self._readers, self._buffers, self._buffer_bytes = max(1, min(readers, len(self._batches))), buffers, buffer_bytes
        self._recorded = [threading.Event() for _ in self._batches]
        self._lock, self._next, self._error = threading.Lock(), 0, None
        self.done_bytes, self.seconds = 0, 0.0
        self._threads: list[threading.Thread] = []
        self._memory = self._host = None
        self._streams: list[int] = []
        self._events: list[int] = []
        self._fd = -1

    def start(self) -> "WeightStream":
        t0 = time.perf_counter()
        d = self.driver
        d.bind_thread()
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
            self._memory = _DeviceMemory(d, d.alloc(self.total), self.total)
            self._host = d.host_alloc(self._buffers * self._buffer_bytes)
            self._events = [d.event() for _ in range(self._buffers)]
            self._streams = [d.stream() for _ in range(self._readers)]
        except BaseException:
            self.close()
            raise
        self._t0 = t0
        self._threads = [threading.Thread(target=self._read, args=(r,), name=f"ninfer-weights-{r}", daemon=True)
                         for r in range(self._readers)]
        for t in self._threads:
            t.start()
        return self

    def _read(self, reader: int) -> None:
        d, stream = self.driver, self._streams[reader]
        try:
            d.bind_thread()
            while self._error is None:
                with self._lock:
                    j, self._next = self._next, self._next + 1
                if j >= len(self._batches):
                    break
                slot = j % self._buffers
                if j >= self._buffers:  # the buffer's previous round: recorded, then its copies done
                    while not self._recorded[j - self._buffers].wait(0.1):
                        if self._error is not None:
                            return
                    d.wait_event(self._events[slot])
                base = self._host + slot * self._buffer_bytes
                for i, p in self._batches[j]:
                    self._fill(i, p, base + p.buffer_offset)
                for i, p in self._batches[j]:
                    d.copy_to_device(self._memory.ptr + self.offsets[i] + p.src_offset, base + p.buffer_offset,
                                     p.nbytes, stream)
                d.record(self._events[slot], stream)
                self._recorded[j].set()
                with self._lock:
                    self.done_bytes += sum(p.nbytes for _, p in self._batches[j])
            d.wait_stream(stream)
            with self._lock:
                self.seconds = max(self.seconds, time.perf_counter() - self._t0)
        except Exception as exc:  # noqa: BLE001 - reported by wait(), one line
            with self._lock:
                if self._error is None:
                    self._error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    def _fill(self, i: int, p: Piece, dst: int) -> None:
        name, file_offset, _ = self.objects[i]
        view = memoryview((ctypes.c_char * p.nbytes).from_address(dst)).cast("B")
        got = 0
        while got < p.nbytes:
            try:
                n = os.preadv(self._fd, [view[got:]], file_offset + p.src_offset + got)
            except OSError as exc:
                raise WeightStreamError(f"object {name}: cannot read {self.path}: {exc.strerror or exc}") from None
            if n <= 0:
                raise WeightStreamError(f"object {name}: {self.path} ends before its last byte")
            got += n

    def wait(self, progress=None) -> None:
        """Block until every byte is on the device; raises WeightStreamError (the stream is closed).
        `progress(done_bytes)`: called every 0.1 s while waiting."""
        for t in self._threads:
            while t.is_alive():
                t.join(0.1)
                if progress is not None:
                    progress(self.done_bytes)
        try:
            if self._error is None:
                self.driver.bind_thread()
                for s in self._streams:
                    self.driver.wait_stream(s)
        except Exception as exc:  # noqa: BLE001
            self._error = str(exc).splitlines()[0]
        self._release_staging()
        if self._error is not None:
            error = self._error
            self.close()
            raise WeightStreamError(f"weight upload from {self.path}: {error}")

    def adopt(self, torch) -> dict:
        """{name: 1-D uint8 tensor on the device} viewing the allocation (after `wait`)."""
        whole = self.driver.as_tensor(torch, self._memory)
        self._memory = None  # the tensors hold it now
        return {n: whole[off:off + nb] for (n, _, nb), off in zip(self.objects, self.offsets)}

    def _release_staging(self) -> None:
        d, self._threads = self.driver, []
        try:
            d.bind_thread()
            for s in self._streams:  # no copy may still read a staging buffer
                d.wait_stream(s)
            for e in self._events:
                d.destroy_event(e)
            for s in self._streams:
                d.destroy_stream(s)
            if self._host:
                d.host_free(self._host)
        except Exception:  # noqa: BLE001 - nothing more to do for them
            pass
        self._events, self._streams, self._host = [], [], None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Stop the readers and free everything the stream still holds."""
        self._error = self._error or "closed"
        for t in self._threads:
            t.join()
        self._release_staging()
        if self._memory is not None:
            self._memory.free()
            self._memory = None


# ----------------------------------------------------------------------------- started with the process

_PRESTARTED: dict[tuple[str, int], "_Prestart"] = {}


class _Prestart:
    def __init__(self):
        self.ready = threading.Event()
        self.stream: WeightStream | None = None


def cuda_ordinal(device) -> int | None:
    """The CUDA device index a device spec names without torch (None: "cuda" / unset -> 0 unless
    the spec is another device type)."""
    spec = "cuda" if device is None else str(device)
    if spec == "cuda":
        return 0
    if spec.startswith("cuda:") and spec[5:].isdigit():
        return int(spec[5:])
    return None


def prestart(plan_dir, artifact, device=None) -> bool:
    """Start streaming the weights `plan_dir` uses from `artifact` to the GPU `device` (a torch
    device spec; None: the first GPU) in a background thread, before torch is imported; the loader
    of that plan takes the stream (`take`). Returns whether a thread was started. Anything that keeps
    the stream from running (no driver or GPU, another sm, a --tp plan, NINFER_PINNED_UPLOAD=0, a
    plan or artifact the load will refuse) only means the loader uploads the usual way."""
    ordinal = cuda_ordinal(device)
    try:
        enabled = pinned_upload_enabled()
    except PlanError:  # the loader reports it
        enabled = False
    if ordinal is None or not enabled:
        return False
    key = (os.path.realpath(artifact), ordinal)
    if key not in _PRESTARTED:
        job = _PRESTARTED[key] = _Prestart()
        threading.Thread(target=_prestart, args=(job, plan_dir, artifact, ordinal), name="ninfer-weights-prestart",
                         daemon=True).start()
    return True


def _prestart(job: _Prestart, plan_dir, artifact, ordinal: int) -> None:
    try:
        from pathlib import Path

        from .artifact_view import ArtifactView
        from .cuda_driver import CudaDriver, present
        from .plan_source import read_plan
        from .weight_shards import weight_refs

        if not present():  # a machine without a GPU: nothing to read
            return
        plan, _ = read_plan(Path(plan_dir))
        if plan.get("tensor_parallel"):  # its ranks are other processes: this one never touches CUDA
            return
        driver = CudaDriver.open(ordinal)
        if driver.compute_capability() != int(plan["sm"]):
            return
        names, _ = weight_refs(plan)
        with ArtifactView.open(artifact) as art:
            objects = [(n, art.payload_offset + art.objects[n].offset, art.objects[n].bytes) for n in names]
        job.stream = WeightStream(driver, artifact, objects).start()
    except Exception:  # noqa: BLE001 - the loader uploads the usual way and reports any real problem
        job.stream = None
    finally:
        job.ready.set()


def take(path, names, ordinal: int) -> WeightStream | None:
    """The stream `prestart` began for `path` on device `ordinal`, if it streams exactly `names` in
    this order (waits until the prestart thread has decided); another one is closed. None: none."""
    job = _PRESTARTED.pop((os.path.realpath(path), ordinal), None)
    if job is None:
        return None
    job.ready.wait()
    stream = job.stream
    if stream is not None and stream.names != tuple(names):
        stream.close()
        return None
    return stream


def discard(path) -> None:
    """Close every stream prestarted for the artifact `path` that no load took (a load that failed
    before its upload), so its device memory is not held to the end of the process."""
    if path is None:
        return
    real = os.path.realpath(path)
    for key in [k for k in _PRESTARTED if k[0] == real]:
        job = _PRESTARTED.pop(key)
        job.ready.wait()
        if job.stream is not None:
            job.stream.close()
