"""Write a plan directory atomically and deterministically.

The files are rendered in memory first (sorted keys, no timestamps, no absolute temp paths), then
written into a fresh temp directory beside the destination, which is renamed into place (an
existing plan is swapped out and removed only after the rename). On any error the temp directory is
removed and the destination is untouched: nothing half-written is ever left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import CompileError


def _compact(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(", ", ": "), ensure_ascii=True, allow_nan=False)


def _render(obj: Any, indent: int, width: int) -> str:
    flat = _compact(obj)
    if len(flat) + indent <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=True)}: {_render(obj[k], indent + 1, width)}"
                 for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_render(v, indent + 1, width)}" for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def render_json(obj: Any, width: int = 160) -> str:
    """Sorted keys; a value that fits in `width` columns stays on one line (one launch, one tensor
    per line), larger ones are expanded one member per line. Deterministic."""
    return _render(obj, 0, width) + "\n"


def kernels_manifest(manifest: dict[str, Any]) -> str:
    """kernels/routes.json: the routes the plan launches (emission fills this directory later)."""
    return render_json({"routes": manifest.get("used_routes", []), "emitted": []})


def write_plan(out_dir: Path, manifest: dict[str, Any], memory_txt: str) -> Path:
    out_dir = Path(out_dir)
    files = {
        "plan.json": render_json(manifest),
        "memory.txt": memory_txt,
        "kernels/routes.json": kernels_manifest(manifest),
    }
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    if not parent.is_dir():
        raise CompileError(f"{out_dir}: parent directory {parent} does not exist")
    if out_dir.exists() and not out_dir.is_dir():
        raise CompileError(f"{out_dir}: exists and is not a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    old = None
    try:
        for rel, text in sorted(files.items()):
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not out_dir.exists():
            os.rename(old, out_dir)
        raise CompileError(f"{out_dir}: cannot write plan: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out_dir
