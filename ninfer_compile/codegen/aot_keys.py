"""The binary cache keys of the ahead-of-time compile (codegen/aot.py): a whole result's and a
remembered launch's context.

Requires: a binary cache (`cache.identity(sm)`: the toolchain facts); the runtime package
locatable (its code is hashed, never imported here: importing it would import torch).
Guarantees:
- `result_key(plan, kernel_files, objects, sm, cache)`: everything the capture and the compile
  read (the plan, the emitted source, the artifact's object table, the sm, the toolchain, the
  capture code and the environment); the key of `results-v1` and `columns-v1` entries.
  `plan_text`: the plan as `plan_json` writes it, when the caller already has it: a compile asks
  for two keys of one plan (the column-count discovery's and the binaries'), and serialising a
  plan of 18 extents takes ~0.3 s. The key is the same either way.
- `launch_context(kernel_files, sm, cache)`: the context of remembered launches (launch-v1).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from . import binary_cache

# environment variables that cannot change a binary compile's output (everything else named
# NINFER_* / TRITON_* enters the result key)
_ENV_IGNORED = ("NINFER_AOT_JOBS", "NINFER_AOT_STRICT", "TRITON_CACHE_DIR", "TRITON_HOME", "NINFER_SIGNAL_TEST")


_CODE_DIGESTS: dict[tuple, str] = {}  # the files' (path, size, mtime) -> their digest (read once per process)


def _code_digest() -> str:
    """sha256 of the code a capture runs: the runtime package and this compiler's aot*.py."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, n) for n in sorted(os.listdir(here)) if n.startswith(("aot", "binary_cache"))
             and n.endswith(".py")]
    spec = importlib.util.find_spec("ninfer_runtime")  # located, not imported (that would import torch)
    rt = os.path.dirname(os.path.abspath(spec.origin))
    for d, _, names in sorted(os.walk(rt)):
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
    stamp = tuple((f, st.st_size, st.st_mtime_ns) for f in files for st in (os.stat(f),))
    if stamp not in _CODE_DIGESTS:
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                h.update(os.path.relpath(f, os.path.dirname(rt)).encode() + b"\0" + fh.read() + b"\0")
        _CODE_DIGESTS[stamp] = h.hexdigest()
    return _CODE_DIGESTS[stamp]


def _process_context(sm: int, cache) -> dict[str, Any]:
    """What a capture reads besides the plan: the capture code, the toolchain, torch, sm, environment."""
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("NINFER_", "TRITON_")) and k not in _ENV_IGNORED}
    return {"format": binary_cache.STORE_FORMAT, "sm": sm, "identity": cache.identity(sm), "code": _code_digest(),
            "torch": torch_version, "env": env}


def _file_digests(kernel_files, python_only: bool = False) -> dict[str, str]:
    return {rel: hashlib.sha256(t if isinstance(t, bytes) else t.encode("utf-8")).hexdigest()
            for rel, t in sorted(kernel_files.items()) if not python_only or rel.endswith(".py")}


def plan_json(plan: Mapping[str, Any]) -> str:
    """The plan's JSON as `binary_cache.digest` writes it (what `result_key`'s `plan_text` takes)."""
    return binary_cache.canonical_json(plan)


def result_key(plan, kernel_files, objects, sm: int, cache, plan_text: str | None = None) -> str:
    """The key of a whole binary-compile result: everything the capture and the compile read.
    `plan_text`: `plan_json(plan)`, if the caller has it (the same key, without serialising again)."""
    objs = sorted((name, repr(o)) for name, o in objects.items())
    fields = {**_process_context(sm, cache), "what": "result", "kernel_files": _file_digests(kernel_files),
              "objects": binary_cache.digest(objs)}
    return _digest_with(fields, "plan", plan_json(plan) if plan_text is None else plan_text)


def _digest_with(fields: Mapping[str, Any], name: str, text: str) -> str:
    """binary_cache.digest({**fields, name: value}), `text` being the value's canonical JSON: the
    top-level object written member by member, sorted and compact, as json.dumps writes it."""
    members = {k: binary_cache.canonical_json(v) for k, v in fields.items()}
    members[name] = text
    body = ",".join(f"{json.dumps(k)}:{members[k]}" for k in sorted(members))
    return hashlib.sha256(("{" + body + "}").encode("utf-8")).hexdigest()


def launch_context(kernel_files, sm: int, cache) -> str:
    """The context of remembered launches (aot_capture.LaunchMemo): everything a launcher reads
    besides its arguments, i.e. the kernel package's Python source and the process context (not
    the plan, the route manifest or the artifact, which reach a launcher only through its arguments)."""
    return binary_cache.digest({**_process_context(sm, cache), "what": "launch",
                                "python": _file_digests(kernel_files, python_only=True)})


