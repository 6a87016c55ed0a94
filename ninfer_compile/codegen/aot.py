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
- aot_stage_memo.py: specialisations whose LLVM IR is identical share their PTX and cubin;
- aot_keys.py: the binary cache keys of a whole result and of remembered launches;
- binary_cache.py: the user's content-addressed binary cache (kernel binaries and whole results);
- this file: the entry point `precompile` (prerequisites, the cache, scratch directories,
  cleanup, status).

With a binary cache (`cache`, the CLI's default; --no-cache: none), a compile whose inputs all
equal an earlier one's (`aot_keys.result_key`: the plan, the emitted source, the artifact's object
table, the sm, the toolchain, the capture code and the environment) takes that earlier result and
its binaries from the cache without capturing anything; otherwise every kernel the cache holds is
taken from it and only the rest is compiled. Either way the binaries are copied into the plan,
each checked against its sha256, and the plan's bytes are the same as a compile without cache.

Failures do not break the plan: an unsupported toolchain, a launch that cannot be reproduced or a
kernel that does not compile is recorded (`status` skipped / partial, with reasons), the plan keeps
the source, which the runtime JITs, and `failure(summary)` is the one line `ninfer-compile` prints
as `warning: binaries: ...`. With NINFER_AOT_STRICT=1 (the test suite sets it, tests/conftest.py)
such a failure raises `AotFailure` instead, so a test that compiles binaries fails when they fail;
a process in Triton's interpreter mode (which cannot compile kernels) is a recorded skip either
way.
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
from . import binary_cache
from .aot_binaries import ACTIVE, bin_manifest, compile_captures, harvest, publish, store_manager_class
from .aot_capture import LaunchMemo, MemoryImporter, Session, one_line, prefill_columns, reproduce_launches
from .aot_device import aot_engine, environment, fake_tensors
from .aot_keys import launch_context, plan_json, result_key
from .aot_stage_memo import shared_stages

__all__ = ["AotFailure", "AotResult", "attach_binaries", "column_parameters", "disabled", "failure", "plan_json",
           "precompile", "prefill_columns", "remove_stale_scratch", "toolchain_problem"]

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


def toolchain_problem(sm: int, runtime: bool = True) -> str | None:
    """Why binaries cannot be built here (None: they can). `runtime`: also import the runtime
    (torch; not needed to take a whole result from the binary cache)."""
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
    if not isinstance(sm, int) or sm < 50:
        return f"unsupported sm {sm!r}"
    if runtime:
        try:
            import ninfer_runtime.executor  # noqa: F401
            import ninfer_runtime.loader  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            return f"ninfer_runtime is not importable: {one_line(exc)}"
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
               sm: int, progress=None, cache: binary_cache.BinaryCache | None = None,
               plan_text: str | None = None) -> AotResult:
    """Compile every (kernel, specialisation) the runtime will launch for `plan` (plan.json as a
    dict) into binary files for the plan dir. Never raises for toolchain / kernel problems: the
    summary says what was skipped and why, unless NINFER_AOT_STRICT=1, where such a failure raises
    `AotFailure` (an interrupt — KeyboardInterrupt — is raised after the workers are killed and the
    scratch directory removed). `progress(line)`: phase and count. `cache`: the binary cache to
    take binaries from and store new ones in (None: compile everything). `plan_text`: `plan_json(plan)`
    where the caller has it (the result key without serialising the plan again)."""
    result = _precompile_or_skip(plan, kernel_files, objects, sm, progress, cache, plan_text)
    if strict() and failure(result.summary) is not None:
        raise AotFailure(f"binaries failed ({STRICT_ENV}=1): {result.summary.get('reason')}")
    return result


