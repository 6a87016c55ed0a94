"""The fake device of the ahead-of-time binary compile: memoryless CUDA tensors, a target-only
Triton driver, and the runtime `Engine` constructed over them.

Requires: torch, triton (imported when used), and `ninfer_runtime` importable (its `Engine`,
`DeviceBackend` and `PlanInMemory`).
Guarantees:
- `fake_tensors()` -> `FakeTensors`: `AotTensor` (a meta tensor that reports `cuda:0`, `is_cuda`,
  and data pointers of a fake address space: every storage gets its own 1 TiB-aligned base, views
  keep their offsets, so every alignment / aliasing test a launcher or Triton makes sees what it
  sees on the GPU), `empty(shape, dtype)`, and `AllocMode` (a torch function mode under which
  every tensor asked for on a CUDA device becomes an AotTensor: the launchers' own scratch).
  Reading data (`cpu`, `item`, `tolist`) raises.
- `FakeCudaDevice`: the runtime's `DeviceBackend` over those tensors: uploads nothing (the
  artifact's payload is never read), allocates AotTensors, uses no binaries, warms nothing and
  captures no graph.
- `aot_engine(...)`: a real `ninfer_runtime.loader.Engine`, built through its constructor with
  the plan held in memory (`PlanInMemory`), the compiler's artifact object table and the fake
  device: weights, arena, state and extents bound exactly as at load.
- `environment(sm, scratch, hook, manager_class)`: Triton's knobs set for capture (real
  JITFunctions, the `jit_cache_hook`, a private scratch cache behind `manager_class` that stores
  only the binaries and their metadata), its active driver a stub whose target is
  `GPUTarget("cuda", sm, 32)` and `torch.cuda.get_device_capability` reporting sm; all restored
  on exit.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class FakeTensors:
    AotTensor: type
    AllocMode: type
    empty: Callable[..., Any]  # empty(shape, dtype) -> AotTensor


def fake_tensors() -> FakeTensors:
    """A fresh fake address space and its tensor classes (torch imported lazily)."""
    import torch
    from torch.overrides import TorchFunctionMode

    cuda0 = torch.device("cuda", 0)

    class _Space:
        """Fake device addresses: every storage gets its own 1 TiB-aligned base."""

        def __init__(self):
            self.bases: dict[int, int] = {}
            self.keep: list = []
            self.next = itertools.count(1)

        def base(self, t) -> int:
            with torch._C.DisableTorchFunction():
                st = torch.Tensor.untyped_storage(t)
            key = st._cdata
            b = self.bases.get(key)
            if b is None:
                b = self.bases[key] = next(self.next) << 40
                self.keep.append(st)  # keep the (memoryless) storage alive: its id stays unique
            return b

    space = _Space()
    _MATMULS = (torch.mm, torch.Tensor.mm, torch.addmm, torch.Tensor.addmm, torch.Tensor.addmm_)

    class AotTensor(torch.Tensor):
        """A meta tensor that says it lives on cuda:0, with data pointers of a fake device."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return _call(func, args, kwargs)

        @property
        def device(self):
            return cuda0

        @property
        def is_cuda(self):
            return True

        @property
        def is_meta(self):
            return False

        def get_device(self):
            return 0

        def data_ptr(self):
            with torch._C.DisableTorchFunction():
                off = torch.Tensor.storage_offset(self) * torch.Tensor.element_size(self)
            return space.base(self) + off

        def untyped_storage(self):
            with torch._C.DisableTorchFunction():
                n = torch.Tensor.untyped_storage(self).nbytes()
            return _Storage(space.base(self), n)

        def cpu(self):
            raise RuntimeError("a fake device tensor has no data (ahead-of-time compilation)")

        def item(self):
            raise RuntimeError("a fake device tensor has no data (ahead-of-time compilation)")

        def tolist(self):
            raise RuntimeError("a fake device tensor has no data (ahead-of-time compilation)")

    class _Storage:
        def __init__(self, base, nbytes):
            self._base, self._nbytes = base, nbytes

        def data_ptr(self):
            return self._base

        def nbytes(self):
            return self._nbytes

        def size(self):
            return self._nbytes

    def _is_cuda(d) -> bool:
        if isinstance(d, torch.device):
            return d.type == "cuda"
        if isinstance(d, str):
            return d.split(":")[0] == "cuda"
        return False

    def _unwrap(x):
        if isinstance(x, AotTensor):
            with torch._C.DisableTorchFunction():
                return torch.Tensor.as_subclass(x, torch.Tensor)
        if type(x) in (list, tuple):
            return type(x)(_unwrap(v) for v in x)
        if type(x) is dict:
            return {k: _unwrap(v) for k, v in x.items()}
        return x

    def _wrap(x):
        if type(x) is torch.Tensor and x.device.type == "meta":
            with torch._C.DisableTorchFunction():
                return torch.Tensor.as_subclass(x, AotTensor)
        if type(x) in (list, tuple):
            return type(x)(_wrap(v) for v in x)
        return x

    def _matmul(func, args, kwargs):
        """torch.mm / addmm / Tensor.addmm_ (cuBLAS: nothing to capture but the result's shape),
        computed here: torch's meta kernels for them are Python decompositions whose first call
        imports torch._dynamo and sympy (~2 s of CPU). The checks are cuBLAS's callers' (2-D
        operands, inner dimensions, one dtype); a wrong-shaped `out` is resized, as torch does."""
        inplace = func is torch.Tensor.addmm_
        add = inplace or func in (torch.addmm, torch.Tensor.addmm)
        base, (a, b) = (args[0] if add else None), args[1:3] if add else args[:2]
        out = args[0] if inplace else kwargs.get("out")
        if a.dim() != 2 or b.dim() != 2:
            raise RuntimeError(f"{func.__name__}: both matrices must be 2-D, got {a.dim()}-D and {b.dim()}-D")
        if a.shape[1] != b.shape[0]:
            raise RuntimeError(f"{func.__name__}: mat1 and mat2 shapes cannot be multiplied "
                               f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})")
        shape = (a.shape[0], b.shape[1])
        dtypes = {t.dtype for t in (a, b, base, out) if t is not None}
        if len(dtypes) != 1:
            raise RuntimeError(f"{func.__name__}: expected one dtype, got {sorted(map(str, dtypes))}")
        lead = tuple(base.shape) if base is not None else ()
        if base is not None and (len(lead) > 2 or any(d not in (1, e) for d, e in zip(lead[::-1], shape[::-1]))
                                 or (inplace and lead != shape)):
            raise RuntimeError(f"{func.__name__}: input of shape {lead} does not broadcast to {shape}")
        if out is None:
            return torch.empty(shape, dtype=a.dtype, device="meta")
        if tuple(out.shape) != shape:
            torch.Tensor.resize_(out, shape)
        return out

    def _call(func, args, kwargs):
        kwargs = dict(kwargs or {})
        args = _unwrap(tuple(args))
        kwargs = _unwrap(kwargs)
        if func in _MATMULS:
            with torch._C.DisableTorchFunction():
                return _wrap(_matmul(func, args, kwargs))
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "meta"
        if func is torch.Tensor.cuda:
            func, args, kwargs = torch.Tensor.to, (args[0], "meta"), {}
        elif func is torch.Tensor.to:
            args = tuple("meta" if (i > 0 and (_is_cuda(a) or (isinstance(a, int) and not isinstance(a, bool)
                                                               and i == 1)))
                         else a for i, a in enumerate(args))
        with torch._C.DisableTorchFunction():
            out = func(*args, **kwargs)
        return _wrap(out)

    class AllocMode(TorchFunctionMode):
        """Every tensor asked for on a CUDA device becomes a fake device tensor."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return _call(func, args, kwargs)

    def empty(shape, dtype) -> AotTensor:
        with torch._C.DisableTorchFunction():
            t = torch.empty(shape, dtype=dtype, device="meta")
        return _wrap(t)

    return FakeTensors(AotTensor, AllocMode, empty)


# ----------------------------------------------------------------------------- the runtime's Engine


def _backend_base():
    from ninfer_runtime.device import DeviceBackend

    return DeviceBackend


class ObjectTable:
    """The artifact as the compiler read it: its object entries (name -> entry with kind / format /
    shape / bytes), no payload and no frontend resources."""

    def __init__(self, objects: Mapping[str, Any]):
        self.objects = dict(objects)
        self.path = Path("<artifact>")

    def span(self, name: str):
        raise RuntimeError("the artifact's payload is not read during ahead-of-time compilation")

    def has_resource(self, name: str) -> bool:
        return False

    def resource_bytes(self, name: str) -> bytes:
        raise RuntimeError("no artifact resources during ahead-of-time compilation")

    def close(self) -> None:
        pass


def fake_cuda_device(sm: int, fake: FakeTensors):
    """The `DeviceBackend` of the ahead-of-time pass (a class built on the runtime's base)."""
    import torch
    from ninfer_runtime.errors import PlanMismatch

    class FakeCudaDevice(_backend_base()):
        """cuda:0 of an sm_`sm` GPU that holds no data: nothing uploaded, warmed or captured."""

        warm = False
        capture_graphs = False

        def __init__(self):
            self.device = torch.device("cuda", 0)

        def check(self, plan: dict) -> str:
            if int(plan["sm"]) != int(sm):
                raise PlanMismatch(f"plan compiled for sm_{plan['sm']}, binaries asked for sm_{sm}")
            return f"ahead-of-time compilation for sm_{sm}"

        def kernel_binaries(self, source, package: str):
            return None, "kernels: captured ahead of time (no binaries yet)"

        def upload(self, read, nbytes: int):
            return fake.empty((int(nbytes),), torch.uint8)  # `read` is never called: no payload

        def zeros(self, shape, dtype):
            return fake.empty(shape if isinstance(shape, (list, tuple)) else (int(shape),), dtype)

    return FakeCudaDevice()


def aot_engine(plan: Mapping[str, Any], kernel_manifest: Mapping[str, Any], package: str,
               objects: Mapping[str, Any], sm: int, fake: FakeTensors):
    """The runtime's Engine over the fake device (its constructor, nothing set from outside).
    Call it under `fake.AllocMode()` (the runner's own allocations) inside `environment(...)`."""
    from ninfer_runtime.loader import Engine
    from ninfer_runtime.plan_source import PlanInMemory

    return Engine(PlanInMemory(dict(plan), dict(kernel_manifest), package), ObjectTable(objects),
                  device=fake_cuda_device(sm, fake), progress=False)


# ----------------------------------------------------------------------------- Triton's environment


class AotDriver:
    """Triton's active driver during ahead-of-time compilation: a target, no device."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True

    def __getattr__(self, name):
        raise AttributeError(f"no GPU during ahead-of-time compilation (driver.{name})")


@contextlib.contextmanager
def environment(sm: int, scratch: str, hook, manager_class=None):
    """Triton set up to capture specialisations for sm (see the module docstring); yields triton.
    `manager_class`: Triton's cache manager on the scratch directory (default FileCacheManager)."""
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.cache import FileCacheManager
    from triton.runtime.driver import driver

    saved_driver = getattr(driver, "_active", None)
    saved_cuda = {n: getattr(torch.cuda, n) for n in ("get_device_capability", "current_device")}
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        for group in (knobs.runtime, knobs.cache, knobs.compilation):
            stack.enter_context(group.scope())
        prev_interp = os.environ.get("TRITON_INTERPRET")
        knobs.runtime.interpret = False  # real JITFunctions (also sets TRITON_INTERPRET=0 for launchers)
        os.environ["TRITON_INTERPRET"] = "0"
        knobs.runtime.jit_cache_hook = hook
        knobs.cache.dir = scratch
        knobs.cache.manager_class = manager_class or FileCacheManager
        for name in ("override", "dump_ir", "always_compile"):
            if hasattr(knobs.compilation, name):
                setattr(knobs.compilation, name, False)
        # the scratch cache keeps only what is harvested (metadata, cubin): no ttir / ttgir / llir /
        # ptx files written by the workers, re-read by the authoritative pass and deleted at the end
        # (not part of Triton's cache key, no effect on the binaries)
        if hasattr(knobs.compilation, "store_binary_only"):
            knobs.compilation.store_binary_only = True
        try:
            driver.set_active(AotDriver(GPUTarget("cuda", int(sm), 32)))
            torch.cuda.get_device_capability = lambda device=None: (int(sm) // 10, int(sm) % 10)
            torch.cuda.current_device = lambda: 0
            yield triton
        finally:
            driver._active = saved_driver
            for n, f in saved_cuda.items():
                setattr(torch.cuda, n, f)
            if prev_interp is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = prev_interp
