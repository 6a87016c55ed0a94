"""Capturing the specialisations of the ahead-of-time binary compile: the plan's kernels imported
from memory, and every launch of every extent reproduced through the runtime's own binding code.

Requires: a Triton set up by aot_device.environment (its `jit_cache_hook` is `Session.hook`) and
an Engine built by aot_device.aot_engine, under the fake device's AllocMode.
Guarantees:
- `MemoryImporter(root, files)` imports the rendered `kernels/...` texts as the package `root`
  with canonical file names (`<plan>/kernels/linear/mma.py`) and the source in linecache: Triton
  hashes a kernel's source and line numbers, not its path, so the runtime (importing the same bytes
  from disk) computes the same cache keys, and line info names no host path.
- `reproduce_launches(engine, session, AotTensor)` runs each launch's launcher for real (its host
  logic decides constexprs, grids, asm paths); the hook records the specialisation Triton computed
  (`Session.captures`, one `Capture` per (kernel, cache key), with its first use and launch count)
  and skips the compile and the launch. Decode extents run at their T; the prefill extent at T
  and at `prefill_columns(T)`. Launches whose observable arguments are equal (`launch_signature`)
  are reproduced once and counted. Returns the launches that could not be reproduced, grouped by
  (route, reason): they JIT at run time.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import io
import linecache
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PLAN_PREFIX = "<plan>"  # canonical file names of the emitted modules: <plan>/kernels/...
ROOT_PLACEHOLDER = "{plan}"  # the kernel package's name in recorded specialisations


def one_line(exc: BaseException) -> str:
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


class MemoryImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
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


@dataclass
class Capture:
    jf: Any
    key: str
    spec: str
    first_use: str
    launches: int = 0


@dataclass
class Session:
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
            rec = self.captures[k] = Capture(jf, kw["key"], comp["specialization_data"], self.current)
        rec.launches += 1
        self.produced.append(k)
        return True  # skip the compile and the launch


def launch_signature(kwargs: Mapping[str, Any], AotTensor) -> tuple | None:
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


def reproduce_launches(engine, session: Session, AotTensor) -> dict[tuple, dict]:
    """Reproduce every extent's launches (see the module docstring); returns the unbound ones."""
    unbound: dict[tuple, dict] = {}
    seen: dict = {}  # launch signature -> capture keys it produced (or its failure)
    for name, runner in sorted(engine.extents.items()):
        cols = [None] if runner.phase != "prefill" else [None] + [
            c for c in prefill_columns(runner.t) if c != runner.t]
        for n in cols:
            where = f"{name}" + ("" if n is None else f"[{n} columns]")
            try:
                bound = runner.bound(n)
            except Exception as exc:  # noqa: BLE001 - the runtime would refuse it too
                k = ("*", one_line(exc))
                unbound.setdefault(k, {"route": None, "op": None, "first": where, "count": 0,
                                       "reason": k[1]})["count"] += 1
                continue
            for b in bound:
                if b.route is None:
                    continue
                session.current = f"{where}/{b.op}"
                try:
                    sig = launch_signature(b.kwargs, AotTensor)
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
                    k = (b.route, one_line(exc))
                    done = unbound.setdefault(k, {"route": b.route, "op": b.op, "first": session.current,
                                                  "count": 0, "reason": k[1]})
                    done["count"] += 1
                if sig is not None:
                    seen[sig] = done
    return unbound
