"""The match set to tune: every (family, match) the compiler will present to the route table for
one model, with the operand shapes needed to rebuild the op on the GPU.

The set is derived the way `compile` derives it, so the tuner measures exactly what selection
will ask for: the contract is lowered (one prefill and one decode extent, text and MTP graphs,
once per KV dtype), weights are bound (`bind_weights`, contract-only or against an artifact's
directory) and fused (`fuse`); every family op then contributes `select_routes.op_match(...)`.
Only dimensions are read — never weight bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import NinferError

DEFAULT_MODEL = "qwen3.6-27b"
KV_DTYPES = ("bf16", "int8")

@dataclass
class MatchCase:
    """One match to measure. `match` is the op's full match (op_match: format, n, k, epilogue,
    phase, kv_dtype, head_dim, ...); `shapes` the example op's operand shapes (leading dim = the
    example extent's T, replaced by each T point); `attrs` its attributes (eps, rotary_dim, ...)."""

    family: str
    match: Mapping[str, Any]
    shapes: Mapping[str, tuple[int, ...]]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    op: str = ""  # an example op name (e.g. l0.mlp.gate_up)
    ops: tuple[str, ...] = ()  # every op name (first extent) presenting this match

    @property
    def key(self) -> str:
        return self.family + " " + match_text(self.match)

    @property
    def phase(self) -> str | None:
        return self.match.get("phase")


def match_text(match: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(match.items())) + "}"


def tunable() -> tuple[str, ...]:
    """The families the tuner can build on the GPU: those whose `kernels/<folder>/tune.py` declares
    a TuneSpec with a builder (table order)."""
    from ..kernels.tuning import tunable_families

    return tunable_families()


def family_aliases() -> dict[str, tuple[str, ...]]:
    """`--families` groups (TuneSpec `group`: the kernel folder names, e.g. `gdn`, `norms`) and `all`."""
    from ..kernels.tuning import family_groups

    return family_groups()


def parse_families(text: str | None) -> tuple[str, ...]:
    """`linear,gdn,attention` -> family names (groups expanded); unknown names are an error."""
    names_all = tunable()
    if not text:
        return names_all
    groups = family_aliases()
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        names = groups.get(part, (part,))
        for n in names:
            if n not in names_all:
                raise NinferError(f"--families: {part!r} is not a tunable family (tunable: "
                                  f"{', '.join(names_all)}; groups: {', '.join(groups)})")
            if n not in out:
                out.append(n)
    if not out:
        raise NinferError("--families: empty list")
    return tuple(out)


def load_model(artifact: str | Path | None = None, contract: str | Path | None = None):
    """(spec, objects, description). With an artifact: its contract (`--contract` first, as
    `compile` finds it), resolved for the artifact's parts, and its directory (formats/shapes
    of the stored objects). Without: the contract (a path or model id; default qwen3.6-27b)."""
    from ..contracts import find_contract, load_contract

    if artifact is not None:
        from ..artifact import Artifact

        with Artifact.open(artifact) as art:
            con = find_contract(art.path, art.model_id, contract)
            spec = con.resolve_for(art)
            objects = dict(art.by_name)
            return spec, objects, f"artifact {Path(artifact).name} ({art.model_id})"
    src = contract if contract is not None else DEFAULT_MODEL
    con = load_contract(str(src) if isinstance(src, Path) else src)
    return con.resolve(), None, f"contract {con.model_id}"


def derive_match_set(spec, objects: Mapping[str, Any] | None = None,
                     kv_dtypes: Sequence[str] = KV_DTYPES,
                     families: Iterable[str] | None = None,
                     notes: list[str] | None = None) -> list[MatchCase]:
    """Every distinct (family, match) of the lowered + bound + fused model, in first-seen order
    (prefill extent, then decode, text then MTP). A KV dtype the model cannot use (lowering
    refuses it, e.g. int8 with head_dim 32) is skipped with a line in `notes`."""
    from ..errors import CompileError
    from ..ir.lower import LowerOptions, lower_all
    from ..passes.context import PassContext
    from ..passes.fuse import load_rules
    from ..passes.pipeline import PIPELINE, run_pipeline
    from ..passes.select_routes import op_match

    fams = set(families) if families is not None else None
    steps = [(n, f) for n, f in PIPELINE if n in ("bind_weights", "fuse")]
    # fuse rules marked `tune_plain` (their fused ops select the plain ops' rows, e.g. a folded
    # rmsnorm prologue) are off here: the tuner measures the ops they fuse, as before the rule
    ctx = PassContext(spec=spec, objects=objects, fuse_rules=tuple(
        {**r, "enabled": False} if r.get("tune_plain") else r for r in load_rules()))
    seen: dict[tuple, MatchCase] = {}
    for kvd in kv_dtypes:
        opts = LowerOptions(prefill_chunk=64, concurrency=(1,), draft_tokens=0, max_context=4096,
                            kv_dtype=kvd)
        try:
            graphs = lower_all(spec, opts)
        except CompileError as exc:
            if len(kv_dtypes) == 1:
                raise
            if notes is not None:
                notes.append(f"kv dtype {kvd} skipped: {exc}")
            continue
        for g in graphs:
            g = run_pipeline(g, ctx, pipeline=steps)
            for op in g.ops():
                if not op.is_family or (fams is not None and op.kind not in fams):
                    continue
                m = op_match(g, op)
                key = (op.kind, tuple(sorted((k, repr(v)) for k, v in m.items())))
                if key in seen:
                    c = seen[key]
                    if op.name not in c.ops and len(c.ops) < 512:
                        c.ops = c.ops + (op.name,)
                    continue
                shapes = {k: tuple(int(d) for d in g.tensors[v].shape) for k, v in op.inputs.items()}
                for k, v in op.outputs.items():
                    shapes.setdefault("out:" + k, tuple(int(d) for d in g.tensors[v].shape))
                attrs = {k: v for k, v in op.attrs.items() if isinstance(v, (int, float, str, bool))}
                seen[key] = MatchCase(op.kind, dict(m), shapes, attrs, op.name, (op.name,))
    return list(seen.values())


def generic_match(family: str, match: Mapping[str, Any], routes: Sequence[Any]) -> dict:
    """The match without shape keys: the keys the family's routes restrict (format when any
    route restricts formats, every `extra` key such as phase / kv_dtype / mode) plus the
    epilogue. It is what a hand table pins; ops of other shapes fall back to it."""
    keep: set[str] = set()
    for r in routes:
        if r.domain.formats:
            keep.add("format")
        keep |= set(r.domain.extra)
    if "epilogue" in match:
        keep.add("epilogue")
    return {k: match[k] for k in sorted(match) if k in keep}


def describe(case: MatchCase) -> str:
    """Short human label: `linear Q4G64_F16S 34816x5120 swiglu (l0.mlp.gate_up)`."""
    m = case.match
    parts = [case.family]
    if "format" in m:
        parts.append(str(m["format"]))
    if "n" in m and "k" in m:
        parts.append(f"{m['n']}x{m['k']}")
    elif "n" in m:
        parts.append(f"n={m['n']}")
    for key in ("epilogue", "phase", "kv_dtype", "head_dim", "mode"):
        if key in m and not (key == "epilogue" and m[key] == "none"):
            parts.append(f"{key}={m[key]}" if key in ("head_dim",) else str(m[key]))
    return " ".join(parts) + (f" ({case.op})" if case.op else "")
