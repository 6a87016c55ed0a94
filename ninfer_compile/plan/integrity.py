"""The compiler's side of plan integrity (issue 10 §4). The format and the checks are documented in
the runtime's `ninfer_runtime/integrity.py`; the few lines that compute the record are repeated here
rather than imported, because importing any `ninfer_runtime` module runs its package `__init__`,
which switches Triton to interpreter mode on a machine without a GPU and would stop the compile's
ahead-of-time binaries (tests/plan/test_integrity.py checks that both sides agree).

- `seal_plan_files(manifest, files)`: called by `write_plan` once every file of the plan is known;
  returns the files with `plan.json` rendered from the manifest plus its `integrity` member (sha256
  of the canonical body and of every other file: memory.txt, kernels/** incl. kernels/bin cubins).
- Payload digests: `weight_digests(artifact, manifest)` hashes the payload of every object the
  plan binds (reading those bytes: seconds per GB, so never by default; a sparse header-only
  artifact is said to be one), `add_weight_digests(manifest, digests)` records them as
  `manifest["artifact"]["payload_sha256"]`; `ninfer-run --verify-weights` checks them.
- `python -m ninfer_compile.plan.integrity PLAN --artifact A`: records payload digests into an
  existing plan (its integrity and directory hash checked first; plan.json replaced atomically,
  the same bytes a compile with digests writes).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import CompileError, NinferError

INTEGRITY_FORMAT = "ninfer-integrity-v1"  # = ninfer_runtime.integrity.INTEGRITY_FORMAT
INTEGRITY_KEY = "integrity"
PAYLOAD_KEY = "payload_sha256"  # in manifest["artifact"]


def canonical_json(obj: Any) -> bytes:
    """= ninfer_runtime.integrity.canonical_json."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("utf-8")


def body_sha256(plan: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a parsed plan without its integrity member."""
    return hashlib.sha256(canonical_json({k: v for k, v in plan.items() if k != INTEGRITY_KEY})).hexdigest()


def integrity_record(parsed_body: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    return {"format": INTEGRITY_FORMAT, "body_sha256": body_sha256(parsed_body),
            "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}}


def _as_bytes(data: str | bytes | bytearray | memoryview) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def seal_plan_files(manifest: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """`files` (relative path -> text or bytes, incl. "plan.json" = render_json(manifest), as
    `write_plan` renders it) with plan.json replaced by the rendering of `manifest` + its integrity
    record. The caller's manifest is not changed."""
    from .writer import render_json

    body = {k: v for k, v in manifest.items() if k != INTEGRITY_KEY}
    text = files.get("plan.json")
    if not isinstance(text, str) or INTEGRITY_KEY in manifest:
        text = render_json(body)
    others = {rel: _as_bytes(data) for rel, data in files.items() if rel != "plan.json"}
    # the body hash is over the object the runtime will parse (tuples -> lists, int keys ->
    # strings): parse the body's own rendering (C json: cheap) instead of normalising by hand
    record = integrity_record(json.loads(text), others)
    sealed = dict(files)
    sealed["plan.json"] = _render_sealed(body, record, text)
    return sealed


def _render_sealed(body: dict[str, Any], record: dict[str, Any], body_text: str | None = None) -> str:
    """render_json({**body, "integrity": record}). With `body_text` (= render_json(body)) the record's
    member is spliced into it at its sorted place, which is what render_json produces for an object
    rendered one member per line, without rendering the (megabytes of) body again."""
    from .writer import _render, render_json

    if body_text is None or not body_text.startswith("{\n") or not body_text.endswith("\n}\n"):
        return render_json({**body, INTEGRITY_KEY: record})
    member = f" {json.dumps(INTEGRITY_KEY)}: {_render(record, 1, _WIDTH)[1]}"
    decoder = json.JSONDecoder()
    pos = 2  # after "{\n": each top-level member starts on a line with one space then its key
    while True:
        key, key_end = decoder.raw_decode(body_text, pos + 1)
        if key > INTEGRITY_KEY:
            return body_text[:pos] + member + ",\n" + body_text[pos:]
        nxt = body_text.find(',\n "', key_end)  # deeper members are indented by two or more spaces
        if nxt == -1:
            return body_text[:-3] + ",\n" + member + "\n}\n"
        pos = nxt + 2


_WIDTH = 160  # render_json's default width (write_plan renders with it)


# ----------------------------------------------------------------------------- payload digests
def bound_objects(manifest: dict[str, Any]) -> list[str]:
    """The artifact objects the plan's launches reference (sorted)."""
    names = set()
    sections = [manifest, *((manifest.get("tensor_parallel") or {}).get("ranks") or [])]  # --tp: every rank
    for x in (x for sec in sections for x in (sec.get("extents") or {}).values()):
        for L in x.get("launches", []):
            for ref in list((L.get("args") or {}).values()) + list((L.get("outs") or {}).values()):
                if isinstance(ref, dict) and "weight" in ref:
                    names.add(ref["weight"])
    return sorted(names)


def is_sparse(path: Path) -> bool:
    """True when most of the file is holes (a header-only test artifact)."""
    st = os.stat(path)
    blocks = getattr(st, "st_blocks", None)
    return blocks is not None and st.st_size > 2**20 and blocks * 512 < st.st_size // 2


def weight_digests(artifact_path: Path, manifest: dict[str, Any], *, progress: bool = True,
                   out=None) -> dict[str, str]:
    """sha256 of the payload of every object the plan binds (tqdm progress on stderr)."""
    from ..artifact.reader import Artifact

    out = out or sys.stderr
    names = bound_objects(manifest)
    with Artifact.open(artifact_path) as art:
        if art.directory_sha256() != (manifest.get("artifact") or {}).get("directory_sha256"):
            raise CompileError(f"{artifact_path}: not the artifact this plan was compiled for (directory sha256)")
        if is_sparse(Path(artifact_path)):
            print(f"warning: {artifact_path} is a sparse (header-only) artifact: its payload digests hash holes "
                  f"(zeros), not weights", file=out)
        total = sum(art.by_name[n].bytes for n in names)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="weight digests", file=out, leave=False)
        digests = {}
        try:
            for n in names:
                if n not in art.by_name:
                    raise CompileError(f"{artifact_path}: the plan binds object {n!r}, absent from the artifact")
                digests[n] = hashlib.sha256(art.span(n)).hexdigest()
                if bar is not None:
                    bar.update(art.by_name[n].bytes)
        finally:
            if bar is not None:
                bar.close()
    return digests


