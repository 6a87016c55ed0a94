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
  (route, reason): they JIT at run time. `phases` limits it to some extents (the column-count
  discovery reproduces the prefill extents only).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import io
import linecache
from collections.abc import Collection, Mapping
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
        self.record(kw["fn"].jit_function, kw["key"], kw["compile"]["specialization_data"])
        return True  # skip the compile and the launch

    def record(self, jf, key, spec: str) -> None:
        """One kernel launch of the launch being reproduced: kernel `jf` specialised as `spec`."""
        k = (id(jf), key)
        rec = self.captures.get(k)
        if rec is None:
            rec = self.captures[k] = Capture(jf, key, spec, self.current)
        rec.launches += 1
        self.produced.append(k)


class LaunchMemo:
    """Launches reproduced by earlier compiles (the binary cache's `launch-v1` entries): a launch's
    signature -> the kernels its launcher launched and their specialisations. `context` is the
    digest of everything else a launcher can read (the kernel package's Python source, the
    runtime's code, the toolchain, sm and environment: codegen/aot.py's `launch_context`), so an
    entry is only found by a launch that would launch the same kernels the same way."""

    def __init__(self, cache, context: str, root: str):
        self.cache, self.context, self.root = cache, context, root
        self.hits = 0

    def _key(self, sig) -> str:
        from .binary_cache import digest

        return digest({"context": self.context, "signature": repr(sig)})

    def _jit(self, ref: str):
        """The JIT function named `module:qualname` in the kernel package (None: not found)."""
        import importlib

        mod, _, qual = ref.partition(":")
        try:
            obj = importlib.import_module(f"{self.root}.{mod}" if mod else self.root)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            return None
        while obj is not None and not hasattr(obj, "preload") and hasattr(obj, "fn"):
            obj = obj.fn  # heuristics / autotune wrappers
        return obj if hasattr(obj, "preload") else None

    def _ref(self, jf) -> str:
        mod = jf.__module__
        return f"{mod[len(self.root) + 1:] if mod.startswith(self.root + '.') else ''}:{jf.fn.__qualname__}"

    def replay(self, sig, session: "Session") -> bool:
        """Record what the remembered launch launched (False: nothing remembered for `sig`)."""
        got = self.cache.get_json("launch-v1", self._key(sig))
        if not isinstance(got, list):
            return False
        here = self.root + "."
        try:
            calls = [(self._jit(ref), key.replace(ROOT_PLACEHOLDER + ".", here),
                      spec.replace(ROOT_PLACEHOLDER + ".", here)) for ref, key, spec in got]
        except (TypeError, ValueError, AttributeError):
            return False
        if any(jf is None for jf, _, _ in calls):
            return False
        for jf, key, spec in calls:
            session.record(jf, key, spec)
        self.hits += 1
        return True

    def remember(self, sig, session: "Session", produced: list) -> None:
        """Store the kernels launch `sig` launched (only those found again by name)."""
        calls = []
        for k in produced:
            rec = session.captures[k]
            ref = self._ref(rec.jf)
            if self._jit(ref) is not rec.jf or not isinstance(rec.key, str):
                return  # a kernel not reachable by its name (e.g. made by a factory): not remembered
            calls.append([ref, rec.key.replace(self.root + ".", ROOT_PLACEHOLDER + "."),
                          rec.spec.replace(self.root + ".", ROOT_PLACEHOLDER + ".")])
        self.cache.put_json("launch-v1", self._key(sig), calls)


def launch_signature(kwargs: Mapping[str, Any], AotTensor, layout: bool = False) -> tuple | None:
    """Everything a launcher can observe of its arguments, without absolute addresses: types,
    values, tensor dtype / shape / strides / 256-byte alignment, and which tensors share a storage,
    start at the same address or overlap. Two launches with equal signatures specialise the same
    kernels the same way (the 64 layers of a model mostly repeat a few). None: not comparable.
    `layout`: also each tensor's byte offset from the first tensor of its storage (what decides
    whether views still overlap once narrowed to fewer columns). A dataclass field declared
    repr=False is a cache, not a value (QuantWeight._views: views of its own planes, filled by
    whichever launcher ran first), so it is left out: otherwise a launch's signature would depend on
    whether an earlier launch was run or replayed from the memo, and remembered launches would miss."""
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
        if dataclasses.is_dataclass(v) and not isinstance(v, type):  # repr=False fields: caches, see above
            return (type(v).__qualname__, tuple((f.name, sig(getattr(v, f.name))) for f in dataclasses.fields(v)
                                                if f.repr))
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
    if not layout:
        return out, rel
    first: dict[int, int] = {}
    return out, rel, tuple(p - first.setdefault(g, p) for p, _, g in spans)