def _precompile_or_skip(plan, kernel_files, objects, sm, progress, cache, plan_text) -> AotResult:
    problem = toolchain_problem(sm, runtime=False)
    if problem:
        return _skipped(problem)
    km_text = kernel_files.get("kernels/manifest.json")
    if km_text is None:
        return _skipped("the plan has no emitted kernels")
    rkey = None
    if cache is not None:
        try:
            rkey = result_key(plan, kernel_files, objects, int(sm), cache, plan_text)
            hit = _cached_result(cache, rkey, int(sm), progress)
        except OSError:
            hit = None
        if hit is not None:
            return hit
    problem = toolchain_problem(sm)
    if problem:
        return _skipped(problem)
    kernel_manifest = json.loads(km_text)
    # one private temp directory: the scratch cache and the workers' TMPDIR
    remove_stale_scratch()
    work = tempfile.mkdtemp(prefix=f"ninfer-aot-{os.getpid()}-")
    scratch = os.path.join(work, "cache")
    os.mkdir(scratch)
    worker_tmp = os.path.join(work, "tmp")
    os.mkdir(worker_tmp)
    root = _root_name(kernel_files)
    importer = MemoryImporter(root, kernel_files)
    session = Session(root)
    ACTIVE.update(cache=cache, identity=cache.identity(int(sm)) if cache is not None else None, probe=False,
                  restored=set())
    try:
        memo = LaunchMemo(cache, launch_context(kernel_files, int(sm), cache), root) if cache is not None else None
        result = _precompile(plan, kernel_manifest, importer, session, objects, int(sm), scratch,
                             worker_tmp, progress, cache, memo)
    except Exception as exc:  # noqa: BLE001 - the plan is written with source only
        return _skipped(f"ahead-of-time compilation failed: {one_line(exc)}")
    finally:
        ACTIVE.update(cache=None, identity=None, probe=False, restored=set())
        _forget_package(root, importer)
        shutil.rmtree(work, ignore_errors=True)
    if cache is not None:
        try:
            if rkey is not None and result.summary.get("status") == "ok":
                cache.put_json("results-v1", rkey, {"manifest": result.manifest, "summary": result.summary})
            cache.trim()
        except OSError:
            pass
    return result


# ----------------------------------------------------------------------------- whole results from the cache

def _cached_result(cache, rkey: str, sm: int, progress) -> AotResult | None:
    """The earlier result stored under `rkey`, its binaries taken from the cache and checked
    against the manifest's sha256 (None: not there, or a binary is missing or damaged)."""
    got = cache.get_json("results-v1", rkey)
    if not isinstance(got, dict) or not isinstance(got.get("manifest"), dict):
        return None
    man, summary = got["manifest"], got.get("summary") or {}
    bin_dir = summary.get("dir")
    ident = cache.identity(sm)
    files: dict[str, bytes] = {}
    for e in man.get("entries") or []:
        members = cache.get("bin-v1", binary_cache.kernel_key(e["dir"], f"{e['name']}.json", ident)) or {}
        for name, sha in e["files"].items():
            data = members.get(name)
            if name.startswith("__grp__"):
                keep = sorted(c for c in e["files"] if not c.startswith("__grp__"))
                data = json.dumps({"child_paths": {c: c for c in keep}}, sort_keys=True).encode()
            if data is None or hashlib.sha256(data).hexdigest() != sha:
                return None
            files[f"{bin_dir}/{e['dir']}/{name}"] = data
    text = json.dumps(man, sort_keys=True, indent=1) + "\n"
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != summary.get("manifest_sha256"):
        return None
    files[f"{bin_dir}/manifest.json"] = text.encode("utf-8")
    n = len(man.get("entries") or [])
    if progress is not None:
        progress(f"binaries {n}/{n} ({n} cached)")
    return AotResult(dict(sorted(files.items())), dict(summary), man)


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


