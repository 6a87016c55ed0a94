"""Write a plan directory atomically and deterministically.

The files are rendered in memory first (sorted keys, no timestamps, no absolute temp paths), then
written into a fresh temp directory beside the destination, which is swapped into place
(plan/output.py: an atomic exchange, or two renames with a restorable `.old-` tree between them;
the previous plan is removed afterwards). On any error the temp directory is removed and the
destination is untouched: nothing half-written is ever left behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..errors import CompileError
from .integrity import seal_plan_files
from .output import make_temp_dir, plan_problem, swap_into_place


def _render(obj: Any, indent: int, width: int) -> tuple[str, str]:
    """(compact, pretty) renderings of `obj`; each node is rendered once (linear time)."""
    if isinstance(obj, dict) and obj:
        keys = sorted(obj)
        kids = [(_ESC(str(k)), _render(obj[k], indent + 1, width)) for k in keys]
        compact = "{" + ", ".join(f"{k}: {c}" for k, (c, _) in kids) + "}"
        if len(compact) + indent <= width:
            return compact, compact
        pad = " " * (indent + 1)
        return compact, "{\n" + ",\n".join(f"{pad}{k}: {p}" for k, (_, p) in kids) + "\n" + " " * indent + "}"
    if isinstance(obj, (list, tuple)) and obj:
        kids = [_render(v, indent + 1, width) for v in obj]
        compact = "[" + ", ".join(c for c, _ in kids) + "]"
        if len(compact) + indent <= width:
            return compact, compact
        pad = " " * (indent + 1)
        return compact, "[\n" + ",\n".join(f"{pad}{p}" for _, p in kids) + "\n" + " " * indent + "]"
    flat = _scalar(obj)
    return flat, flat


_ESC = json.encoder.encode_basestring_ascii


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _ESC(v)
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"non-finite float {v} in plan")
        return float.__repr__(v)
    return json.dumps(v, sort_keys=True, ensure_ascii=True, allow_nan=False)


def render_json(obj: Any, width: int = 160) -> str:
    """Sorted keys; a value that fits in `width` columns stays on one line (one launch, one tensor
    per line), larger ones are expanded one member per line. Deterministic."""
    return _render(obj, 0, width)[1] + "\n"


def kernels_manifest(manifest: dict[str, Any]) -> str:
    """kernels/routes.json: the routes the plan launches (emission fills this directory later)."""
    return render_json({"routes": manifest.get("used_routes", []), "emitted": []})


def write_plan_files(directory: Path, files: dict[str, str | bytes]) -> None:
    """Write every file (relative path -> text, or bytes for binaries) into the fresh temp
    directory `directory`, in sorted order. The one place plan files reach the disk."""
    for rel, text in sorted(files.items()):
        p = directory / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, (bytes, bytearray, memoryview)):
            p.write_bytes(bytes(text))
            continue
        with open(p, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)


def write_plan(out_dir: Path, manifest: dict[str, Any], memory_txt: str,
               extra_files: dict[str, str | bytes] | None = None) -> Path:
    """Write the plan directory atomically (temp dir + swap, plan/output.py). `extra_files`
    (relative path -> text, or bytes for binaries, e.g. the emitted kernels) are written inside the
    same atomic step. An existing `out_dir` is replaced only if it is a plan (plan_problem)."""
    out_dir = Path(out_dir)
    files = {
        "plan.json": render_json(manifest),
        "memory.txt": memory_txt,
        "kernels/routes.json": kernels_manifest(manifest),
    }
    for rel, text in (extra_files or {}).items():
        if rel in files:
            raise CompileError(f"{out_dir}: two writers for {rel}")
        files[rel] = text
    files = seal_plan_files(manifest, files)  # plan.json gains "integrity": sha256 of its body + every file
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    if not parent.is_dir():
        raise CompileError(f"{out_dir}: parent directory {parent} does not exist")
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise CompileError(f"{out_dir}: exists and is not a directory")
    if out_dir.exists():
        why = plan_problem(out_dir)
        if why is not None:
            raise CompileError(f"{out_dir}: exists and is not a plan written by ninfer-compile ({why}); "
                               f"refusing to replace it")
    try:
        tmp = make_temp_dir(out_dir)
    except OSError as exc:
        raise CompileError(f"{out_dir}: cannot write plan: {exc.strerror or exc}") from None
    try:
        write_plan_files(tmp, files)
        swap_into_place(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CompileError(f"{out_dir}: cannot write plan: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