def launch_classes(runner, bound: list, AotTensor) -> dict[int, list[int]]:
    """Launch kinds of an extent, from its launches bound at T: launch index of the first of each
    kind -> the later launches of that kind. Two launches are of one kind when their route, PDL
    use, column count, operand kinds (`bind`) and layout signature at T are equal; narrowing to n
    columns then changes them alike, so their signatures stay equal at every n (launches without a
    comparable signature are kinds of their own)."""
    kinds: dict[tuple, int] = {}
    out: dict[int, list[int]] = {}
    for i, (b, L) in enumerate(zip(bound, runner.entry.get("launches", []))):
        if b.route is None:
            continue
        try:
            sig = launch_signature(b.kwargs, AotTensor, layout=True)
        except Exception:  # noqa: BLE001 - not comparable: a kind of its own
            sig = None
        if sig is None:
            out[i] = []
            continue
        binds = tuple((x.get("arg"), tuple(sorted(k for k in x if k != "arg"))) for x in L.get("bind") or ())
        key = (b.route, b.pdl is not None, L.get("t"), binds, sig)
        first = kinds.setdefault(key, i)
        out.setdefault(first, [])
        if first != i:
            out[first].append(i)
    return out


def reproduce_launches(engine, session: Session, AotTensor, memo: LaunchMemo | None = None,
                       phases: Collection[str] | None = None) -> dict[tuple, dict]:
    """Reproduce every extent's launches (see the module docstring); returns the unbound ones.
    At T every launch is bound; at a prefill's other column counts only the first launch of each
    kind (`launch_classes`) is, and the others count as repeats of it. `memo`: launches remembered
    from earlier compiles are replayed from it instead of run, new ones are stored in it. `phases`:
    only the extents of those phases (None: every extent)."""
    unbound: dict[tuple, dict] = {}
    seen: dict = {}  # launch signature -> capture keys it produced (or its failure)

    def repeat(done, times: int) -> None:
        if isinstance(done, dict):  # the same failure again
            done["count"] += times
        else:
            for k in done:
                session.captures[k].launches += times

    def reproduce(b, where: str):
        """The capture keys (or the failure record) of launch `b`, counted once; None: its
        signature was not comparable (reproduced, not remembered)."""
        session.current = f"{where}/{b.op}"
        try:
            sig = launch_signature(b.kwargs, AotTensor)
            if sig is not None:
                sig = (b.route, b.pdl is not None, sig)  # a PDL launch is another specialisation
        except Exception:  # noqa: BLE001 - not comparable: reproduce it
            sig = None
        if sig is not None and sig in seen:
            repeat(seen[sig], 1)
            return seen[sig]
        session.produced = []
        if sig is not None and memo is not None and memo.replay(sig, session):
            seen[sig] = done = list(session.produced)
            return done
        try:
            b()
            done = list(session.produced)
            if sig is not None and memo is not None:
                memo.remember(sig, session, done)
        except Exception as exc:  # noqa: BLE001 - this launch JITs at run time
            k = (b.route, one_line(exc))
            done = unbound.setdefault(k, {"route": b.route, "op": b.op, "first": session.current,
                                          "count": 0, "reason": k[1]})
            done["count"] += 1
        if sig is None:
            return None
        seen[sig] = done
        return done

    for name, runner in sorted(engine.extents.items()):
        if phases is not None and runner.phase not in phases:
            continue
        cols = [None] if runner.phase != "prefill" else [None] + [
            c for c in prefill_columns(runner.t) if c != runner.t]
        classes = None
        for n in cols:
            where = f"{name}" + ("" if n is None else f"[{n} columns]")
            try:
                if classes is None:
                    bound = runner.bound(n)
                    idx = list(range(len(bound)))
                else:
                    idx = sorted(classes)
                    bound = runner.bind_launches(idx, n)
            except Exception as exc:  # noqa: BLE001 - the runtime would refuse it too
                k = ("*", one_line(exc))
                unbound.setdefault(k, {"route": None, "op": None, "first": where, "count": 0,
                                       "reason": k[1]})["count"] += 1
                continue
            for i, b in zip(idx, bound):
                if b.route is None:
                    continue
                done = reproduce(b, where)
                rest = [] if classes is None else classes[i]
                if done is not None:
                    repeat(done, len(rest))
                elif rest:  # not comparable after all: every launch of the kind on its own
                    for bj in runner.bind_launches(rest, n):
                        reproduce(bj, where)
            if n is None and runner.phase == "prefill":
                classes = launch_classes(runner, bound, AotTensor)
    return unbound
