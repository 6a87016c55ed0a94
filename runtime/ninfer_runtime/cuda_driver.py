"""The few CUDA driver API calls the weight stream makes, through ctypes: no torch, so a weight
upload can run while `import torch` is still in progress (weight_stream.py).

It works in the device's primary context, the one the CUDA runtime (and so torch) uses: memory
allocated here is valid in torch, and torch's later initialisation finds the context made.

- `present()`: whether libcuda loads here (no initialisation).
- `CudaDriver.open(ordinal)`: loads libcuda, initialises it, retains the primary context of device
  `ordinal` for the rest of the process (torch holds it too) (`DriverUnavailable`, one line, when
  any of that fails: no driver, no such device).
- `bind_thread()`: makes the context current in the calling thread (each thread that calls below).
- `compute_capability()`, `as_tensor(torch, memory)`, `alloc` / `free` (device memory),
  `host_alloc` / `host_free` (pinned host memory), `stream()` / `destroy_stream`, `event()` /
  `destroy_event`, `copy_to_device(dst, src, nbytes, stream)` (async), `record(event, stream)`,
  `wait_event(event)`, `wait_stream(stream)`.
Each failing call raises `DriverError` naming the call and the driver's error name. ctypes releases
the GIL during every call.
"""

from __future__ import annotations

import ctypes

_STREAM_NON_BLOCKING = 1
_EVENT_DISABLE_TIMING = 2
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76


def present() -> bool:
    """Whether libcuda can be loaded here (nothing initialised: cheap, and safe before a fork)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class DriverUnavailable(RuntimeError):
    """No usable CUDA driver or device here (the weight stream is not started)."""


class DriverError(RuntimeError):
    """A driver call failed: `call` and the driver's error name."""


class CudaDriver:
    def __init__(self, lib, ordinal: int, device: int, context: int):
        self._lib, self.ordinal, self._device, self.context = lib, ordinal, device, context

    @classmethod
    def open(cls, ordinal: int) -> "CudaDriver":
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DriverUnavailable(f"no CUDA driver ({exc})") from None
        drv = cls(lib, ordinal, 0, 0)
        try:
            drv._call("cuInit", ctypes.c_uint(0))
            dev = ctypes.c_int()
            drv._call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
            ctx = ctypes.c_void_p()
            drv._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        except (DriverError, AttributeError) as exc:
            raise DriverUnavailable(str(exc)) from None
        drv._device, drv.context = dev.value, ctx.value
        return drv

    def _call(self, name: str, *args) -> None:
        rc = getattr(self._lib, name)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            got = self._lib.cuGetErrorName(ctypes.c_int(rc), ctypes.byref(text))
            label = text.value.decode() if got == 0 and text.value else f"error {rc}"
            raise DriverError(f"{name}: {label}")

    def bind_thread(self) -> None:
        self._call("cuCtxSetCurrent", ctypes.c_void_p(self.context))

    def as_tensor(self, torch, memory):
        """The 1-D uint8 CUDA tensor of `memory` (an object with `__cuda_array_interface__`), which
        the tensor keeps alive (torch is the caller's: this module never imports it)."""
        return torch.as_tensor(memory)

    def compute_capability(self) -> int:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(major), ctypes.c_int(_ATTR_CC_MAJOR), ctypes.c_int(self._device))
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), ctypes.c_int(_ATTR_CC_MINOR), ctypes.c_int(self._device))
        return major.value * 10 + minor.value

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def host_alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._call("cuMemHostAlloc", ctypes.byref(ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(0))
        return ptr.value

    def host_free(self, ptr: int) -> None:
        self._call("cuMemFreeHost", ctypes.c_void_p(ptr))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(s), ctypes.c_uint(_STREAM_NON_BLOCKING))
        return s.value

    def destroy_stream(self, stream: int) -> None:
        self._call("cuStreamDestroy_v2", ctypes.c_void_p(stream))

    def event(self) -> int:
        e = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(e), ctypes.c_uint(_EVENT_DISABLE_TIMING))
        return e.value

    def destroy_event(self, event: int) -> None:
        self._call("cuEventDestroy_v2", ctypes.c_void_p(event))

    def copy_to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                   ctypes.c_void_p(stream))

    def record(self, event: int, stream: int) -> None:
        self._call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait_event(self, event: int) -> None:
        self._call("cuEventSynchronize", ctypes.c_void_p(event))

    def wait_stream(self, stream: int) -> None:
        self._call("cuStreamSynchronize", ctypes.c_void_p(stream))
