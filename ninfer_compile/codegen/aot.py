"""Ahead-of-time kernel binaries: `PLAN/kernels/bin/`, compiled for the plan's sm without a GPU.

The runtime launches Triton kernels through the plan's emitted launchers; Triton's JIT turns each
launch into a *specialisation* (argument types, constexprs, 16-byte divisibility / `== 1` of
pointer and integer arguments, num_warps / num_stages ...) and compiles it on first use. This
pass reproduces those launches at compile time and compiles every specialisation ahead of time.
It is split along its seams (each file's docstring says what it requires and guarantees):

- aot_device.py: the fake device (memoryless tensors that report cuda:0 and the runtime's
  pointer layout, Triton's stub driver for the plan's target) and the runtime's real `Engine`,
  constructed over it through its injected-device constructor (ninfer_runtime/device.py);
- aot_capture.py: the plan's kernels imported from memory under canonical file names, and every
  extent's launches reproduced through the runtime's binding code (`ExtentRunner`), Triton's
  `jit_cache_hook` capturing each specialisation and skipping the compile and the launch;
- aot_binaries.py: the worker pool and the authoritative compile pass (`JITFunction.preload`, what
  the runtime replays at load) into a private scratch cache, then `kernels/bin/<cache key>/` and
  `kernels/bin/manifest.json` (read by ninfer_runtime/triton_cache.py);
- this file: the entry point `precompile` (prerequisites, scratch directories, cleanup, status).

Failures do not break the plan: an unsupported toolchain, a launch that cannot be reproduced or a
kernel that does not compile is recorded (`status` skipped / partial, with reasons), the plan keeps
the source, which the runtime JITs, and `failure(summary)` is the one line `ninfer-compile` prints
as `warning: binaries: ...`. With NINFER_AOT_STRICT=1 (the test suite sets it, tests/conftest.py)
such a failure raises `AotFailure` instead, so a test that compiles binaries fails when they fail;
a process in Triton's interpreter mode (which cannot compile kernels) is a recorded skip either
way. `NINFER_AOT_CACHE=DIR` keeps the scratch cache between compiles (entries are compiled from the
canonical file names, so reusing them keeps the plan bytes identical).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import linecache
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import CompileError
from .aot_binaries import bin_manifest, compile_captures, harvest
from .aot_capture import MemoryImporter, Session, one_line, prefill_columns, reproduce_launches
from .aot_device import aot_engine, environment, fake_tensors

__all__ = ["AotFailure", "AotResult", "attach_binaries", "disabled", "failure", "precompile", "prefill_columns",
           "remove_stale_scratch", "toolchain_problem"]

STRICT_ENV = "NINFER_AOT_STRICT"
INTERPRETER_PROBLEM = ("triton was imported in interpreter mode (TRITON_INTERPRET=1): its library functions are "
                       "interpreter objects, so this process cannot compile kernels; compile without TRITON_INTERPRET")


class AotFailure(CompileError):
    """Binaries failed to build under NINFER_AOT_STRICT=1 (one line: why)."""


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


def failure(summary: Mapping[str, Any] | None) -> str | None:
    """Why binaries failed, in one line (None: built, disabled on purpose, or not attempted in a
    process running Triton's interpreter)."""
    if not summary:
        return None
    status, reason = summary.get("status"), summary.get("reason")
    if status == "partial":
        return f"binaries: {reason}; the runtime JITs those kernels"
    if status == "skipped" and reason != INTERPRETER_PROBLEM:
        return f"binaries: none built ({reason}); the runtime JITs the source"
    return None


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "0") not in ("", "0")


# ----------------------------------------------------------------------------- prerequisites


def toolchain_problem(sm: int) -> str | None:
    """Why binaries cannot be built here (None: they can)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.runtime.jit import JITFunction
    except Exception as exc:  # noqa: BLE001
        return f"triton is not usable: {one_line(exc)}"
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        return f"triton {triton.__version__} has no knobs.runtime.jit_cache_hook (needs >= 3.4)"
    if not hasattr(JITFunction, "preload"):
        return f"triton {triton.__version__} has no JITFunction.preload"
    try:
        from triton.language import standard
    except Exception as exc:  # noqa: BLE001
        return f"triton.language is not importable: {one_line(exc)}"
    if any(type(v).__name__ == "InterpretedFunction" for v in vars(standard).values()):
        return INTERPRETER_PROBLEM
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton's CUDA backend is not available: {one_line(exc)}"
    try:
        import ninfer_runtime.executor  # noqa: F401
        import ninfer_runtime.loader  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"ninfer_runtime is not importable: {one_line(exc)}"
    if not isinstance(sm, int) or sm < 50:
        return f"unsupported sm {sm!r}"
    return None


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
    summary says what was skipped and why, unless NINFER_AOT_STRICT=1, where such a failure raises
    `AotFailure` (an interrupt — KeyboardInterrupt — is raised after the workers are killed and the
    scratch directory removed). `progress(line)`: phase and count."""
    result = _precompile_or_skip(plan, kernel_files, objects, sm, progress)
    if strict() and failure(result.summary) is not None:
        raise AotFailure(f"binaries failed ({STRICT_ENV}=1): {result.summary.get('reason')}")
    return result


def _precompile_or_skip(plan, kernel_files, objects, sm, progress) -> AotResult:
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
    importer = MemoryImporter(root, kernel_files)
    session = Session(root)
    try:
        return _precompile(plan, kernel_manifest, importer, session, objects, int(sm), scratch,
                           worker_tmp, progress)
    except Exception as exc:  # noqa: BLE001 - the plan is written with source only
        return _skipped(f"ahead-of-time compilation failed: {one_line(exc)}")
    finally:
        _forget_package(root, importer)
        shutil.rmtree(work, ignore_errors=True)


def _root_name(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for rel, text in sorted(files.items()):
        h.update(rel.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return f"_ninfer_aot_{h.hexdigest()[:12]}"


def _forget_package(root: str, importer: MemoryImporter) -> None:
    """Drop the private kernel package: its modules, linecache entries and Triton's registry rows."""
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


def _precompile(plan, kernel_manifest, importer, session, objects, sm, scratch, worker_tmp,
                progress=None) -> AotResult:
    from ninfer_runtime.triton_cache import BIN_DIR, BIN_FORMAT, hash_in_canonical_order, kernel_modules

    fake = fake_tensors()
    root = session.root
    for f in importer.filenames():
        linecache.cache.pop(f, None)
    for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
        del sys.modules[name]
    with environment(sm, scratch, session.hook) as triton:
        sys.meta_path.insert(0, importer)
        try:
            importlib.import_module(root)
            # the runtime hashes in the same order before preloading (Triton < 3.7 keys depend on it)
            hash_in_canonical_order(root, kernel_modules(kernel_manifest))
            if progress is not None:
                progress("binaries: reproducing the launches")
            with fake.AllocMode():
                engine = aot_engine(plan, kernel_manifest, root, objects, sm, fake)
                unbound = reproduce_launches(engine, session, fake.AotTensor)
            # compile every distinct specialisation, through the path the runtime replays
            session.compiling = True
            compiled, failed = compile_captures(list(session.captures.values()), root, worker_tmp, progress)
        finally:
            sys.meta_path.remove(importer)
        files, entries, unharvested = harvest(compiled, root, BIN_DIR)
        failed += unharvested
        cols = sorted({c for r in engine.extents.values() if r.phase == "prefill" for c in prefill_columns(r.t)})
        man = bin_manifest(triton.__version__, sm, cols, entries, failed, unbound)
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
