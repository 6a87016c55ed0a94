"""Ahead-of-time kernel binaries: `PLAN/kernels/bin/`, compiled for the plan's sm without a GPU.

The runtime launches Triton kernels through the plan's emitted launchers; Triton's JIT turns each
launch into a *specialisation* (argument types, constexprs, 16-byte divisibility / `== 1` of
pointer and integer arguments, num_warps / num_stages ...) and compiles it on first use. This
module reproduces those launches at compile time and compiles every specialisation ahead of time:

1. The emitted kernel package is imported from memory under a private name, with canonical file
   names (`<plan>/kernels/linear/mma.py`): Triton hashes a kernel's source text and line numbers,
   not its path, so the runtime (which imports the same bytes from disk) computes the same keys,
   and the binaries' line info carries no host path (the bytes stay deterministic).
2. The runtime's own binding code (`ninfer_runtime.executor.ExtentRunner` over a subclass of its
   `Engine`) binds every extent's launches against *fake device tensors*: meta tensors that claim
   to live on `cuda:0` and report data pointers laid out like the runtime's (one aligned
   allocation per weight object / state buffer / arena / workspace + the plan's offsets), so
   every alignment test sees what it will see on the GPU. `torch.cuda.get_device_capability`
   reports the plan's sm and Triton's active driver is a stub whose target is
   `GPUTarget("cuda", sm, 32)`.
3. Each launch runs the launcher for real (its host-side logic decides constexprs, grids, asm
   paths); Triton's `jit_cache_hook` captures the specialisation the JIT computed and skips the
   compile and the launch. Decode extents run at their T; the prefill extent at T and at the
   chunk tails 1, 2, 3, T-1 and 2^k-1, 2^k, 2^k+1 (`prefill_columns`): other tails JIT once.
4. Every distinct specialisation is compiled with `JITFunction.preload` on Triton's serialised
   specialisation (exactly what the runtime replays at load) into a private scratch cache, and the
   metadata + cubin of each are collected into `kernels/bin/<cache key>/` (group files with
   relative child paths) with `kernels/bin/manifest.json` (see ninfer_runtime/triton_cache.py).

Failures never break the plan: an unsupported toolchain, a launch that cannot be reproduced or a
kernel that does not compile is recorded (`status` skipped / partial, with reasons) and the plan
keeps the source, which the runtime JITs. `NINFER_AOT_CACHE=DIR` keeps the scratch cache between
compiles (entries are compiled from the canonical file names, so reusing them keeps the plan
bytes identical).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.util
import io
import itertools
import json
import linecache
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AotResult", "disabled", "precompile", "prefill_columns", "attach_binaries", "remove_stale_scratch"]

PLAN_PREFIX = "<plan>"  # canonical file names of the emitted modules: <plan>/kernels/...
ROOT_PLACEHOLDER = "{plan}"  # the kernel package's name in recorded specialisations


@dataclass
class AotResult:
    """Binary files (relative path under the plan dir -> bytes) and the summary that goes into
    kernels/manifest.json["binaries"]."""

    files: dict[str, bytes]
    summary: dict[str, Any]
    manifest: dict[str, Any] | None = None


def disabled(reason: str) -> AotResult:
    return AotResult({}, {"status": "disabled", "reason": reason})


def _skipped(reason: str, **extra) -> AotResult:
    return AotResult({}, {"status": "skipped", "reason": reason, **extra})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(exc).__name__}: {msg}"[:300] if msg else type(exc).__name__


def prefill_columns(t: int) -> list[int]:
    """The prefill column counts reproduced ahead of time: T, the small tails 1-3, T-1 and every
    2^k-1, 2^k, 2^k+1 <= T (they cover the `== 1`, divisible-by-16 and next-power-of-two
    specialisation classes of the integers a launcher derives from T)."""
    cols = {t, 1, 2, 3, t - 1}
    p = 1
    while p <= t:
        cols.update((p - 1, p, p + 1))
        p *= 2
    return sorted(c for c in cols if 1 <= c <= t)


def _workers(n: int) -> int:
    """Compile processes: NINFER_AOT_JOBS, else the CPU count, at most n (Triton's compiler holds
    the GIL, so parallel compiles need processes)."""
    env = os.environ.get("NINFER_AOT_JOBS")
    try:
        jobs = int(env) if env else (os.cpu_count() or 1)
    except ValueError:
        jobs = 1
    return max(1, min(jobs, n, 32))


class _Counter:
    """`binaries i/N` progress lines: the first, the last and at most one a second between."""

    def __init__(self, progress, what: str = "binaries"):
        self.progress, self.what, self.last = progress, what, 0.0

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if done in (1, total) or now - self.last >= 1.0:
            self.last = now
            self.progress(f"{self.what} {done}/{total}")


def _warm_scratch_in_parallel(recs, specs, root, tmpdir: str, progress=None) -> bool:
    """Compile the specialisations in forked worker processes (they inherit the imported kernels,
    the stub driver and the knobs) so the parent's sequential pass only reads the scratch cache.
    Workers are interrupt-safe (ninfer_compile/workers.py: killed and reaped whatever ends the
    wait). Best effort: without fork, or on a pool failure, the parent compiles everything itself.
    Returns whether the workers ran."""
    from ..workers import run_forked

    workers = _workers(len(recs))
    if workers < 2 or not hasattr(os, "fork"):
        return False
    jfs = [r.jf for r in recs]

    def build(i: int) -> None:
        jfs[i].preload(specs[i].replace(ROOT_PLACEHOLDER + ".", root + "."))

    try:
        run_forked(build, len(recs), workers, on_done=_Counter(progress), tmpdir=tmpdir)
    except Exception:  # noqa: BLE001 - e.g. a broken pipe: the sequential pass compiles what is missing
        return False
    return True


# ----------------------------------------------------------------------------- prerequisites


def toolchain_problem(sm: int) -> str | None:
    """Why binaries cannot be built here (None: they can)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.runtime.jit import JITFunction
    except Exception as exc:  # noqa: BLE001
        return f"triton is not usable: {_one_line(exc)}"
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        return f"triton {triton.__version__} has no knobs.runtime.jit_cache_hook (needs >= 3.4)"
    if not hasattr(JITFunction, "preload"):
        return f"triton {triton.__version__} has no JITFunction.preload"
    try:
        from triton.language import standard
    except Exception as exc:  # noqa: BLE001
        return f"triton.language is not importable: {_one_line(exc)}"
    if any(type(v).__name__ == "InterpretedFunction" for v in vars(standard).values()):
        return ("triton was imported in interpreter mode (TRITON_INTERPRET=1): its library functions are "
                "interpreter objects, so this process cannot compile kernels; compile without TRITON_INTERPRET")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton's CUDA backend is not available: {_one_line(exc)}"
    try:
        import ninfer_runtime.executor  # noqa: F401
        import ninfer_runtime.loader  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"ninfer_runtime is not importable: {_one_line(exc)}"
    if not isinstance(sm, int) or sm < 50:
        return f"unsupported sm {sm!r}"
    return None