def add_weight_digests(manifest: dict[str, Any], digests: dict[str, str]) -> dict[str, Any]:
    """A copy of `manifest` with `artifact.payload_sha256` = digests (sorted by name)."""
    out = copy.deepcopy({k: v for k, v in manifest.items() if k != INTEGRITY_KEY})
    out.setdefault("artifact", {})[PAYLOAD_KEY] = dict(sorted(digests.items()))
    return out


def record_weight_digests(plan_dir: Path, artifact_path: Path, *, progress: bool = True) -> int:
    """Add payload digests to an existing plan (checked first); returns the number of objects."""
    from ninfer_runtime.errors import NinferRuntimeError
    from ninfer_runtime.integrity import check_plan_integrity

    plan_dir = Path(plan_dir)
    pj = plan_dir / "plan.json"
    try:
        plan = json.loads(pj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompileError(f"{pj}: cannot read: {exc}") from None
    if not isinstance(plan, dict):
        raise CompileError(f"{pj}: not a plan manifest")
    try:
        check_plan_integrity(plan_dir, plan)
    except NinferRuntimeError as exc:
        raise CompileError(str(exc)) from None
    digests = weight_digests(artifact_path, plan, progress=progress)
    body = add_weight_digests(plan, digests)
    rec = dict(plan[INTEGRITY_KEY])
    from .writer import render_json

    body_text = render_json(body)
    rec["body_sha256"] = body_sha256(json.loads(body_text))
    text = _render_sealed(body, rec, body_text)
    fd, tmp = tempfile.mkstemp(prefix=".plan.json.tmp-", dir=plan_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, pj)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(digests)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ninfer_compile.plan.integrity",
                                description="Record the sha256 of every payload a plan binds into its plan.json "
                                            "(checked by ninfer-run --verify-weights). Reads those payloads in full.")
    p.add_argument("plan", type=Path, help="plan directory written by ninfer-compile")
    p.add_argument("--artifact", type=Path, required=True, help="the .ninfer artifact the plan was compiled for")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        n = record_weight_digests(args.plan, args.artifact, progress=not args.quiet)
    except NinferError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or args.plan}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    print(f"{args.plan}: recorded payload sha256 of {n} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
