"""The match set to tune: every (family, match) the compiler will present to the route table for
one model, with the operand shapes needed to rebuild the op on the GPU.

The set is derived the way `compile` derives it, so the tuner measures exactly what selection
will ask for: the contract is lowered (one prefill and one decode extent, text and MTP graphs,
once per KV dtype; then one verify extent per draft window K, docs/SPECULATIVE.md), weights are
bound (`bind_weights`, contract-only or against an artifact's directory) and fused (`fuse`); every
family op then contributes `select_routes.op_match(...)`. Only dimensions are read — never weight
bytes.

Verify cases: an op of a verify extent whose match no prefill / decode op presented (the verify
routes, the rollback and acceptance ops) becomes a case per draft window: `window` W = K + 1, and
it is measured at the round sizes T = C x W (C in `tune --verify-rows`), the shapes `compile`
builds for `--concurrency C --draft-tokens K`. The cases of one match (several windows, or a
family's `variant`s: TuneSpec) share the match's rows, picked on their summed timings
(picking.py). An op whose match a prefill / decode op already presented (a linear, a norm) is
that case's op: its routes do not know the phase, and its T points cover the verify T.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import NinferError


DEFAULT_MODEL = "qwen3.6-27b"


def _ir_kv_dtypes() -> tuple[str, ...]:
    from ..ir.lower import KV_DTYPES as names  # every KV cache format the lowering accepts

    return tuple(names)


KV_DTYPES = _ir_kv_dtypes()
DRAFT_TOKENS = (1, 2, 3, 4, 5)  # the draft windows K whose verify extents are derived (W = K + 1)
VERIFY_ROWS = (1, 2, 4, 8)  # the concurrencies C a verify case is measured at (T = C x W)


def case_ident(data: Mapping[str, Any]) -> str:
    """`MatchCase.ident` of a saved case (a dict of a measurement file; older files lack window /
    variant: 0 / "")."""
    return json.dumps([data.get("family"), sorted((data.get("match") or {}).items()),
                       int(data.get("window") or 0), str(data.get("variant") or "")], default=str)


@dataclass
class MatchCase:
    """One match to measure. `match` is the op's full match (op_match: format, n, k, epilogue,
    phase, kv_dtype, head_dim, ...); `shapes` the example op's operand shapes (leading dim = the
    example extent's T, replaced by each T point); `attrs` its attributes (eps, rotary_dim, ...).
    A verify case has `window` W (its T points are C x W; the example extent is C = 1); `variant`
    tells apart cases of one match whose operands differ (TuneSpec `variant`)."""

    family: str
    match: Mapping[str, Any]
    shapes: Mapping[str, tuple[int, ...]]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    op: str = ""  # an example op name (e.g. l0.mlp.gate_up)
    ops: tuple[str, ...] = ()  # every op name (first extent) presenting this match
    window: int = 0  # a verify case: its round width W = K + 1 (T = C x W); 0: prefill / decode
    variant: str = ""  # the family's label of these operand shapes (TuneSpec `variant`; "" = none)
    dtypes: Mapping[str, str] = field(default_factory=dict)  # the example op's operand dtypes

    @property
    def key(self) -> str:
        return self.family + " " + match_text(self.match) + self.suffix

    @property
    def suffix(self) -> str:
        """` W=4` / ` [variant]` when the case is one of several of its match, else ""."""
        return (f" W={self.window}" if self.window else "") + (f" [{self.variant}]" if self.variant else "")

    @property
    def ident(self) -> str:
        """The case's identity across measurement files: family, match, window, variant."""
        return case_ident({"family": self.family, "match": self.match, "window": self.window,
                           "variant": self.variant})

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
                     notes: list[str] | None = None,
                     draft_tokens: Sequence[int] = DRAFT_TOKENS) -> list[MatchCase]:
    """Every distinct (family, match) of the lowered + bound + fused model, in first-seen order
    (prefill extent, then decode, text then MTP, per KV dtype), then the verify cases (module
    docstring) of every draft window K in `draft_tokens` (none when empty). A KV dtype the model
    cannot use (lowering refuses it, e.g. int8 with head_dim 32) is skipped with a line in `notes`."""
    from ..errors import CompileError
    from ..ir.lower import Dims, lower, plan_extents
    from ..passes.context import PassContext
    from ..passes.fuse import load_rules
    from ..passes.pipeline import PIPELINE, run_pipeline

    fams = set(families) if families is not None else None
    steps = [(n, f) for n, f in PIPELINE if n in ("bind_weights", "fuse")]
    rules = load_rules()
    ctx = PassContext(spec=spec, objects=objects, fuse_rules=rules)
    # fuse rules marked `tune_unfused` (a chain_into rule, say: tables without its fused route keep the
    # ops it replaces): the matches of the graph fused without them are measured too
    unfused = PassContext(spec=spec, objects=objects, fuse_rules=tuple(
        {**r, "enabled": False} if r.get("tune_unfused") else r for r in rules)) \
        if any(r.get("tune_unfused") for r in rules) else None
    dims = Dims.from_spec(spec)
    seen: dict[tuple, MatchCase] = {}
    usable: list[str] = []
    for kvd in kv_dtypes:
        opts = _options(kvd, 0)
        try:
            extents = plan_extents(spec, opts)
            graphs = [lower(spec, e, opts, dims) for e in extents]
        except CompileError as exc:
            if len(kv_dtypes) == 1:
                raise
            if notes is not None:
                notes.append(f"kv dtype {kvd} skipped: {exc}")
            continue
        usable.append(kvd)
        for g in graphs:
            _collect(run_pipeline(g, ctx, pipeline=steps), fams, seen, 0)
            if unfused is not None:
                _collect(run_pipeline(g, unfused, pipeline=steps), fams, seen, 0)
    plain = {k[:2] for k in seen}  # (family, match) keys a prefill / decode op presented
    for kvd in usable:
        for k in sorted({int(k) for k in draft_tokens if int(k) > 0}):
            opts = _options(kvd, k)
            try:
                graphs = [lower(spec, e, opts, dims) for e in plan_extents(spec, opts) if e.phase == "verify"]
            except CompileError as exc:
                if notes is not None:
                    notes.append(f"kv dtype {kvd}, draft window K={k}: verify extents skipped: {exc}")
                continue
            for g in graphs:
                for _, fn in steps:  # the passes alone: run_pipeline's graph checks ran in the plain pass
                    g = fn(g, ctx)
                _collect(g, fams, seen, k + 1, plain)
    return list(seen.values())


