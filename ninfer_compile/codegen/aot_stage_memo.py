"""Identical LLVM IR compiled once: Triton's ptx and cubin stages shared between the specialisations
of one ahead-of-time compile.

Distinct specialisations of a kernel (an integer argument's `== 1` / divisibility, a pointer's
alignment) often lower to byte-identical LLVM IR once the optimiser has used or dropped the hint:
7 of the 70 binaries of the 27B plan repeat another's LLVM IR, and so its PTX and cubin. The two
last stages are pure functions of their input text, the compile options and the process's Triton
knobs, so a repeat takes the earlier output instead of running LLVM's NVPTX back end and ptxas
again.

Requires: Triton's CUDA backend; used inside aot_device.environment (one process tree, one target,
knobs fixed for the compile), `memo_dir` private to that compile (aot.py's work directory, removed
with it).
Guarantees: `shared_stages(memo_dir)` patches `CUDABackend.add_stages` for the duration of the
block (restored on exit) so that the "ptx" and "cubin" stages look up
sha256(stage, target, options, input) in `memo_dir` first and store what they compute (written to
a temporary file and renamed: forked workers share the directory safely; a worker killed mid-write
leaves no partial entry). A hit returns exactly the bytes the stage returned before and repeats its
one metadata side effect (the ptx stage's kernel `name`, read from the PTX as Triton reads it).
Triton's cache key is not touched (the stage list is not part of it), so binaries, keys and plans
are byte-identical to a compile without the memo.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile

_MEMO_STAGES = ("ptx", "cubin")
_ENTRY = re.compile(r".visible .entry ([a-zA-Z_][a-zA-Z0-9_]*)")  # Triton's make_ptx reads the name so


def _key(ext: str, target, options, src) -> str:
    data = src if isinstance(src, bytes) else str(src).encode("utf-8")
    h = hashlib.sha256(f"{ext}\0{target!r}\0{options!r}\0".encode("utf-8"))
    h.update(data)
    return h.hexdigest()


def _memoised(stage, ext: str, target, options, memo_dir: str):
    def run(src, metadata):
        path = os.path.join(memo_dir, f"{_key(ext, target, options, src)}.{ext}")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = None
        if data is not None:
            if ext == "cubin":
                return data
            text = data.decode("utf-8")
            names = _ENTRY.findall(text)
            if len(names) == 1:
                metadata["name"] = names[0]
                return text
        out = stage(src, metadata)
        raw = out if isinstance(out, bytes) else out.encode("utf-8")
        try:
            fd, tmp = tempfile.mkstemp(dir=memo_dir, suffix=".part")
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, path)
        except OSError:  # best effort: the memo only saves time
            pass
        return out

    return run


@contextlib.contextmanager
def shared_stages(memo_dir: str):
    """Within the block, Triton's ptx and cubin stages reuse outputs for identical inputs (module docstring)."""
    from triton.backends.nvidia.compiler import CUDABackend

    original = CUDABackend.add_stages

    def add_stages(self, stages, options, language):
        original(self, stages, options, language)
        for ext in _MEMO_STAGES:
            if ext in stages:
                stages[ext] = _memoised(stages[ext], ext, self.target, options, memo_dir)

    CUDABackend.add_stages = add_stages
    try:
        yield
    finally:
        CUDABackend.add_stages = original
