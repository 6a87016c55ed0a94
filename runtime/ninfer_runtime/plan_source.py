"""Where an `Engine`'s plan comes from: a plan directory on disk, or a plan already in memory.

Requires: nothing from ninfer_compile (the runtime never imports the compiler).
Guarantees: `PlanDir(path)` reads PLAN/plan.json + PLAN/kernels/manifest.json and checks the
plan's integrity record and shape (`read_plan`); `check(artifact)` refuses an artifact that is not
the plan's (directory sha256, model id) and emitted kernel files that do not match their sha256;
`import_kernels()` imports PLAN/kernels as a fresh, uniquely named package. `PlanInMemory` is a
plan whose kernels someone has already imported (the compiler's ahead-of-time pass: it rendered
the plan and its kernels from this very artifact a moment ago, so there is nothing to check).
Both expose `plan`, `kernels` (the kernel manifest), `plan_dir` (None in memory) and `binaries_dir`
(where precompiled binaries may be read from; None: none).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from .errors import PlanError, PlanMismatch
from .integrity import check_plan_integrity
from .plan_checks import check_plan_shape

PLAN_FORMAT = "ninfer-plan-v1"
KERNELS_FORMAT = "ninfer-kernels-v1"
_counter = itertools.count()


def read_plan(plan_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    plan_dir = Path(plan_dir)
    pj = plan_dir / "plan.json"
    if not pj.is_file():
        raise PlanError(f"{plan_dir}: not a plan directory (no plan.json)")
    try:
        plan = json.loads(pj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"{pj}: cannot read: {exc}") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise PlanMismatch(f"{pj}: plan format {plan.get('format') if isinstance(plan, dict) else None!r}, "
                           f"this runtime reads {PLAN_FORMAT}")
    check_plan_integrity(plan_dir, plan)
    sections = ("buffers", "extents") if "tensor_parallel" not in plan else ()  # --tp: per rank
    for key in ("model_id", "artifact", "sm", *sections, "options"):
        if key not in plan:
            raise PlanError(f"{pj}: missing {key!r}")
    check_plan_shape(pj, plan)
    km = plan_dir / "kernels" / "manifest.json"
    if not km.is_file():
        raise PlanError(f"{plan_dir}: the plan has no emitted kernels (kernels/manifest.json); recompile it with a "
                        f"compiler that emits kernels")
    try:
        kernels = json.loads(km.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"{km}: cannot read: {exc}") from None
    if not isinstance(kernels, dict) or kernels.get("format") != KERNELS_FORMAT:
        raise PlanMismatch(f"{km}: kernel manifest format {kernels.get('format')!r}, this runtime reads {KERNELS_FORMAT}")
    return plan, kernels


def check_artifact(plan: dict, art) -> None:
    want = plan["artifact"].get("directory_sha256")
    got = art.directory_sha256()
    if want != got:
        raise PlanMismatch(f"artifact {art.path.name} (model {art.model_id}, directory sha256 {got[:16]}...) is not the "
                           f"artifact this plan was compiled for ({plan['artifact'].get('file')}, model "
                           f"{plan['model_id']}, directory sha256 {str(want)[:16]}...)")
    if art.model_id != plan["model_id"]:  # implied by the hash; kept for a clearer message
        raise PlanMismatch(f"artifact model {art.model_id} != plan model {plan['model_id']}")


def check_kernel_files(plan_dir: Path, kernels: dict) -> None:
    for rel, sha in sorted((kernels.get("files") or {}).items()):
        p = Path(plan_dir) / rel
        if not p.is_file():
            raise PlanMismatch(f"{plan_dir}: emitted kernel file {rel} is missing")
        if hashlib.sha256(p.read_bytes()).hexdigest() != sha:
            raise PlanMismatch(f"{plan_dir}: emitted kernel file {rel} does not match its sha256 in kernels/manifest.json")


def used_weights(plan: dict) -> list[str]:
    """The artifact objects the plan's launches reference (sorted)."""
    return sorted({ref["weight"] for x in plan["extents"].values() for L in x["launches"]
                   for ref in list((L.get("args") or {}).values()) + list((L.get("outs") or {}).values())
                   if "weight" in ref})


def import_kernels(plan_dir: Path, kernels: dict):
    """Import PLAN/kernels as a fresh, uniquely named package; returns its name."""
    kdir = (Path(plan_dir) / "kernels").resolve()
    tag = hashlib.sha256(json.dumps(kernels.get("files", {}), sort_keys=True).encode()).hexdigest()[:12]
    name = f"_ninfer_plan_{tag}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, kdir / "__init__.py", submodule_search_locations=[str(kdir)])
    if spec is None or spec.loader is None:
        raise PlanError(f"{kdir}: cannot import the emitted kernels")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        del sys.modules[name]
        raise PlanError(f"{kdir}: importing the emitted kernels failed: {type(exc).__name__}: {exc}") from None
    return name


class PlanDir:
    """A plan directory: read (and integrity-checked) at construction."""

    def __init__(self, plan_dir):
        self.plan_dir = Path(plan_dir)
        self.binaries_dir = self.plan_dir
        self.plan, self.kernels = read_plan(self.plan_dir)

    def check(self, artifact) -> None:
        check_artifact(self.plan, artifact)
        check_kernel_files(self.plan_dir, self.kernels)

    def import_kernels(self) -> str:
        return import_kernels(self.plan_dir, self.kernels)


class PlanInMemory:
    """A plan (plan.json's dict) and its kernel manifest, with the kernels already imported as the
    package `package` (e.g. from the rendered texts, under canonical file names)."""

    plan_dir = None
    binaries_dir = None

    def __init__(self, plan: dict[str, Any], kernels: dict[str, Any], package: str):
        if package not in sys.modules:
            raise PlanError(f"the plan's kernel package {package!r} is not imported")
        self.plan, self.kernels, self.package = plan, kernels, package

    def check(self, artifact) -> None:
        pass  # built from this artifact's objects by the caller; nothing on disk to compare

    def import_kernels(self) -> str:
        return self.package