def _options(kv_dtype: str, k: int):
    from ..ir.lower import LowerOptions

    # one sequence (C = 1): a verify case's T points replace the extent's T (tune --verify-rows)
    return LowerOptions(prefill_chunk=64, concurrency=(1,), draft_tokens=k, max_context=4096, kv_dtype=kv_dtype)


def _collect(g, fams, seen: dict, window: int, plain: set | None = None) -> None:
    """Add the family ops of graph `g` to `seen` (first seen wins; later ops join its `ops`). A verify
    graph (`window` W > 0): ops whose (family, match) is in `plain` join that case; the others are
    keyed by (family, match, W, variant)."""
    from ..kernels.tuning import variant_of
    from ..passes.select_routes import op_match

    for op in g.ops():
        if not op.is_family or (fams is not None and op.kind not in fams):
            continue
        m = op_match(g, op)
        base = (op.kind, tuple(sorted((k, repr(v)) for k, v in m.items())))
        shapes = {k: tuple(int(d) for d in g.tensors[v].shape) for k, v in op.inputs.items()}
        for k, v in op.outputs.items():
            shapes.setdefault("out:" + k, tuple(int(d) for d in g.tensors[v].shape))
        dtypes = {k: str(g.tensors[v].dtype) for k, v in op.inputs.items()}
        attrs = {k: v for k, v in op.attrs.items() if isinstance(v, (int, float, str, bool))}
        variant = variant_of(op.kind, shapes, dtypes, attrs)
        w = 0 if (window and plain is not None and base in plain) else window
        key = base if (w == 0 and not variant) else (*base, w, variant)
        if key in seen:
            c = seen[key]
            if op.name not in c.ops and len(c.ops) < 512:
                c.ops = c.ops + (op.name,)
            continue
        seen[key] = MatchCase(op.kind, dict(m), shapes, attrs, op.name, (op.name,), window=w, variant=variant,
                              dtypes=dtypes)


def verify_points(case: MatchCase, rows: Sequence[int] = VERIFY_ROWS) -> tuple[int, ...]:
    """The T points of a verify case: the round sizes C x W (C in `rows`); () for other cases."""
    if not case.window:
        return ()
    return tuple(sorted({int(c) * case.window for c in rows}))


def timed_in_table(case: MatchCase, data: Mapping[str, Any] | None) -> bool:
    """True when the parsed route table `data` has a group of the case's family pinned to exactly
    its match with measured evidence in some row (`tune --untimed-in`: such cases are skipped)."""
    from ..routes.table import effective_match

    want = effective_match(case.match)
    for g in (data or {}).get(case.family) or []:
        if not isinstance(g, Mapping) or effective_match(dict(g.get("match") or {})) != want:
            continue
        if any(isinstance(r, Mapping) and r.get("evidence") for r in g.get("routes") or []):
            return True
    return False


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
    return " ".join(parts) + case.suffix + (f" ({case.op})" if case.op else "")
