"""Compiling the captured specialisations and writing `kernels/bin/` (the ahead-of-time binary
compile's output): the worker pool, the authoritative compile pass, the binary files and
`kernels/bin/manifest.json`.

Requires: the captures of aot_capture (inside aot_device.environment, so Triton compiles for
the plan's target into the private scratch cache).
Guarantees:
- `compile_captures` compiles every distinct specialisation with `JITFunction.preload` on
  Triton's serialised specialisation (exactly what the runtime replays at load). A first pass in
  this process takes every kernel the binary cache holds (binary_cache.py; `StoreBackedManager`
  copies a verified entry into the scratch cache) and lists the rest; those are compiled in forked,
  interrupt-safe workers (ninfer_compile/workers.py: killed and reaped whatever ends the wait;
  best effort; one per usable core; the long prefill / verify kernels handed out first,
  `pool_order`) that fill the scratch cache, then once more in this process
  (cache hits), which is the pass whose results count. Failures are returned, never raised (an
  interrupt is). `publish` stores the newly compiled binaries in the binary cache.
- `harvest` collects the metadata + cubin of each compiled kernel into `kernels/bin/<cache key>/`
  (group files with relative child paths, see ninfer_runtime/triton_cache.py); `bin_manifest`
  writes the manifest the runtime checks. Both are deterministic: sorted entries, sorted-key JSON,
  specialisations in Triton's own (parameter) order, the private package name replaced by a
  placeholder, so equal inputs give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from .aot_capture import ROOT_PLACEHOLDER, one_line


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers(n: int) -> int:
    """Compile processes: NINFER_AOT_JOBS, else the cores this process may use, at most n
    (Triton's compiler holds the GIL, so parallel compiles need processes)."""
    env = os.environ.get("NINFER_AOT_JOBS")
    try:
        jobs = int(env) if env else usable_cores()
    except ValueError:
        jobs = 1
    return max(1, min(jobs, n, 32))


class Counter:
    """`binaries i/N` progress lines: the first, the last and at most one a second between;
    `(c cached)` appended when a binary cache is in use (`cached` is not None)."""

    def __init__(self, progress, what: str = "binaries", cached: int | None = None, offset: int = 0,
                 total: int | None = None):
        self.progress, self.what, self.last = progress, what, 0.0
        self.cached, self.offset, self.total = cached, offset, total

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            return
        done, total = done + self.offset, self.total or total
        now = time.monotonic()
        if done in (1, total) or now - self.last >= 1.0:
            self.last = now
            tail = "" if self.cached is None else f" ({self.cached} cached)"
            self.progress(f"{self.what} {done}/{total}{tail}")


# ----------------------------------------------------------------------------- the binary cache's Triton side

ACTIVE: dict[str, Any] = {"cache": None, "identity": None, "probe": False, "restored": set()}


class NotCached(LookupError):
    """Raised by the store-backed manager during the probe pass for a kernel nobody holds yet."""


def store_manager_class():
    """Triton's FileCacheManager on the scratch cache, which on a miss first looks in the binary
    cache (ACTIVE["cache"]): a verified entry is copied into the scratch directory and served from
    there. During the probe pass (ACTIVE["probe"]) a kernel neither holds raises NotCached instead
    of compiling."""
    from triton.runtime.cache import FileCacheManager

    class StoreBackedManager(FileCacheManager):
        def get_group(self, filename):
            grp = super().get_group(filename)
            if grp is not None:
                return grp
            cache, ident = ACTIVE["cache"], ACTIVE["identity"]
            if cache is not None and filename.endswith(".json"):
                from .binary_cache import kernel_key

                members = cache.get("bin-v1", kernel_key(self.key, filename, ident))
                if members is not None and filename in members:
                    paths = {name: self.put(data, name, binary=True) for name, data in sorted(members.items())}
                    self.put_group(filename, paths)
                    ACTIVE["restored"].add(self.key)
                    return super().get_group(filename)
            if ACTIVE["probe"]:
                raise NotCached(f"{self.key}/{filename}")
            return None

    return StoreBackedManager


def publish(cache, files: dict[str, bytes], entries: list[dict], bin_dir: str, ident) -> int:
    """Store every harvested kernel the binary cache did not supply. Returns how many were written."""
    from .binary_cache import kernel_key

    n = 0
    for e in entries:
        if e["dir"] in ACTIVE["restored"]:
            continue
        members = {c: files[f"{bin_dir}/{e['dir']}/{c}"] for c in e["files"] if not c.startswith("__grp__")}
        if cache.put("bin-v1", kernel_key(e["dir"], f"{e['name']}.json", ident), members):
            n += 1
    return n


def warm_scratch_in_parallel(recs, specs, root, tmpdir: str, progress=None, counter=None) -> bool:
    """Compile the specialisations in forked worker processes (they inherit the imported kernels,
    the stub driver and the knobs) so the parent's sequential pass only reads the scratch cache.
    Best effort: without fork, or on a pool failure, the parent compiles everything itself.
    Returns whether the workers ran."""
    from ..workers import run_forked

    n = workers(len(recs))
    if n < 2 or not hasattr(os, "fork"):
        return False
    jfs = [r.jf for r in recs]

    def build(i: int) -> None:
        jfs[i].preload(specs[i].replace(ROOT_PLACEHOLDER + ".", root + "."))

    try:
        run_forked(build, len(recs), n, on_done=counter or Counter(progress), tmpdir=tmpdir)
    except Exception:  # noqa: BLE001 - e.g. a broken pipe: the sequential pass compiles what is missing
        return False
    return True


def pool_order(recs, indices: list[int]) -> list[int]:
    """`indices` in the order the pool takes them: kernels first used by a prefill or verify extent
    first (the tensor-core kernels of many columns, which take most of the compile time: 1-5 s of
    CPU each on the 27B against 0.1-0.5 s for a decode kernel), then the rest, each group in capture
    order, so that no long compile starts last while the other workers sit idle."""
    def heavy(i: int) -> bool:
        extent = recs[i].first_use.split("/", 1)[0]
        return "prefill" in extent or "verify" in extent

    return sorted(indices, key=lambda i: (not heavy(i), i))


def normalize_spec(spec: str, root: str) -> str:
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


def entry_kernel_ref(jf, root: str) -> str:
    mod = jf.__module__
    mod = mod[len(root) + 1:] if mod.startswith(root + ".") else ("" if mod == root else mod)
    return f"{mod}:{jf.fn.__qualname__}"


def compile_captures(recs, root: str, worker_tmp: str, progress=None,
                     cached: bool = False) -> tuple[list, list[dict], int]:
    """([(capture, kernel, normalised spec)] compiled, [failure records], how many came from the
    binary cache) for `recs` (Captures). `cached`: a binary cache is active (ACTIVE), probe it first."""
    specs = [normalize_spec(rec.spec, root) for rec in recs]
    kernels: dict[int, Any] = {}
    if cached:  # the probe pass: what the cache holds is loaded now, the rest is compiled below
        ACTIVE["probe"] = True
        try:
            for i, (rec, spec) in enumerate(zip(recs, specs)):
                try:
                    k = rec.jf.preload(spec.replace(ROOT_PLACEHOLDER + ".", root + "."))
                    if k is not None:
                        kernels[i] = k
                except Exception:  # noqa: BLE001 - NotCached, or a failure the last pass records
                    pass
        finally:
            ACTIVE["probe"] = False
    n_cached = len(kernels)
    missing = [i for i in range(len(recs)) if i not in kernels]
    total = len(recs)
    counter = Counter(progress, cached=n_cached if cached else None, offset=n_cached, total=total)
    if n_cached and progress is not None:
        Counter(progress, cached=n_cached, total=total)(n_cached, total)
    order = pool_order(recs, missing)
    warmed = bool(missing) and warm_scratch_in_parallel(  # fills the scratch cache
        [recs[i] for i in order], [specs[i] for i in order], root, worker_tmp, counter=counter)
    count = Counter(None if warmed else progress, cached=n_cached if cached else None, offset=n_cached,
                    total=total)
    compiled, failed = [], []
    for j, i in enumerate(missing, start=1):  # the authoritative pass for the rest
        rec, spec = recs[i], specs[i]
        count(j, len(missing))
        try:
            kernel = rec.jf.preload(spec.replace(ROOT_PLACEHOLDER + ".", root + "."))
            if kernel is None:
                raise RuntimeError("Triton returned no kernel")
            kernels[i] = kernel
        except Exception as exc:  # noqa: BLE001 - left to the JIT
            failed.append({"kernel": entry_kernel_ref(rec.jf, root), "first_use": rec.first_use,
                           "reason": one_line(exc)})
    compiled = [(recs[i], kernels[i], specs[i]) for i in range(len(recs)) if i in kernels]
    return compiled, failed, n_cached


def harvest(compiled, root: str, bin_dir: str) -> tuple[dict[str, bytes], list[dict], list[dict]]:
    """(binary files by plan-relative path, sorted manifest entries, failures) of the compiled kernels."""
    files: dict[str, bytes] = {}
    entries, failed = [], []
    for rec, kernel, spec in compiled:
        group = dict(kernel.metadata_group)
        meta = sorted(c for c in group if c.endswith(".json"))
        has_cubin = any(c.endswith(".cubin") for c in group)
        if len(meta) != 1 or not has_cubin:
            failed.append({"kernel": entry_kernel_ref(rec.jf, root), "first_use": rec.first_use,
                           "reason": f"no cubin/metadata in Triton's output ({sorted(group)})"})
            continue
        keydir = Path(group[meta[0]]).parent.name
        keep = sorted(c for c in group if c.endswith((".json", ".cubin")))
        efiles = {}
        for c in keep:
            data = Path(group[c]).read_bytes()
            files[f"{bin_dir}/{keydir}/{c}"] = data
            efiles[c] = hashlib.sha256(data).hexdigest()
        grp = json.dumps({"child_paths": {c: c for c in keep}}, sort_keys=True).encode()
        gname = f"__grp__{meta[0]}"
        files[f"{bin_dir}/{keydir}/{gname}"] = grp
        efiles[gname] = hashlib.sha256(grp).hexdigest()
        md = json.loads(files[f"{bin_dir}/{keydir}/{meta[0]}"])
        entries.append({"dir": keydir, "kernel": entry_kernel_ref(rec.jf, root), "name": meta[0][:-5],
                        "files": efiles, "specialization": spec, "launches": rec.launches,
                        "first_use": rec.first_use, "num_warps": md.get("num_warps"),
                        "num_stages": md.get("num_stages"), "shared": md.get("shared")})
    entries.sort(key=lambda e: (e["kernel"], e["dir"], e["specialization"]))
    return files, entries, failed


def bin_manifest(triton_version: str, sm: int, prefill_cols: list[int], entries: list[dict],
                 failed: list[dict], unbound: dict[tuple, dict]) -> dict[str, Any]:
    """kernels/bin/manifest.json: what the runtime checks before using the binaries."""
    from ninfer_runtime.triton_cache import BIN_FORMAT, backend_digest, cache_env, triton_build_digest

    from .binary_cache import ptxas_version

    return {
        "format": BIN_FORMAT,
        "triton": triton_version,
        "triton_key": triton_build_digest(),
        "backend": backend_digest(sm),
        "ptxas": ptxas_version(sm),
        "target": {"backend": "cuda", "arch": sm, "warp_size": 32},
        "sm": sm,
        "env": cache_env(),
        "prefill_columns": prefill_cols,
        "entries": entries,
        "failed": sorted(failed, key=lambda f: (f["kernel"], f["first_use"])),
        "unbound": sorted(unbound.values(), key=lambda u: (str(u["route"]), u["first"])),
    }
