"""Precompiled kernel binaries: a read-through Triton cache over `PLAN/kernels/bin/`.

The compiler (`ninfer_compile/codegen/aot.py`) compiles every (kernel, specialisation) the runtime
will launch ahead of time, for the plan's sm, into `PLAN/kernels/bin/`, laid out like Triton's file
cache: `bin/<cache key>/<kernel>.cubin`, `<kernel>.json` (metadata), `__grp__<kernel>.json` (the
group; child paths relative, so the plan can move). `bin/manifest.json` records the Triton version
and build (`triton_key` digest), the backend hash (ptxas version + arch), the cache-relevant
environment, every file's sha256 and, per entry, Triton's serialised specialisation (`preload` input).

At load (GPU only) `binaries_for` decides whether the binaries apply to this process: same Triton
version and build, same sm, same ptxas, same cache-invalidating environment, files intact. If so it
registers the bin directory with `PlanCacheManager`, selected through Triton's cache-manager knob
(`triton.knobs.cache.manager_class`, or `TRITON_CACHE_MANAGER` on a Triton without knobs);
`preload_binaries` then hands every entry to `JITFunction.preload`, which computes the cache key
the JIT computes at launch and so finds the entry in the plan (a key the plan lacks is reported
stale and left to the JIT). Otherwise the runtime JITs from the emitted source; the note says why.

`PlanCacheManager` looks in the registered plan bin directories first and delegates everything else (misses,
every write, launcher stubs) to the cache manager Triton would have used otherwise (normally `FileCacheManager`
on the user cache). It never writes into a plan directory. A binary or bin manifest whose sha256 differs from
its record is refused (PlanMismatch, one line naming the file), as the loader's integrity check (integrity.py)
does for every plan file.

Load phases (`PlanBinaries.phases`, seconds): "check" (manifest, toolchain, sha256; its parts
"check_triton" (its import and build digest: a sha256 of libtriton + sources, which its own keys need anyway),
"check_backend" (ptxas), "check_files"), "driver" (Triton's GPU driver, utilities built on first use), "hash",
"preload" (every entry's lookup and metadata), "module_load" (`load_modules`: every cubin loaded with its
launcher). On a GPU the loader runs all of them in one background thread beside the weight upload
(device.py `KernelSetup`), so the engine reports them as "<phase> (bg)".
This module imports only the standard library (and the runtime's errors) at import time; Triton when used.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from .errors import PlanMismatch

BIN_FORMAT = "ninfer-kernel-bin-v1"
BIN_DIR = "kernels/bin"

_lock = threading.RLock()
_DIRS: list[str] = []  # registered plan bin directories, most recent first
_REFS: dict[str, int] = {}  # engines using each registered directory
_FALLBACK: Any = None  # the cache manager class Triton would use without us (None: FileCacheManager)
_PLAN_ONLY = threading.local()  # set while preloading: a key the plan lacks raises instead of compiling
STATS = {"plan": 0, "user": 0, "compiled": 0}  # kernel lookups: served from a plan / the user cache / compiled


class NotInPlan(LookupError):
    """Raised (only while preloading) for a kernel (`get_group`) no registered plan holds."""


def _triton_cache_base():
    from triton.runtime.cache import CacheManager

    return CacheManager


def _make_manager_class():
    base = _triton_cache_base()

    class PlanCacheManager(base):
        """Triton cache manager: plan bin directories first (read-only), then the normal cache."""

        def __init__(self, key, override=False, dump=False):
            self.key = key
            self._args = (key, override, dump)
            self._fb = None
            self._dir = None
            self._plan_only = False
            if not override and not dump:  # override / dump managers: always the normal ones
                self._plan_only = getattr(_PLAN_ONLY, "on", False)
                with _lock:
                    dirs = list(_DIRS)
                for d in dirs:
                    p = os.path.join(d, key)
                    if os.path.isdir(p):
                        self._dir = p
                        break

        def _fallback(self):
            if self._fb is None:
                cls = _FALLBACK
                if cls is None:
                    from triton.runtime.cache import FileCacheManager as cls
                self._fb = cls(*self._args)
            return self._fb

        def _plan_file(self, filename):
            if self._dir is None or os.sep in filename or filename.startswith("."):
                return None
            p = os.path.join(self._dir, filename)
            return p if os.path.isfile(p) else None

        def get_file(self, filename):
            # never plan-only: besides kernels, Triton caches its driver utilities and per-signature
            # launcher stubs (cuda_utils*.so, __triton_launcher*.so) through get_file; those are
            # host code built on first use, never in a plan, and preloading must not fail on them
            # (the H200 run of 2026-11-29 counted every entry stale on cuda_utils). A kernel hit or
            # miss is decided in get_group, which is what triton.compile asks first.
            p = self._plan_file(filename)
            if p is not None:
                return p
            return self._fallback().get_file(filename)

        def get_group(self, filename):
            grp = self._plan_file(f"__grp__{filename}")
            if grp is not None:
                try:
                    with open(grp, encoding="utf-8") as f:
                        child = json.load(f).get("child_paths")
                    out = {}
                    for c, rel in child.items():
                        if os.path.isabs(rel) or ".." in Path(rel).parts:
                            raise ValueError(rel)
                        p = os.path.join(self._dir, rel)
                        if not os.path.isfile(p):
                            raise FileNotFoundError(p)
                        out[c] = p
                    STATS["plan"] += 1
                    return out
                except (OSError, ValueError, AttributeError, TypeError):
                    pass  # a damaged entry: treat as a miss
            if self._plan_only:
                raise NotInPlan(f"{self.key}/{filename}")
            res = self._fallback().get_group(filename)
            if filename.endswith(".json"):
                STATS["user" if res is not None else "compiled"] += 1
            return res

        def put(self, data, filename, binary=True):
            return self._fallback().put(data, filename, binary=binary)

        def put_group(self, filename, group):
            return self._fallback().put_group(filename, group)

    PlanCacheManager.__module__ = __name__
    PlanCacheManager.__qualname__ = "PlanCacheManager"
    return PlanCacheManager


_CLASS = None


def manager_class():
    """The `PlanCacheManager` class (a subclass of Triton's CacheManager; built on first use)."""
    global _CLASS
    with _lock:
        if _CLASS is None:
            _CLASS = _make_manager_class()
        return _CLASS


def __getattr__(name):  # `ninfer_runtime.triton_cache:PlanCacheManager` for TRITON_CACHE_MANAGER
    if name == "PlanCacheManager":
        return manager_class()
    raise AttributeError(name)


def _install(bin_dir: str) -> None:
    global _FALLBACK
    cls = manager_class()
    import triton

    knobs = getattr(triton, "knobs", None)
    with _lock:
        if bin_dir not in _DIRS:
            _DIRS.insert(0, bin_dir)
        _REFS[bin_dir] = _REFS.get(bin_dir, 0) + 1
        if knobs is not None and hasattr(knobs, "cache"):
            current = knobs.cache.manager_class
            if current is not cls:
                _FALLBACK = current
                knobs.cache.manager_class = cls
        else:  # a Triton without knobs reads the environment variable on every lookup
            ref = f"{__name__}:PlanCacheManager"
            current = os.environ.get("TRITON_CACHE_MANAGER")
            if current != ref:
                if current:
                    mod, _, attr = current.partition(":")
                    import importlib

                    _FALLBACK = getattr(importlib.import_module(mod), attr)
                os.environ["TRITON_CACHE_MANAGER"] = ref


def _uninstall(bin_dir: str) -> None:
    with _lock:
        _REFS[bin_dir] = _REFS.get(bin_dir, 1) - 1
        if _REFS[bin_dir] <= 0:
            _REFS.pop(bin_dir, None)
            if bin_dir in _DIRS:
                _DIRS.remove(bin_dir)
    # the manager class stays selected: with no plan directory it only delegates


# ----------------------------------------------------------------------------- the decision


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def triton_build_digest() -> str | None:
    """sha256 of Triton's own cache salt (`triton_key()`: version + hashes of its sources and
    libtriton), or None when this Triton does not expose it."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        try:
            from triton.compiler.compiler import triton_key
        except ImportError:
            return None
    return _sha256(triton_key().encode("utf-8"))


def backend_digest(sm: int) -> str | None:
    """sha256 of the CUDA backend's cache hash for `sm` (ptxas version + arch), or None."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        return _sha256(make_backend(GPUTarget("cuda", int(sm), 32)).hash().encode("utf-8"))
    except Exception:  # noqa: BLE001 - no CUDA backend / ptxas: the binaries cannot be matched
        return None


def cache_env() -> dict[str, str]:
    """The cache-invalidating environment variables set in this process (they enter every key)."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return {str(k): str(v) for k, v in sorted(get_cache_invalidating_env_vars().items())}
    except Exception:  # noqa: BLE001
        return {}


class PlanBinaries:
    """The plan's usable binaries, registered with the cache manager until `release()`."""

    def __init__(self, bin_dir: Path, manifest: dict[str, Any], modules: list[str] = (), *, partial: bool = False):
        self.bin_dir = bin_dir
        self.manifest = manifest
        self.modules = list(modules)  # the kernel package's modules (canonical hashing order)
        self.entries = list(manifest.get("entries") or [])
        self.partial = partial  # the compiler could not build every kernel it saw (status "partial")
        self.preloaded = 0
        self.stale: list[str] = []
        self._stats0 = dict(STATS)
        self._registered = False
        self.phases: dict[str, float] = {}
        self.kernels: list = []  # the preloaded CompiledKernels
        self.load_errors = 0  # modules `load_modules` could not load (left to the first launch)

    def register(self) -> None:
        _install(str(self.bin_dir))
        self._registered = True
        self._stats0 = dict(STATS)

    def load_modules(self) -> None:
        """Load every preloaded kernel's cubin onto the current CUDA device and build its launcher
        (the caller selects the device). A module that fails to load here is loaded (and its error
        raised) at its first launch; `load_errors` counts them."""
        t = time.perf_counter()
        for k in self.kernels:
            try:
                k._init_handles()
            except Exception:  # noqa: BLE001 - raised again at the kernel's first launch
                self.load_errors += 1
        self.phases["module_load"] = time.perf_counter() - t

    def complete(self) -> bool:
        """Every kernel the compiler saw launched is here, preloaded, its module loaded, and nothing
        was JIT-compiled or found stale: the first launches need no compile or module load."""
        return (not self.partial and bool(self.entries) and self.preloaded == len(self.entries)
                and len(self.kernels) == self.preloaded and not self.stale and self.load_errors == 0
                and self.stats()["compiled"] == 0)

    def release(self) -> None:
        if self._registered:
            _uninstall(str(self.bin_dir))
            self._registered = False

    def stats(self) -> dict[str, int]:
        return {k: STATS[k] - self._stats0.get(k, 0) for k in STATS}

    def note(self) -> str:
        m = self.manifest
        st = self.stats()
        text = (f"kernels: precompiled binaries (triton {m.get('triton')}, sm_{m.get('sm')}): "
                f"{self.preloaded}/{len(self.entries)} loaded from the plan")
        if self.stale:
            text += f", {len(self.stale)} stale ({self.stale[0]})"
        text += f", {st['compiled']} JIT-compiled"
        if st["user"]:
            text += f", {st['user']} from the user cache"
        return text


def binaries_for(plan_dir: Path, plan: dict, kernels: dict) -> tuple[PlanBinaries | None, str]:
    """(registered PlanBinaries, note) when PLAN/kernels/bin fits this process, else (None, note
    naming why the runtime JITs from source: another Triton, sm, ptxas or environment). A binary
    or bin manifest whose sha256 differs from its record is refused (PlanMismatch naming the file):
    damage is not a reason to silently run something else."""
    t0 = time.perf_counter()
    summary = kernels.get("binaries")
    if not summary:
        return None, "kernels: JIT from source (the plan has no precompiled binaries)"
    status = summary.get("status")
    if status not in ("ok", "partial"):
        return None, f"kernels: JIT from source (binaries {status} at compile time: {summary.get('reason')})"
    t = time.perf_counter()
    try:
        import triton
    except ImportError:
        return None, "kernels: JIT from source (triton is not importable)"
    if summary.get("triton") != triton.__version__:
        return None, (f"kernels: JIT from source (the plan's binaries were built by triton {summary.get('triton')}, "
                      f"this runtime has triton {triton.__version__})")
    if int(summary.get("sm", -1)) != int(plan["sm"]):
        return None, f"kernels: JIT from source (binaries for sm_{summary.get('sm')}, plan sm_{plan['sm']})"
    bin_dir = Path(plan_dir) / summary.get("dir", BIN_DIR)
    mpath = bin_dir / "manifest.json"
    try:
        raw = mpath.read_bytes()
    except OSError:
        return None, f"kernels: JIT from source ({BIN_DIR}/manifest.json is missing)"
    if summary.get("manifest_sha256") and _sha256(raw) != summary["manifest_sha256"]:
        raise PlanMismatch(f"{mpath}: sha256 does not match kernels/manifest.json (edited or damaged after compile)")
    try:
        man = json.loads(raw)
    except ValueError:
        return None, f"kernels: JIT from source ({BIN_DIR}/manifest.json is not JSON)"
    if man.get("format") != BIN_FORMAT:
        return None, f"kernels: JIT from source (binary format {man.get('format')!r}, this runtime reads {BIN_FORMAT})"
    want = man.get("triton_key")
    if want:
        got = triton_build_digest()
        if got is not None and got != want:
            return None, (f"kernels: JIT from source (the binaries come from another build of triton "
                          f"{triton.__version__})")
    parts, t = {"check_triton": time.perf_counter() - t}, time.perf_counter()
    want = man.get("backend")
    if want:
        got = backend_digest(int(plan["sm"]))
        if got != want:
            return None, ("kernels: JIT from source (this Triton's CUDA backend (ptxas) differs from the one that "
                          f"built the binaries: {man.get('ptxas') or 'ptxas ?'})")
    env = cache_env()
    if env != (man.get("env") or {}):
        diff = sorted(set(env.items()) ^ set((man.get("env") or {}).items()))
        return None, (f"kernels: JIT from source (cache-relevant environment differs from compile time: "
                      f"{', '.join(f'{k}={v}' for k, v in diff[:3])})")
    parts["check_backend"], t = time.perf_counter() - t, time.perf_counter()
    for e in man.get("entries") or []:
        for name, sha in sorted((e.get("files") or {}).items()):
            p = bin_dir / e["dir"] / name
            try:
                ok = _sha256(p.read_bytes()) == sha
            except OSError:
                raise PlanMismatch(f"{p}: kernel binary is missing (listed in {BIN_DIR}/manifest.json)") from None
            if not ok:
                raise PlanMismatch(f"{p}: kernel binary is damaged (sha256 differs from {BIN_DIR}/manifest.json)")
    parts["check_files"] = time.perf_counter() - t
    b = PlanBinaries(bin_dir, man, kernel_modules(kernels), partial=status == "partial")
    b.register()
    b.phases["check"] = time.perf_counter() - t0
    b.phases.update(parts)
    return b, (f"kernels: precompiled binaries (triton {man.get('triton')}, sm_{man.get('sm')}, "
               f"{len(b.entries)} entries)")


def kernel_modules(kernels: dict) -> list[str]:
    """The plan's kernel modules, relative to the package ('' = the package), sorted."""
    out = []
    for rel in (kernels.get("files") or {}):
        if not rel.startswith("kernels/") or not rel.endswith(".py"):
            continue
        parts = rel[len("kernels/"):-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return sorted(out)


def hash_in_canonical_order(package: str, modules: list[str]) -> int:
    """Compute the Triton cache key of every JIT function of the package, module by module and
    name by name, before anything else does.

    A kernel's cache key includes the constexpr globals of the functions it calls; Triton < 3.7
    merges a callee's globals *before* computing the callee's key, so a caller's key depends on
    whether its callees happened to be hashed earlier in the process (i.e. on launch order). The
    compiler and the runtime both hash in this fixed order on a fresh import, so they compute the
    same keys. Returns the number of functions hashed."""
    import importlib

    try:
        from triton.runtime.jit import JITCallable as base
    except ImportError:
        from triton.runtime.jit import JITFunction as base
    n = 0
    for rel in modules:
        try:
            mod = importlib.import_module(f"{package}.{rel}" if rel else package)
        except Exception:  # noqa: BLE001 - a module that cannot load is never launched either
            continue
        for name in sorted(vars(mod)):
            obj = getattr(mod, name, None)
            while obj is not None and not isinstance(obj, base) and hasattr(obj, "fn"):
                obj = obj.fn  # heuristics / autotune wrappers
            if isinstance(obj, base) and getattr(obj, "__module__", None) == mod.__name__:
                try:
                    obj.cache_key  # noqa: B018 - computed and cached by Triton
                    n += 1
                except Exception:  # noqa: BLE001 - its launches will report the problem
                    pass
    return n


def _jit_function(package: str, ref: str):
    import importlib

    mod, _, qual = ref.partition(":")
    obj = importlib.import_module(f"{package}.{mod}" if mod else package)
    for part in qual.split("."):
        obj = getattr(obj, part)
    while not hasattr(obj, "preload") and hasattr(obj, "fn"):  # heuristics / autotune wrappers
        obj = obj.fn
    if not hasattr(obj, "preload"):
        raise TypeError(f"{ref} is not a Triton JIT function")
    return obj


def preload_binaries(binaries: PlanBinaries, package: str) -> int:
    """Hand every entry to `JITFunction.preload` (plan-only lookups: an entry whose key the plan
    does not hold is counted stale, never compiled here). Returns the number loaded."""
    n = 0
    ph = binaries.phases
    t = time.perf_counter()
    try:  # Triton's GPU driver (its utilities module is built on first use): timed on its own
        from triton.runtime.driver import driver

        driver.active.get_current_device()
    except Exception:  # noqa: BLE001 - the first preload reports it
        pass
    ph["driver"] = time.perf_counter() - t
    _PLAN_ONLY.on = True
    try:
        t = time.perf_counter()
        hash_in_canonical_order(package, binaries.modules)
        ph["hash"] = time.perf_counter() - t
        t = time.perf_counter()
        for e in binaries.entries:
            try:
                jf = _jit_function(package, e["kernel"])
                spec = json.loads(e["specialization"])
                spec["name"] = getattr(jf, "_fn_name", f"{jf.__module__}.{jf.__qualname__}")
                k = jf.preload(json.dumps(spec))
                if k is not None and hasattr(k, "_init_handles"):
                    binaries.kernels.append(k)
                n += 1
            except Exception as exc:  # noqa: BLE001 - a stale entry is left to the JIT
                binaries.stale.append(f"{e.get('kernel')}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
        ph["preload"] = time.perf_counter() - t
    finally:
        _PLAN_ONLY.on = False
    binaries.preloaded = n
    return n


def format_phases(phases: dict[str, float]) -> str:
    """`name 0.12s, ...` in the order given (for the load line)."""
    return ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
