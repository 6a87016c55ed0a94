"""Route table schema: YAML with line marks, pydantic models, error formatting.

`read_table_file(path)` + `parse_table_text(...)` read a `routes/smNN.yaml` through `yaml_lines.py` (every
node's line kept; aliases, oversized files and too many nodes refused), refuses duplicate keys, builds plain data, and validates the structure with pydantic
(`extra="forbid"` everywhere). Every error is `FILE:LINE: FIELD: MESSAGE`, LINE being the line of
the offending key / row. Semantic checks against the route registry live in `table.py`.

Shape of a table (DESIGN §5)::

    sm: 90
    provenance: {source: unmeasured, reason: "..."}    # measured | unmeasured | derived
    miss: error                                         # error | nearest
    linear:                                             # one section per op family
      - match: {format: Q4G64_F16S, epilogue: none}     # subset test against the op's match
        routes:
          - {t: [1, 4],    route: q4_gemv, params: {BLOCK_N: 64}}
          - {t: [5, max],  route: q4_gemm, evidence: {8: {q4_gemv: 31.2, q4_gemm: 22.9}}}
    attention:
      - match: {phase: decode, kv_dtype: bf16}
        routes:
          - {t: [1, 64], route: attention_decode_splitkv}
          - {t: [65, max], unsupported: "decode routes take at most 64 columns"}

A row names either a `route` or, explicitly, `unsupported: REASON` (selection there is always a
RouteError quoting the reason) — so every T from 1 to max has a stated outcome.

A table may switch fusion rules off for its sm, each with the reason (the measurement)::

    fuse_off: {qk_norm_rope: "H200 <date>: <what the fused op measured against the ops it replaces> (bench/results/...)"}

A table may say `extends: base.yaml` (a path relative to it): it inherits the base's family
sections, and each of its own groups replaces the base group with the same match (or adds one).
A base file has the family sections and a `provenance` header only (`BaseHeader`). The merge is
table.py's (`load_table`).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import TypeAdapter, ValidationError, field_validator, model_validator

from ..errors import RouteError
from ..kernels.family import family_names, family_specs
from ..yaml_lines import YamlInputError, format_path, parse_yaml_with_lines, read_yaml_bytes

HEADER_KEYS = ("sm", "provenance", "miss", "extends", "fuse_off")

# Match keys every family accepts (integers: n, k); a family's own keys come from its spec
# (`FamilySpec.match_keys` / `int_match_keys`), plus every key a registered route of the family
# restricts in `RouteDomain.extra`.
BASE_MATCH_KEYS: tuple[str, ...] = ("format", "n", "k", "epilogue")
BASE_INT_MATCH_KEYS: tuple[str, ...] = ("n", "k")


def known_families() -> tuple[str, ...]:
    """The families a table may have a section for: every declared family (kernels/*/spec.py)."""
    return family_names()


def family_match_keys(family: str) -> tuple[str, ...]:
    spec = family_specs().get(family)
    return tuple(spec.match_keys) if spec is not None else ()


def int_match_keys(family: str) -> tuple[str, ...]:
    spec = family_specs().get(family)
    return BASE_INT_MATCH_KEYS + (tuple(spec.int_match_keys) if spec is not None else ())


class TableErrors(RouteError):
    """One or more table errors; `.errors` holds each `file:line: field: message` line."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


# --------------------------------------------------------------------------- YAML with lines
class _NodeData:
    """Plain data of a table file with the line of every path (`yaml_lines`: aliases refused, size
    and node count bounded); duplicate keys become errors (the first occurrence is kept)."""

    def __init__(self, name: str, text: str):
        self.name = name
        try:
            doc = parse_yaml_with_lines(text, name)
        except YamlInputError as exc:
            raise TableErrors([f"{name}:{exc.line}: yaml: {exc.problem}"]) from None
        self.data: Any = doc.data
        self.lines: dict[tuple, int] = doc.lines
        self.errors: list[str] = [f"{name}:{line}: {fmt_path(path)}: duplicate key (first at line {first})"
                                  for line, path, first in doc.duplicates]
        self._doc = doc

    def line_of(self, path: tuple) -> int:
        return self._doc.line_of(path)


def fmt_path(path: tuple | list) -> str:
    return format_path(path, top="(top)")


def _real_loc(data: Any, loc: tuple) -> tuple:
    """Keep the components of a pydantic loc that address the data (drop union/type tags); a
    trailing name absent from its mapping (a missing field) is kept for the message."""
    out: list = []
    cur = data
    for i, part in enumerate(loc):
        if isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and isinstance(part, str) and part.lstrip("-").isdigit() \
                and int(part) in cur:
            out.append(int(part))
            cur = cur[int(part)]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and i == len(loc) - 1:
            out.append(part)
    return tuple(out)


def pydantic_errors(doc: _NodeData, exc: ValidationError, prefix: tuple, data: Any) -> list[str]:
    """One `file:line: field: message` per offending field (union alternatives merged)."""
    by_loc: dict[tuple, list[str]] = {}
    got: dict[tuple, str] = {}
    for err in exc.errors():
        loc = prefix + _real_loc(data, tuple(err["loc"]))
        typ = err["type"]
        if typ == "extra_forbidden":
            msg = "unknown key"
        elif typ == "missing":
            msg = "required field is missing"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            inp = err.get("input")
            if typ not in ("model_type", "dict_type", "list_type") and not isinstance(inp, (dict, list)) \
                    and "input" in err:
                got[loc] = f" (got {inp!r})"
            elif isinstance(inp, (dict, list)) and typ.endswith("_type"):
                got[loc] = f" (got a {'mapping' if isinstance(inp, dict) else 'list'})"
        msgs = by_loc.setdefault(loc, [])
        if msg not in msgs:
            msgs.append(msg)
    out = []
    for loc, msgs in by_loc.items():
        if len(msgs) > 1 and all(m.startswith("Input should be ") for m in msgs):
            msg = "Input should be " + " or ".join(m[len("Input should be "):] for m in msgs)
        else:
            msg = "; ".join(msgs)
        out.append(f"{doc.name}:{doc.line_of(loc)}: {fmt_path(loc)}: {msg}{got.get(loc, '')}")
    return out


# --------------------------------------------------------------------------- pydantic models
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr]


class Provenance(_Strict):
    source: Literal["measured", "unmeasured", "derived"]
    reason: StrictStr | None = None
    command: StrictStr | None = None
    date: Union[StrictStr, _dt.date, _dt.datetime, None] = None
    device: StrictStr | None = None
    driver: StrictStr | None = None
    cuda: StrictStr | None = None
    torch: StrictStr | None = None
    triton: StrictStr | None = None
    power_w: Union[StrictInt, StrictFloat, None] = None
    clocks: StrictStr | None = None
    host: StrictStr | None = None
    derived_from: StrictStr | None = None
    tool: StrictStr | None = None
    notes: StrictStr | None = None

    @model_validator(mode="after")
    def _source_rules(self) -> "Provenance":
        if self.source != "measured" and not (self.reason and self.reason.strip()):
            raise ValueError(f"source {self.source} needs a reason saying why the rows are what they are")
        if self.source == "measured":
            missing = [f for f in ("command", "date", "device", "triton") if getattr(self, f) in (None, "")]
            if missing:
                raise ValueError(f"source measured needs {', '.join(missing)}")
        if self.source == "derived" and not self.derived_from:
            raise ValueError("source derived needs derived_from (the table it was derived from)")
        return self


class Header(_Strict):
    sm: StrictInt = Field(ge=1)
    provenance: Provenance
    miss: Literal["error", "nearest"]
    extends: StrictStr | None = None  # a base table (path relative to this file) whose rows this one inherits
    # fusion rules (passes/fuse_rules.yaml names) this sm's table switches off, each with the measurement
    # that says why: the rule's fused form lost to the ops it replaces on this card
    fuse_off: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class BaseHeader(_Strict):
    """The header of a base table (`extends:` target): provenance only. A base is for several sm,
    so `sm`/`miss` belong to the tables that extend it; a base extends nothing."""

    provenance: Provenance


class RowModel(_Strict):
    t: list[Union[StrictInt, Literal["max"]]]
    route: StrictStr | None = None
    unsupported: StrictStr | None = None  # explicit "no route for this range" (and why)
    params: dict[StrictStr, Scalar] = Field(default_factory=dict)
    evidence: dict[StrictInt, dict[StrictStr, Union[StrictInt, StrictFloat]]] | None = None

    @model_validator(mode="after")
    def _route_or_unsupported(self) -> "RowModel":
        if (self.route is None) == (self.unsupported is None):
            raise ValueError("a row needs exactly one of route (a registered route name) or "
                             "unsupported (why no route serves this range)")
        if self.unsupported is not None:
            if not self.unsupported.strip():
                raise ValueError("unsupported needs a reason")
            if self.params or self.evidence:
                raise ValueError("an unsupported row takes no params or evidence")
        return self

    @field_validator("t")
    @classmethod
    def _t_range(cls, v: list) -> list:
        if len(v) != 2:
            raise ValueError("t must be [lo, hi] (hi may be max)")
        lo, hi = v
        if not isinstance(lo, int) or lo < 1:
            raise ValueError("t lo must be an integer >= 1")
        if hi != "max" and hi < lo:
            raise ValueError(f"t hi {hi} is below lo {lo}")
        return v


class GroupModel(_Strict):
    match: dict[StrictStr, Union[StrictBool, StrictInt, StrictStr]] = Field(default_factory=dict)
    routes: list[RowModel] = Field(min_length=1)


_FAMILY_ADAPTER = TypeAdapter(list[GroupModel])


# --------------------------------------------------------------------------- parsed structure
@dataclass
class ParsedRow:
    lo: int
    hi: int | None  # None = max
    route: str | None
    params: dict
    evidence: dict | None
    line: int
    path: tuple
    unsupported: str | None = None


@dataclass
class ParsedGroup:
    family: str
    index: int
    match: dict
    rows: list[ParsedRow]
    line: int
    match_line: int
    path: tuple


@dataclass
class ParsedTable:
    name: str
    header: Header | BaseHeader
    families: dict[str, list[ParsedGroup]] = field(default_factory=dict)
    family_lines: dict[str, int] = field(default_factory=dict)
    doc: _NodeData | None = None


def parse_table_text(name: str, text: str, family_ok, *, base: bool = False) -> tuple[ParsedTable | None, list[str]]:
    """Structural parse. `family_ok(key) -> bool` says whether a top-level key is a family;
    `base`: the file is a base table (`BaseHeader`: provenance only).
    Returns (table, errors): the table holds the family sections that parsed (None when the
    header itself is invalid), so semantic checks can still report on them."""
    doc = _NodeData(name, text)
    errors = list(doc.errors)
    data = doc.data
    if not isinstance(data, dict):
        return None, errors + [f"{name}:{doc.line_of(())}: (top): a route table must be a mapping "
                               f"with sm, provenance, miss and family sections"]
    header_data = {k: data[k] for k in HEADER_KEYS if k in data}
    header = None
    try:
        header = (BaseHeader if base else Header).model_validate(header_data)
    except ValidationError as exc:
        errors += pydantic_errors(doc, exc, (), header_data)
    parsed = ParsedTable(name=name, header=header, doc=doc)  # type: ignore[arg-type]
    for key, value in data.items():
        if key in HEADER_KEYS:
            continue
        kline = doc.line_of((key,))
        if not isinstance(key, str) or not family_ok(key):
            errors.append(f"{name}:{kline}: {key}: unknown key (not a header field nor a route family)")
            continue
        try:
            groups = _FAMILY_ADAPTER.validate_python(value)
        except ValidationError as exc:
            errors += pydantic_errors(doc, exc, (key,), value)
            continue
        parsed.families[key] = []
        parsed.family_lines[key] = kline
        for gi, g in enumerate(groups):
            gpath = (key, gi)
            rows = []
            for ri, r in enumerate(g.routes):
                rpath = gpath + ("routes", ri)
                lo, hi = r.t
                rows.append(ParsedRow(lo=lo, hi=None if hi == "max" else hi, route=r.route,
                                      params=dict(r.params), evidence=r.evidence,
                                      line=doc.line_of(rpath), path=rpath,
                                      unsupported=r.unsupported))
            parsed.families[key].append(ParsedGroup(
                family=key, index=gi, match=dict(g.match), rows=rows, line=doc.line_of(gpath),
                match_line=doc.line_of(gpath + ("match",)), path=gpath))
    if header is None:
        return None, errors
    return parsed, errors


def read_table_file(path: Path) -> tuple[str, bytes, str]:
    try:
        raw = read_yaml_bytes(path)
    except YamlInputError as exc:
        raise RouteError(f"{path}: route table refused: {exc.problem}") from None
    except OSError as exc:
        raise RouteError(f"{path}: cannot read route table: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RouteError(f"{path}: route table is not UTF-8: {exc}") from None
    return Path(path).name, raw, text
