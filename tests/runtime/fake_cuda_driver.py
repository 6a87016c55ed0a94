"""A stand-in for cuda_driver.CudaDriver on a CPU, for the weight stream's tests: host memory plays
the device; each stream is a thread that runs its copies later, in order, each after a random short
delay, and an event is complete once its stream has passed it. So a staging buffer refilled before
its copies ran, or a copy outside an allocation, shows in the bytes (or raises here)."""

from __future__ import annotations

import ctypes
import queue
import random
import threading
import time


class FakeDriver:
    def __init__(self, seed: int = 0, sm: int = 90, fail_copy_at: int | None = None):
        self.sm, self.fail_copy_at = sm, fail_copy_at
        self.memory: dict[int, ctypes.Array] = {}  # every allocation ever made (kept: freed memory stays readable)
        self.live: dict[int, int] = {}  # ptr -> bytes, allocations not freed
        self.streams: dict[int, tuple[queue.Queue, threading.Thread]] = {}
        self.events: dict[int, threading.Event] = {}
        self.copies = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def bind_thread(self) -> None:
        pass

    def compute_capability(self) -> int:
        return self.sm

    def alloc(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        ptr = ctypes.addressof(buf)
        with self._lock:
            self.memory[ptr], self.live[ptr] = buf, nbytes
        return ptr

    host_alloc = alloc

    def free(self, ptr: int) -> None:
        with self._lock:
            del self.live[ptr]

    host_free = free

    def _inside(self, ptr: int, nbytes: int) -> bool:
        with self._lock:
            return any(p <= ptr and ptr + nbytes <= p + n for p, n in self.live.items())

    def stream(self) -> int:
        q: queue.Queue = queue.Queue()
        t = threading.Thread(target=self._run, args=(q,), daemon=True)
        t.start()
        self.streams[id(q)] = (q, t)
        return id(q)

    def _run(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                else:
                    time.sleep(self._rng.random() * 0.002)
                    ctypes.memmove(*item)
            finally:
                q.task_done()

    def destroy_stream(self, stream: int) -> None:
        q, _ = self.streams.pop(stream)
        q.put(None)

    def event(self) -> int:
        e = threading.Event()
        e.set()  # never recorded: complete
        self.events[id(e)] = e
        return id(e)

    def destroy_event(self, event: int) -> None:
        del self.events[event]

    def copy_to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.copies += 1
        if self.copies == self.fail_copy_at:
            raise RuntimeError("cuMemcpyHtoDAsync_v2: CUDA_ERROR_ILLEGAL_ADDRESS")
        assert self._inside(dst, nbytes) and self._inside(src, nbytes), "a copy outside the allocations"
        self.streams[stream][0].put((dst, src, nbytes))

    def record(self, event: int, stream: int) -> None:
        e = self.events[event]
        e.clear()
        self.streams[stream][0].put(e)

    def wait_event(self, event: int) -> None:
        self.events[event].wait()

    def wait_stream(self, stream: int) -> None:
        self.streams[stream][0].join()

    def as_tensor(self, torch, memory):
        """A CPU tensor over the allocation that keeps `memory` alive, as torch.as_tensor does on a GPU."""
        view = (ctypes.c_char * max(memory.nbytes, 1)).from_address(memory.ptr)
        view.owner = memory
        return torch.frombuffer(view, dtype=torch.uint8)[:memory.nbytes]

    def read(self, ptr: int, nbytes: int) -> bytes:
        return ctypes.string_at(ptr, nbytes)
