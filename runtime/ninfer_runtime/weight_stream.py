"""The weight stream: a plan's weights copied from the artifact file to one device allocation by
several reader threads through pinned staging buffers, with the CUDA driver API (cuda_driver.py)
and no torch, so that it can start with the process and run while `import torch` (3-5 s) goes on.

Why: the object-by-object upload from the artifact's mmap (pinned_upload.py) took 1.7 s of the
27B's 5.8 s to a first token on an H100 (2026-12-07), after `import torch`. Here the used objects,
in file order, make runs of the file (gaps up to `GAP_BYTES` are carried along); the device
allocation mirrors each run byte for byte (an object keeps its file alignment, the artifact's 256
B), so a chunk of a run is one `preadv` into a pinned buffer (no page faults) and one host-to-device
copy. `READERS` threads take chunks in order, each queueing its copies on its own stream; an event
per buffer guards its reuse. While it runs, Python's switch interval is short: each reader needs
the GIL back after every call, and the main thread (importing torch) would otherwise keep it 5 ms.
`prestart(plan, artifact, device)` begins all of it in a background thread before torch is imported
(ninfer-run and ninfer-serve call it first thing); the loader then `take`s the stream and adopts
the allocation as torch tensors (`WeightStream.adopt`), or starts one itself.

- `stream_layout(objects, chunk_bytes)`: (each object's offset in the device allocation, the
  allocation's bytes, the `Chunk`s: file range -> device offset) (pure).
- `WeightStream(driver, path, objects)` (`objects`: (name, file offset, bytes)): `start()`,
  `done_bytes` / `stream_bytes`, `wait(progress)` (raises `WeightStreamError`, one line naming the
  file), `adopt(torch)` -> {name: 1-D uint8 CUDA tensor} viewing the allocation (freed with the last
  view), `close()` (frees what `adopt` did not take). `seconds`: from `start()` to its last copy.
- `prestart(...)` -> whether a thread was started; `take(path, names, ordinal)` -> the prestarted
  stream for exactly these objects on that device (another one is closed), else None; `discard(path)`.
- `pinned_upload_enabled()`: NINFER_PINNED_UPLOAD (unset or "1": pinned staging; "0": the pageable copy).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

from .errors import NinferRuntimeError, PlanError
from .switch_interval import ShortSwitchInterval

READERS = 8  # threads reading the file: a page-cache copy runs at ~6 GB/s a thread (H100 host, 2026-12-07)
BUFFERS = 16  # pinned staging buffers: two a reader, so a reader rarely waits on its own last copy
CHUNK_BYTES = 8 << 20  # one read and one copy; 8 MiB chunks streamed faster than 32 MiB ones (same run)
GAP_BYTES = 1 << 20  # unused bytes between two used objects carried along rather than starting a new run
FILE_ALIGN = 4096  # a run's device offset is its file offset modulo this (objects keep their alignment)
SWITCH_INTERVAL_S = 0.0002  # Python's switch interval while the readers run
PINNED_UPLOAD_ENV = "NINFER_PINNED_UPLOAD"


def pinned_upload_enabled() -> bool:
    """NINFER_PINNED_UPLOAD: unset or "1" -> True, "0" -> False; anything else is refused (one line)."""
    value = os.environ.get(PINNED_UPLOAD_ENV, "1").strip()
    if value not in ("0", "1"):
        raise PlanError(f"{PINNED_UPLOAD_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


class WeightStreamError(NinferRuntimeError):
    """The stream failed (a read, a driver call): one line naming the file."""


@dataclass(frozen=True)
class Chunk:
    """`nbytes` of the file from `file_offset`, copied to the device allocation at `device_offset`."""

    file_offset: int
    nbytes: int
    device_offset: int


def stream_layout(objects, chunk_bytes: int = CHUNK_BYTES, gap: int = GAP_BYTES,
                  align: int = FILE_ALIGN) -> tuple[dict[str, int], int, list[Chunk]]:
    """`objects` [(name, file offset, bytes)] -> ({name: device offset}, allocation bytes, chunks).
    In file order, an object starting at most `gap` bytes after the current run's end (or inside
    it) extends the run; a run's device offset is the next one after the previous run congruent to
    its file offset modulo `align`; chunks of at most `chunk_bytes` cover every run, in order."""
    if chunk_bytes <= 0:
        raise ValueError(f"weight stream: chunks of {chunk_bytes} bytes")
    runs: list[list] = []  # [file start, file end, [names]]
    for off, nb, name in sorted((int(o), int(n), str(m)) for m, o, n in objects if int(n) > 0):
        if runs and off <= runs[-1][1] + gap:
            runs[-1][1] = max(runs[-1][1], off + nb)
            runs[-1][2].append((name, off))
        else:
            runs.append([off, off + nb, [(name, off)]])
    offsets = {str(m): 0 for m, _, n in objects if int(n) == 0}
    chunks, end = [], 0
    for start, stop, names in runs:
        base = end + (start - end) % align
        offsets.update((name, base + off - start) for name, off in names)
        chunks += [Chunk(a, min(chunk_bytes, stop - a), base + a - start) for a in range(start, stop, chunk_bytes)]
        end = base + stop - start
    return offsets, max(end, align), chunks


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
                 chunk_bytes: int = CHUNK_BYTES):
        if buffers < readers + 1:
            raise ValueError(f"weight stream: {buffers} staging buffers for {readers} readers (needs more)")
        self.driver, self.path = driver, str(path)
        self.objects = [(str(n), int(off), int(nb)) for n, off, nb in objects]
        self.names = tuple(n for n, _, _ in self.objects)
        self.offsets, self.total, self._chunks = stream_layout(self.objects, chunk_bytes)
        self.stream_bytes = sum(c.nbytes for c in self._chunks)
        self._readers = max(1, min(readers, len(self._chunks)))
        self._buffers, self._chunk_bytes = buffers, chunk_bytes
        self._recorded = [threading.Event() for _ in self._chunks]
        self._lock, self._next, self._error, self._running = threading.Lock(), 0, None, 0
        self.done_bytes, self.seconds, self._t0 = 0, 0.0, 0.0
        self._switch = ShortSwitchInterval(SWITCH_INTERVAL_S)  # held while the readers run
        self._threads: list[threading.Thread] = []
        self._memory = self._host = None
        self._streams: list[int] = []
        self._events: list[int] = []
        self._fd = -1

    def start(self) -> "WeightStream":
        self._t0 = time.perf_counter()
        d = self.driver
        try:
            d.bind_thread()
            self._fd = os.open(self.path, os.O_RDONLY)
            self._memory = _DeviceMemory(d, d.alloc(self.total), self.total)
            self._host = d.host_alloc(self._buffers * self._chunk_bytes)
            self._events = [d.event() for _ in range(self._buffers)]
            self._streams = [d.stream() for _ in range(self._readers)]
        except BaseException:
            self.close()
            raise
        self._switch.acquire()
        self._running = self._readers
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
                if j >= len(self._chunks):
                    break
                slot = j % self._buffers
                if j >= self._buffers:  # the buffer's previous chunk: its copy queued, then done
                    while not self._recorded[j - self._buffers].wait(0.1):
                        if self._error is not None:
                            return
                    d.wait_event(self._events[slot])
                c, host = self._chunks[j], self._host + slot * self._chunk_bytes
                self._fill(c, host)
                d.copy_to_device(self._memory.ptr + c.device_offset, host, c.nbytes, stream)
                d.record(self._events[slot], stream)
                self._recorded[j].set()
                with self._lock:
                    self.done_bytes += c.nbytes
            d.wait_stream(stream)
            with self._lock:
                self.seconds = max(self.seconds, time.perf_counter() - self._t0)
        except Exception as exc:  # noqa: BLE001 - reported by wait(), one line
            with self._lock:
                if self._error is None:
                    self._error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._switch.release()

    def _fill(self, c: Chunk, dst: int) -> None:
        view = memoryview((ctypes.c_char * c.nbytes).from_address(dst)).cast("B")
        got = 0
        while got < c.nbytes:
            try:
                n = os.preadv(self._fd, [view[got:]], c.file_offset + got)
            except OSError as exc:
                raise WeightStreamError(f"{self._at(c.file_offset + got)}: cannot read it: {exc.strerror or exc}") from None
            if n <= 0:
                raise WeightStreamError(f"{self._at(c.file_offset + got)}: the file ends before its last byte")
            got += n

    def _at(self, offset: int) -> str:
        """The object holding file byte `offset`, for an error."""
        names = [n for n, off, nb in self.objects if off <= offset < off + nb]
        return f"object {names[0]}" if names else f"byte {offset}"

    def wait(self, progress=None) -> None:
        """Block until every byte is on the device; raises WeightStreamError (the stream is closed).
        `progress(done_bytes)`: called every 0.1 s while waiting."""
        for t in self._threads:
            while t.is_alive():
                t.join(0.1)
                if progress is not None:
                    progress(self.done_bytes)
        self._release_staging()
        if self._error is not None:
            error = self._error
            self.close()
            raise WeightStreamError(f"weight upload from {self.path}: {error}")

    def adopt(self, torch) -> dict:
        """{name: 1-D uint8 tensor on the device} viewing the allocation (after `wait`)."""
        whole = self.driver.as_tensor(torch, self._memory)
        self._memory = None  # the tensors hold it now
        return {n: whole[self.offsets[n]:self.offsets[n] + nb] for n, _, nb in self.objects}

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
        self._switch.release()
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
    """The CUDA device index a torch device spec names, read without torch: None or "cuda" -> 0,
    "cuda:N" -> N, anything else (the CPU, another device type) -> None."""
    spec = "cuda" if device is None else str(device)
    if spec == "cuda":
        return 0
    if spec.startswith("cuda:") and spec[5:].isdigit():
        return int(spec[5:])
    return None


def prestart(plan_dir, artifact, device=None, *, readers: int = READERS) -> bool:
    """Start streaming the weights `plan_dir` uses from `artifact` to the GPU `device` (a torch
    device spec; None: the first GPU) with `readers` threads, in a background thread, before torch
    is imported; the loader of that plan takes the stream (`take`). Returns whether a thread was
    started. Anything that keeps the stream from running (no driver or GPU, another sm, a --tp
    plan, NINFER_PINNED_UPLOAD=0, a plan or artifact the load will refuse) only means the loader
    uploads the usual way. (Importing triton here too, before or beside torch, to take the plan
    binaries' check off the load's critical path measured slower: it delays `import torch` more
    than it saves; bench/results/weight_stream_2026-12-07/.)"""
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
        threading.Thread(target=_prestart, args=(job, plan_dir, artifact, ordinal, readers),
                         name="ninfer-weights-prestart", daemon=True).start()
    return True


def _prestart(job: _Prestart, plan_dir, artifact, ordinal: int, readers: int) -> None:
    try:
        from pathlib import Path

        from . import cuda_driver
        from .artifact_view import ArtifactView
        from .plan_source import read_plan
        from .weight_shards import weight_refs

        if not cuda_driver.present():  # a machine without a GPU: nothing to read
            return
        plan, _ = read_plan(Path(plan_dir))
        if plan.get("tensor_parallel"):  # its ranks are other processes: this one never touches CUDA
            return
        driver = cuda_driver.CudaDriver.open(ordinal)
        if driver.compute_capability() != int(plan["sm"]):
            return
        names, _ = weight_refs(plan)
        with ArtifactView.open(artifact) as art:
            objects = [(n, art.payload_offset + art.objects[n].offset, art.objects[n].bytes) for n in names]
        job.stream = WeightStream(driver, artifact, objects, readers=readers, buffers=2 * readers).start()
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