# ----------------------------------------------------------------------------- fake device tensors


def _fake_tensor_api():
    """(AotTensor class, allocation mode class), built on first use (torch imported lazily)."""
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

    def _call(func, args, kwargs):
        kwargs = dict(kwargs or {})
        args = _unwrap(tuple(args))
        kwargs = _unwrap(kwargs)
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

    return AotTensor, AllocMode


# ----------------------------------------------------------------------------- importing from memory


class _MemoryImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the rendered kernel package (`kernels/...` texts) as `root`, file names canonical."""

    def __init__(self, root: str, files: Mapping[str, str]):
        self.root = root
        self.modules: dict[str, tuple[str, str, bool]] = {}
        for rel, text in files.items():
            if not rel.startswith("kernels/") or not rel.endswith(".py"):
                continue
            parts = rel[len("kernels/"):-3].split("/")
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join([root, *parts])
            self.modules[name] = (f"{PLAN_PREFIX}/{rel}", text, is_pkg)

    def filenames(self) -> list[str]:
        return [f for f, _, _ in self.modules.values()]

    def find_spec(self, fullname, path=None, target=None):
        m = self.modules.get(fullname)
        if m is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=m[0], is_package=m[2])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        filename, text, _ = self.modules[module.__name__]
        module.__file__ = filename
        # what linecache / inspect would read from the file on disk (universal newlines)
        lines = io.StringIO(text, newline=None).readlines()
        linecache.cache[filename] = (len(text), None, lines, filename)
        exec(compile(text, filename, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname):
        return self.modules[fullname][1]


# ----------------------------------------------------------------------------- the environment


class _AotDriver:
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


@dataclass
class _Capture:
    jf: Any
    key: str
    spec: str
    first_use: str
    launches: int = 0


@dataclass
class _Session:
    root: str
    captures: dict = field(default_factory=dict)
    current: str = ""
    compiling: bool = False
    produced: list = field(default_factory=list)  # capture keys hit by the launch being reproduced

    def hook(self, **kw):
        if self.compiling:
            return None
        jf = kw["fn"].jit_function
        comp = kw["compile"]
        k = (id(jf), kw["key"])
        rec = self.captures.get(k)
        if rec is None:
            rec = self.captures[k] = _Capture(jf, kw["key"], comp["specialization_data"], self.current)
        rec.launches += 1
        self.produced.append(k)
        return True  # skip the compile and the launch


def _launch_signature(kwargs: Mapping[str, Any], AotTensor) -> tuple | None:
    """Everything a launcher can observe of its arguments, without absolute addresses: types,
    values, tensor dtype / shape / strides / 256-byte alignment, and which tensors share a storage,
    start at the same address or overlap. Two launches with equal signatures specialise the same
    kernels the same way (the 64 layers of a model mostly repeat a few). None: not comparable."""
    import dataclasses

    import torch

    groups: dict[int, int] = {}
    spans: list[tuple[int, int, int]] = []
    opaque = [False]

    def sig(v):
        if isinstance(v, AotTensor):
            ptr = v.data_ptr()
            g = groups.setdefault(v.untyped_storage().data_ptr(), len(groups))
            es = v.element_size()
            end = ptr + (sum((d - 1) * st for d, st in zip(v.shape, v.stride())) + 1) * es if v.numel() else ptr
            spans.append((ptr, end, g))
            return ("T", str(v.dtype), tuple(v.shape), tuple(v.stride()), ptr % 256, g)
        if isinstance(v, torch.Tensor):
            opaque[0] = True
            return None
        if v is None or isinstance(v, (bool, int, float, str)):
            return (type(v).__name__, v)
        if isinstance(v, torch.dtype):
            return ("dtype", str(v))
        if type(v) in (tuple, list):
            return (type(v).__name__, tuple(sig(x) for x in v))
        if type(v) is dict:
            return ("dict", tuple((str(k), sig(v[k])) for k in sorted(v, key=str)))
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return (type(v).__qualname__, tuple((f.name, sig(getattr(v, f.name))) for f in dataclasses.fields(v)))
        if hasattr(v, "__dict__") and not callable(v):
            d = vars(v)
            return (type(v).__qualname__, tuple((k, sig(d[k])) for k in sorted(d)))
        opaque[0] = True
        return None

    with torch._C.DisableTorchFunction():  # plain attribute reads (no per-access dispatch)
        out = tuple((k, sig(kwargs[k])) for k in sorted(kwargs))
    if opaque[0]:
        return None
    rel = tuple((i, j, a[0] == b[0], a[0] < b[1] and b[0] < a[1])
                for i, a in enumerate(spans) for j, b in enumerate(spans) if j > i and a[2] == b[2])
    return out, rel


@contextlib.contextmanager
def _environment(sm: int, scratch: str, session: _Session):
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
        knobs.runtime.jit_cache_hook = session.hook
        knobs.cache.dir = scratch
        knobs.cache.manager_class = FileCacheManager
        for name in ("override", "dump_ir", "always_compile"):
            if hasattr(knobs.compilation, name):
                setattr(knobs.compilation, name, False)
        try:
            driver.set_active(_AotDriver(GPUTarget("cuda", int(sm), 32)))
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


def _aot_engine(plan, kernel_manifest, package, objects):
    import torch
    from ninfer_runtime.errors import PlanError
    from ninfer_runtime.loader import Engine, used_weights

    class _AotEngine(Engine):
        """The runtime's Engine over fake device memory: weights, arena, state and extents bound
        exactly as at load, nothing uploaded."""

        def __init__(self):
            self.plan_dir = None
            self.plan = plan
            self.kernel_manifest = kernel_manifest
            self.device = torch.device("cuda", 0)
            self.device_note = "ahead-of-time compilation"
            self._read_options()
            self.kernel_package = package
            self._launchers = {}
            self._quant_weight_cls = None
            self._objects = {}
            self._weights = {}
            self.binaries = None
            for n in used_weights(plan):
                e = objects.get(n)
                if e is None or getattr(e, "kind", "tensor") != "tensor":
                    raise PlanError(f"plan references object {n!r}, absent from the artifact")
                self._objects[n] = self._bind_object(e, torch.empty(int(e.bytes), dtype=torch.uint8,
                                                                    device=self.device))
            self._allocate()
            self._bind_extents()

        def close(self):
            pass

    return _AotEngine()


# ----------------------------------------------------------------------------- the pass


def _root_name(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for rel, text in sorted(files.items()):
        h.update(rel.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return f"_ninfer_aot_{h.hexdigest()[:12]}"


def _normalize_spec(spec: str, root: str) -> str:
    """Triton's serialised specialisation with the private package name replaced by a placeholder
    and the default libdevice path dropped (the runtime's Triton re-adds its own)."""
    obj = json.loads(spec.replace(root + ".", ROOT_PLACEHOLDER + "."))
    opts = obj.get("options") or {}
    libs = opts.get("extern_libs")
    if libs:
        from triton.backends.nvidia.compiler import CUDAOptions

        default = dict(CUDAOptions(num_warps=4).extern_libs)
        rest = [list(p) for p in libs if not (p[0] == "libdevice" and default.get("libdevice") == p[1])]
        if rest:
            opts["extern_libs"] = rest
        else:
            opts.pop("extern_libs")
    # key order kept as Triton wrote it: `preload` builds the launcher's argument list from the
    # order of "signature" (sorted keys put the kernel's arguments in alphabetical order: the H200
    # run of 2026-11-29 then passed tensors where ints were expected). Triton's order is itself
    # deterministic (the kernel's parameter order), so the plan stays byte-reproducible.
    return json.dumps(obj)


def _entry_kernel_ref(jf, root: str) -> str:
    mod = jf.__module__
    mod = mod[len(root) + 1:] if mod.startswith(root + ".") else ("" if mod == root else mod)
    return f"{mod}:{jf.fn.__qualname__}"


def remove_stale_scratch(tmp: str | None = None) -> list[str]:
    """Remove the `ninfer-aot-PID-*` scratch directories of processes that are gone (a compile
    killed with SIGKILL cannot clean up after itself). Returns the names removed."""
    from ..plan.output import pid_alive

    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for n in names:
        parts = n.split("-")
        if len(parts) < 4 or parts[:2] != ["ninfer", "aot"] or not parts[2].isdigit():
            continue
        p = os.path.join(tmp, n)
        if os.path.isdir(p) and not os.path.islink(p) and not pid_alive(int(parts[2])):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(n)
    return removed


def precompile(plan: Mapping[str, Any], kernel_files: Mapping[str, str], objects: Mapping[str, Any],
               sm: int, progress=None) -> AotResult:
    """Compile every (kernel, specialisation) the runtime will launch for `plan` (plan.json as a
    dict) into binary files for the plan dir. Never raises for toolchain / kernel problems: the
    summary says what was skipped and why (an interrupt — KeyboardInterrupt — is raised after the
    workers are killed and the scratch directory removed). `progress(line)`: phase and count."""
    problem = toolchain_problem(sm)
    if problem:
        return _skipped(problem)
    km_text = kernel_files.get("kernels/manifest.json")
    if km_text is None:
        return _skipped("the plan has no emitted kernels")
    kernel_manifest = json.loads(km_text)
    persistent = os.environ.get("NINFER_AOT_CACHE")
    # one private temp directory: the scratch cache (unless NINFER_AOT_CACHE) and the workers' TMPDIR
    remove_stale_scratch()
    work = tempfile.mkdtemp(prefix=f"ninfer-aot-{os.getpid()}-")
    if persistent:
        os.makedirs(persistent, exist_ok=True)
        scratch = persistent
    else:
        scratch = os.path.join(work, "cache")
        os.mkdir(scratch)
    worker_tmp = os.path.join(work, "tmp")
    os.mkdir(worker_tmp)
    root = _root_name(kernel_files)
    importer = _MemoryImporter(root, kernel_files)
    session = _Session(root)
    try:
        return _precompile(plan, kernel_manifest, importer, session, objects, int(sm), scratch,
                           worker_tmp, progress)
    except Exception as exc:  # noqa: BLE001 - the plan is written with source only
        return _skipped(f"ahead-of-time compilation failed: {_one_line(exc)}")
    finally:
        for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
            del sys.modules[name]
        for f in importer.filenames():
            linecache.cache.pop(f, None)
        try:
            from triton.runtime import jit as _jit

            reg = getattr(_jit, "_triton_jit_function_registry", None)
            if isinstance(reg, dict):
                for k in [k for k in reg if k.startswith(root + ".") or k.startswith(root + ":")]:
                    del reg[k]
        except Exception:  # noqa: BLE001
            pass
        shutil.rmtree(work, ignore_errors=True)


def _precompile(plan, kernel_manifest, importer, session, objects, sm, scratch, worker_tmp,
                progress=None) -> AotResult:
    from ninfer_runtime.triton_cache import (BIN_DIR, BIN_FORMAT, backend_digest, cache_env, hash_in_canonical_order,
                                             kernel_modules, triton_build_digest)

    AotTensor, AllocMode = _fake_tensor_api()
    root = session.root
    for f in importer.filenames():
        linecache.cache.pop(f, None)
    for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
        del sys.modules[name]
    unbound: dict[tuple, dict] = {}
    failed: list[dict] = []
    compiled: list[tuple[_Capture, Any, str]] = []
    with _environment(sm, scratch, session) as triton:
        sys.meta_path.insert(0, importer)
        try:
            importlib.import_module(root)
            # the runtime hashes in the same order before preloading (Triton < 3.7 keys depend on it)
            hash_in_canonical_order(root, kernel_modules(kernel_manifest))
            if progress is not None:
                progress("binaries: reproducing the launches")
            with AllocMode():
                engine = _aot_engine(plan, kernel_manifest, root, objects)
                seen: dict = {}  # launch signature -> capture keys it produced (or its failure)
                for name, runner in sorted(engine.extents.items()):
                    cols = [None] if runner.phase != "prefill" else [None] + [
                        c for c in prefill_columns(runner.t) if c != runner.t]
                    for n in cols:
                        where = f"{name}" + ("" if n is None else f"[{n} columns]")
                        try:
                            bound = runner.bound(n)
                        except Exception as exc:  # noqa: BLE001 - the runtime would refuse it too
                            k = ("*", _one_line(exc))
                            unbound.setdefault(k, {"route": None, "op": None, "first": where, "count": 0,
                                                   "reason": k[1]})["count"] += 1
                            continue
                        for b in bound:
                            if b.route is None:
                                continue
                            session.current = f"{where}/{b.op}"
                            try:
                                sig = _launch_signature(b.kwargs, AotTensor)
                                if sig is not None:
                                    sig = (b.route, b.pdl is not None, sig)  # a PDL launch is another specialisation
                            except Exception:  # noqa: BLE001 - not comparable: reproduce it
                                sig = None
                            if sig is not None and sig in seen:
                                done = seen[sig]
                                if isinstance(done, dict):  # the same failure again
                                    done["count"] += 1
                                else:
                                    for k in done:
                                        session.captures[k].launches += 1
                                continue
                            session.produced = []
                            try:
                                b()
                                done = list(session.produced)
                            except Exception as exc:  # noqa: BLE001 - this launch JITs at run time
                                k = (b.route, _one_line(exc))
                                done = unbound.setdefault(k, {"route": b.route, "op": b.op, "first": session.current,
                                                              "count": 0, "reason": k[1]})
                                done["count"] += 1
                            if sig is not None:
                                seen[sig] = done
            # compile every distinct specialisation, through the path the runtime replays
            session.compiling = True
            recs = list(session.captures.values())
            specs = [_normalize_spec(rec.spec, root) for rec in recs]
            # forked workers fill the scratch cache
            warmed = _warm_scratch_in_parallel(recs, specs, root, worker_tmp, progress)
            count = _Counter(None if warmed else progress)
            # the authoritative pass (cache hits after the warm-up)
            for i, (rec, spec) in enumerate(zip(recs, specs), start=1):
                count(i, len(recs))
                try:
                    kernel = rec.jf.preload(spec.replace(ROOT_PLACEHOLDER + ".", root + "."))
                    if kernel is None:
                        raise RuntimeError("Triton returned no kernel")
                    compiled.append((rec, kernel, spec))
                except Exception as exc:  # noqa: BLE001 - left to the JIT
                    failed.append({"kernel": _entry_kernel_ref(rec.jf, root), "first_use": rec.first_use,
                                   "reason": _one_line(exc)})
        finally:
            sys.meta_path.remove(importer)
        # harvest the metadata + binary of every compiled kernel
        files: dict[str, bytes] = {}
        entries = []
        for rec, kernel, spec in compiled:
            group = dict(kernel.metadata_group)
            meta = sorted(c for c in group if c.endswith(".json"))
            binext = None
            for c in group:
                if c.endswith(".cubin"):
                    binext = "cubin"
            if len(meta) != 1 or binext is None:
                failed.append({"kernel": _entry_kernel_ref(rec.jf, root), "first_use": rec.first_use,
                               "reason": f"no cubin/metadata in Triton's output ({sorted(group)})"})
                continue
            keydir = Path(group[meta[0]]).parent.name
            keep = sorted(c for c in group if c.endswith((".json", ".cubin")))
            efiles = {}
            for c in keep:
                data = Path(group[c]).read_bytes()
                files[f"{BIN_DIR}/{keydir}/{c}"] = data
                efiles[c] = hashlib.sha256(data).hexdigest()
            grp = json.dumps({"child_paths": {c: c for c in keep}}, sort_keys=True).encode()
            gname = f"__grp__{meta[0]}"
            files[f"{BIN_DIR}/{keydir}/{gname}"] = grp
            efiles[gname] = hashlib.sha256(grp).hexdigest()
            md = json.loads(files[f"{BIN_DIR}/{keydir}/{meta[0]}"])
            entries.append({"dir": keydir, "kernel": _entry_kernel_ref(rec.jf, root), "name": meta[0][:-5],
                            "files": efiles, "specialization": spec, "launches": rec.launches,
                            "first_use": rec.first_use, "num_warps": md.get("num_warps"),
                            "num_stages": md.get("num_stages"), "shared": md.get("shared")})
        entries.sort(key=lambda e: (e["kernel"], e["dir"], e["specialization"]))
        ptxas = ""
        try:
            from triton.backends.nvidia.compiler import get_ptxas_version

            try:
                ver = get_ptxas_version(sm)
            except TypeError:  # older Triton: one ptxas for every arch
                ver = get_ptxas_version()
            ptxas = next((ln.strip() for ln in ver.splitlines() if "release" in ln), ver.strip()[:120])
        except Exception:  # noqa: BLE001
            pass
        man = {
            "format": BIN_FORMAT,
            "triton": triton.__version__,
            "triton_key": triton_build_digest(),
            "backend": backend_digest(sm),
            "ptxas": ptxas,
            "target": {"backend": "cuda", "arch": sm, "warp_size": 32},
            "sm": sm,
            "env": cache_env(),
            "prefill_columns": sorted({c for r in engine.extents.values() if r.phase == "prefill"
                                       for c in prefill_columns(r.t)}),
            "entries": entries,
            "failed": sorted(failed, key=lambda f: (f["kernel"], f["first_use"])),
            "unbound": sorted(unbound.values(), key=lambda u: (str(u["route"]), u["first"])),
        }
    text = json.dumps(man, sort_keys=True, indent=1) + "\n"
    files[f"{BIN_DIR}/manifest.json"] = text.encode("utf-8")
    if not entries:
        reason = (failed[0]["reason"] if failed else
                  next(iter(unbound.values()))["reason"] if unbound else "no kernel launches to compile")
        return _skipped(f"no binaries: {reason}", triton=triton.__version__, sm=sm)
    status = "partial" if failed or unbound else "ok"
    reason = None
    if status == "partial":
        reason = (f"{len(failed)} kernel(s) failed to compile, {sum(u['count'] for u in unbound.values())} "
                  f"launch(es) not reproducible (see {BIN_DIR}/manifest.json)")
    summary = {"status": status, "reason": reason, "dir": BIN_DIR, "format": BIN_FORMAT,
               "triton": triton.__version__, "sm": sm, "entries": len(entries),
               "manifest_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    return AotResult(dict(sorted(files.items())), summary, man)


def attach_binaries(files: Mapping[str, str], result: AotResult) -> dict[str, str | bytes]:
    """The plan's kernel files with kernels/manifest.json["binaries"] set from `result` and the
    binary files added."""
    out: dict[str, str | bytes] = dict(files)
    km = json.loads(out["kernels/manifest.json"])
    km["binaries"] = result.summary
    out["kernels/manifest.json"] = json.dumps(km, sort_keys=True, indent=1, default=str) + "\n"
    for rel, data in result.files.items():
        if rel in out:
            raise ValueError(f"two writers for {rel}")
        out[rel] = data
    return dict(sorted(out.items()))