def column_parameters(plan: Mapping[str, Any], kernel_files: Mapping[str, str], objects: Mapping[str, Any],
                      sm: int, cache: binary_cache.BinaryCache | None = None, required: bool = True,
                      plan_text: str | None = None) -> dict[str, list[str]]:
    """The column-count discovery (the default with binaries; codegen/column_specialization.py): the
    prefill extents' launches reproduced (nothing compiled) and, per kernel only prefill extents
    launch, the integer parameters whose specialisation class varies between them. The kernels a
    decode or verify extent launches are read from the plan (`steady_kernels`) and keep their
    specialisation, so those extents' launches are not reproduced. With a binary cache the answer is
    kept (`columns-v1`, keyed like a whole result, by the whole plan: a repeat compile skips the
    reproduction) and remembered launches replay (`launch-v1`). `required`
    (--no-column-specialization): where the launches cannot be reproduced, an error; else ({}) every
    specialisation is kept. `plan_text`: as `precompile`'s."""
    from .column_specialization import OPTION, varying_parameters

    key = None
    if cache is not None:  # before the toolchain check, which imports the runtime (and torch)
        try:
            key = result_key(plan, kernel_files, objects, int(sm), cache, plan_text)
            got = cache.get_json("columns-v1", key)
        except OSError:
            got = None
        if isinstance(got, dict) and isinstance(got.get("kernels"), dict):
            return {str(k): [str(p) for p in v] for k, v in got["kernels"].items()}
    problem = toolchain_problem(sm)
    if problem:
        if not required:  # the default: keep every specialisation
            return {}
        raise CompileError(f"{OPTION} needs the launches reproduced, which cannot be done here: {problem}")
    root = _root_name(kernel_files)
    importer, session = MemoryImporter(root, kernel_files), Session(root)
    work = tempfile.mkdtemp(prefix=f"ninfer-aot-{os.getpid()}-")
    try:
        memo = LaunchMemo(cache, launch_context(kernel_files, int(sm), cache), root) if cache is not None else None
        with environment(int(sm), work, session.hook):
            try:
                _reproduce(plan, json.loads(kernel_files["kernels/manifest.json"]), importer, session, objects,
                           int(sm), fake_tensors(), memo=memo, phases={"prefill"})
            finally:
                _leave_meta_path(importer)
        out = varying_parameters(session.captures.values(), root, keep=steady_kernels(plan, kernel_files))
    except Exception as exc:  # noqa: BLE001 - the default keeps every specialisation; the binary
        if not required:      # compile that follows meets (and reports) the same failure
            return {}
        raise CompileError(f"{OPTION}: reproducing the launches failed: {one_line(exc)}") from None
    finally:
        _forget_package(root, importer)
        shutil.rmtree(work, ignore_errors=True)
    if cache is not None and key is not None:
        try:
            cache.put_json("columns-v1", key, {"kernels": out})
        except OSError:
            pass
    return out


def steady_kernels(plan: Mapping[str, Any], kernel_files: Mapping[str, str]) -> set[str]:
    """The kernels ("module:kernel", emitted package path) a decode or verify extent launches: their
    column counts stay specialised (their code is the default plan's; only prefill-only kernels change)."""
    routes = json.loads(kernel_files["kernels/manifest.json"])["routes"]
    return {k for ext in plan["extents"].values() if ext.get("phase") != "prefill"
            for launch in ext["launches"] if launch.get("route") in routes
            for k in routes[launch["route"]]["kernels"]}


def _leave_meta_path(importer) -> None:
    if importer in sys.meta_path:
        sys.meta_path.remove(importer)


def _reproduce(plan, kernel_manifest, importer, session, objects, sm, fake, progress=None, memo=None, phases=None):
    """(engine, unbound launches): the kernel package imported fresh, the launches of every extent
    (`phases`: of the extents of those phases) reproduced (inside `environment`; the importer is left
    on sys.meta_path: the caller removes it, `_leave_meta_path`, once nothing imports from the
    package any more)."""
    from ninfer_runtime.triton_cache import hash_in_canonical_order, kernel_modules

    root = session.root
    for f in importer.filenames():
        linecache.cache.pop(f, None)
    for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, importer)
    importlib.import_module(root)
    # the runtime hashes in the same order before preloading (Triton < 3.7 keys depend on it)
    hash_in_canonical_order(root, kernel_modules(kernel_manifest))
    if progress is not None:
        progress("binaries: reproducing the launches")
    with fake.AllocMode():
        engine = aot_engine(plan, kernel_manifest, root, objects, sm, fake)
        return engine, reproduce_launches(engine, session, fake.AotTensor, memo, phases)


def _precompile(plan, kernel_manifest, importer, session, objects, sm, scratch, worker_tmp,
                progress=None, cache=None, memo=None) -> AotResult:
    from ninfer_runtime.triton_cache import BIN_DIR, BIN_FORMAT

    fake = fake_tensors()
    root = session.root
    with environment(sm, scratch, session.hook, store_manager_class()) as triton:
        try:
            engine, unbound = _reproduce(plan, kernel_manifest, importer, session, objects, sm, fake, progress, memo)
            # compile every distinct specialisation, through the path the runtime replays
            session.compiling = True
            stage_dir = os.path.join(os.path.dirname(scratch), "stages")  # inside the compile's work dir
            os.mkdir(stage_dir)
            with shared_stages(stage_dir):
                compiled, failed, n_cached = compile_captures(list(session.captures.values()), root, worker_tmp,
                                                              progress, cached=cache is not None)
        finally:
            _leave_meta_path(importer)
        files, entries, unharvested = harvest(compiled, root, BIN_DIR)
        failed += unharvested
        if cache is not None:
            publish(cache, files, entries, BIN_DIR, ACTIVE["identity"])
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
