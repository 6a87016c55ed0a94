"""Plan integrity: what `plan.json["integrity"]` records and how the runtime checks it.

The record (written by the compiler's `ninfer_compile/plan/integrity.py`, which uses these
definitions so there is exactly one of each):

    "integrity": {"format": "ninfer-integrity-v1",
                  "body_sha256": sha256 of canonical_json(plan without its "integrity" member),
                  "files": {relative path: sha256 of the file's bytes}}

- the *body* is the parsed `plan.json` object minus `integrity`, serialised canonically: JSON with
  sorted keys, separators `,` `:`, ASCII only (`\\uXXXX` escapes), no NaN/Infinity, UTF-8. Hashing
  the parsed object (not the file bytes) lets the record sit inside the file it protects, and it
  is what the runtime actually uses (a duplicate key resolves the same way for both);
- `files` lists every file of the plan directory except `plan.json` (memory.txt, everything under
  kernels/: emitted source, kernels/manifest.json, kernels/bin/** binaries incl. cubins).

`check_plan_integrity` refuses (PlanMismatch, one line naming the file) a plan without a record, a
body that does not match, a listed file missing or different, and a file under kernels/ that is not
listed (kernels/ is imported and served to Triton; `__pycache__/` byte code is the only exception).

Payload digests (`plan.json["artifact"]["payload_sha256"] = {object: sha256 of its payload
bytes}`) are optional: the compiler records them when asked (`ninfer_compile.plan.integrity`),
`verify_weights` checks them (`ninfer-run --verify-weights`). What always binds a plan to an
artifact is the artifact's directory sha256 (names, shapes, formats, offsets); without payload
digests another artifact with the same directory (other weights) is accepted.

Standard library only (the runtime never imports ninfer_compile).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from .errors import PlanError, PlanMismatch

INTEGRITY_FORMAT = "ninfer-integrity-v1"
INTEGRITY_KEY = "integrity"
PAYLOAD_KEY = "payload_sha256"  # in plan["artifact"]
_UNLISTED_OK = ("__pycache__",)  # directory names under kernels/ the check skips
_CHUNK = 16 * 2**20


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("utf-8")


def body_sha256(plan: dict) -> str:
    """sha256 of the canonical JSON of `plan` without its integrity member."""
    body = {k: v for k, v in plan.items() if k != INTEGRITY_KEY}
    try:
        return hashlib.sha256(canonical_json(body)).hexdigest()
    except (TypeError, ValueError) as exc:  # NaN / Infinity in a hand-edited plan
        raise PlanMismatch(f"plan.json: body is not canonical JSON ({exc})") from None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def integrity_record(plan: dict, files: dict[str, bytes]) -> dict:
    """The record for `plan` whose other files are `files` (relative path -> bytes)."""
    return {"format": INTEGRITY_FORMAT, "body_sha256": body_sha256(plan),
            "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}}


def _safe_rel(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts) and rel != "plan.json"


def _listed_tree(plan_dir: Path) -> Iterable[str]:
    """Relative paths of the files under kernels/ (skipping __pycache__ directories)."""
    root = plan_dir / "kernels"
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _UNLISTED_OK)
        for f in sorted(filenames):
            yield (Path(dirpath) / f).relative_to(plan_dir).as_posix()


def check_plan_integrity(plan_dir: Path, plan: dict) -> None:
    """Refuse a plan whose body or files do not match its integrity record (PlanMismatch)."""
    plan_dir = Path(plan_dir)
    pj = plan_dir / "plan.json"
    rec = plan.get(INTEGRITY_KEY)
    if rec is None:
        raise PlanMismatch(f"{pj}: no integrity record (compiled by an older ninfer-compile?); recompile the plan")
    if not isinstance(rec, dict) or rec.get("format") != INTEGRITY_FORMAT or not isinstance(rec.get("files"), dict) \
            or not isinstance(rec.get("body_sha256"), str):
        raise PlanMismatch(f"{pj}: integrity record is malformed (want format {INTEGRITY_FORMAT} with body_sha256 "
                           f"and files)")
    got = body_sha256(plan)
    if got != rec["body_sha256"]:
        raise PlanMismatch(f"{pj}: body sha256 {got[:16]}... does not match its integrity record "
                           f"{str(rec['body_sha256'])[:16]}... (plan.json was edited or damaged after compile)")
    files = rec["files"]
    for rel, sha in sorted(files.items(), key=lambda kv: str(kv[0])):
        if not _safe_rel(rel):
            raise PlanMismatch(f"{pj}: integrity record lists an unsafe path {rel!r}")
        p = plan_dir / rel
        if not p.is_file():
            raise PlanMismatch(f"{p}: missing (listed in plan.json integrity)")
        if file_sha256(p) != sha:
            raise PlanMismatch(f"{p}: sha256 does not match plan.json integrity (edited or damaged after compile)")
    for rel in _listed_tree(plan_dir):
        if rel not in files:
            raise PlanMismatch(f"{plan_dir / rel}: not written by the compiler (absent from plan.json integrity)")


# ----------------------------------------------------------------------------- payload digests
def payload_digests(plan: dict) -> dict[str, str] | None:
    d = (plan.get("artifact") or {}).get(PAYLOAD_KEY)
    return d if isinstance(d, dict) else None


def verify_weights(plan: dict, artifact, names: list[str], progress: bool = True) -> int:
    """Hash every object of `names` (the plan's bound weights) in `artifact` (an ArtifactView)
    against the plan's recorded payload digests; returns the bytes hashed. Refuses (one line) a
    plan compiled without digests, a digest record that misses a bound object, and names the first
    mismatching object (in sorted order)."""
    digests = payload_digests(plan)
    if digests is None:
        raise PlanError("--verify-weights: this plan records no payload digests (record them with "
                        "`python -m ninfer_compile.plan.integrity PLAN --artifact A`)")
    missing = [n for n in names if n not in digests]
    if missing:
        raise PlanMismatch(f"--verify-weights: the plan's payload digests do not cover object {missing[0]!r}")
    total = sum(artifact.objects[n].bytes for n in names if n in artifact.objects)
    bar = byte_bar(total, "verify weights") if progress else None
    try:
        for n in sorted(names):
            if n not in artifact.objects:
                raise PlanMismatch(f"plan references object {n!r}, absent from artifact {artifact.path.name}")
            got = hashlib.sha256(artifact.span(n)).hexdigest()
            if got != digests[n]:
                raise PlanMismatch(f"--verify-weights: object {n!r} of {artifact.path.name}: payload sha256 "
                                   f"{got[:16]}... differs from the plan's {str(digests[n])[:16]}... (other weights "
                                   f"with the same directory)")
            if bar is not None:
                bar.update(artifact.objects[n].bytes)
    finally:
        if bar is not None:
            bar.close()
    return total


def byte_bar(total: int, desc: str):
    """A tqdm progress bar of `total` bytes on stderr, gone when closed (None: tqdm is missing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, leave=False)
