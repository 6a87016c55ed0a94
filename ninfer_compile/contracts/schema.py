"""Model contracts: the YAML schema (pydantic), the shape-expression language, and resolution.

A contract (`graphs/<model_id>.yaml`) says what the objects of an artifact *mean*: dimensions,
which text layers are full attention and which are Gated DeltaNet, the object inventory as name
patterns with shapes written over the dimensions, fused row views, aliases, and the format of
every role. `Contract.resolve()` turns it into a concrete, frozen `ModelSpec`.

Errors name `file:line` and the field path. pydantic validates types and forbids unknown keys
(the loader maps pydantic's `loc` to YAML lines); everything that needs more than one field —
unknown dimension names, placeholders, view bounds, format/rank rules, family invariants — is
checked here with the same location scheme, so a contract is either fully valid or rejected
with one precise line.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr, StrictBool

from ..errors import ContractError

# --------------------------------------------------------------------------------------------
# Closed vocabularies
# --------------------------------------------------------------------------------------------

PART_NAMES: tuple[str, ...] = ("text", "mtp", "draft_head", "vision", "frontend")
LAYER_KINDS: tuple[str, ...] = ("attention", "gdn")

# Registered NInfer tensor formats and the one storage layout each may use. The artifact reader
# owns the byte-level definitions; a contract only needs the names and which layout goes with
# them (a quantized format is only legal as a rank-2 row-split matrix).
DIRECT_LAYOUT = "contiguous-le-v1"
ROW_SPLIT_LAYOUT = "row-split-k128-v1"
RESOURCE_ENCODING = "raw-bytes-v1"
FORMAT_LAYOUTS: dict[str, str] = {
    "BF16": DIRECT_LAYOUT,
    "FP32": DIRECT_LAYOUT,
    "I32": DIRECT_LAYOUT,
    "Q4G64_F16S": ROW_SPLIT_LAYOUT,
    "Q5G64_F16S": ROW_SPLIT_LAYOUT,
    "Q6G64_F16S": ROW_SPLIT_LAYOUT,
    "W8G32_F16S": ROW_SPLIT_LAYOUT,
}

PartName = Literal["text", "mtp", "draft_head", "vision", "frontend"]
PartStatus = Literal["required", "optional", "absent"]
FormatName = Literal["BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
LayerKind = Literal["attention", "gdn"]

# A model id is used as a file name (graphs/<id>.yaml), so it may not contain path syntax.
MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


# --------------------------------------------------------------------------------------------
# Shape expressions: + - * // and parentheses over dimension names and integers. A tiny
# recursive-descent parser instead of eval(): contracts are data and must not execute code.
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*()]))")


class ExpressionError(ValueError):
    """A shape expression is malformed, names an unknown dimension, or divides by zero."""


@dataclass(frozen=True)
class ShapeExpr:
    """A parsed shape expression. `tree` is a nested tuple: ("int", n) | ("dim", name) |
    ("neg", x) | (op, left, right) with op in + - * //."""

    text: str
    tree: tuple

    @property
    def names(self) -> frozenset[str]:
        """Dimension names the expression refers to."""
        found: set[str] = set()

        def walk(node: tuple) -> None:
            if node[0] == "dim":
                found.add(node[1])
            elif node[0] != "int":
                for child in node[1:]:
                    walk(child)

        walk(self.tree)
        return frozenset(found)

    def evaluate(self, dims: dict[str, int]) -> int:
        def ev(node: tuple) -> int:
            tag = node[0]
            if tag == "int":
                return node[1]
            if tag == "dim":
                if node[1] not in dims:
                    known = ", ".join(sorted(dims)) or "none"
                    raise ExpressionError(
                        f"unknown dimension {node[1]!r} in {self.text!r} (known: {known})"
                    )
                return dims[node[1]]
            if tag == "neg":
                return -ev(node[1])
            left, right = ev(node[1]), ev(node[2])
            if tag == "+":
                return left + right
            if tag == "-":
                return left - right
            if tag == "*":
                return left * right
            if right == 0:
                raise ExpressionError(f"division by zero in {self.text!r}")
            return left // right

        return ev(self.tree)


@functools.lru_cache(maxsize=None)
def parse_expr(text: str) -> ShapeExpr:
    """Parse one expression (cached: the 27B inventory reuses a few dozen expressions)."""
    tokens: list[tuple[str, Any]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"bad expression {text!r}: unexpected {stripped[pos:].strip()[:10]!r}")
        number, name, op = m.groups()
        if number is not None:
            tokens.append(("int", int(number)))
        elif name is not None:
            tokens.append(("dim", name))
        else:
            tokens.append(("op", op))
        pos = m.end()
    if not tokens:
        raise ExpressionError("empty expression")

    index = 0

    def peek() -> Optional[tuple[str, Any]]:
        return tokens[index] if index < len(tokens) else None

    def take() -> tuple[str, Any]:
        nonlocal index
        tok = peek()
        if tok is None:
            raise ExpressionError(f"bad expression {text!r}: ends too early")
        index += 1
        return tok

    def expr() -> tuple:
        node = term()
        while (tok := peek()) in (("op", "+"), ("op", "-")):
            take()
            node = (tok[1], node, term())
        return node

    def term() -> tuple:
        node = factor()
        while (tok := peek()) in (("op", "*"), ("op", "//")):
            take()
            node = (tok[1], node, factor())
        return node

    def factor() -> tuple:
        tok = take()
        if tok[0] in ("int", "dim"):
            return tok
        if tok == ("op", "-"):
            return ("neg", factor())
        if tok == ("op", "("):
            node = expr()
            if take() != ("op", ")"):
                raise ExpressionError(f"bad expression {text!r}: missing ')'")
            return node
        raise ExpressionError(f"bad expression {text!r}: unexpected {tok[1]!r}")

    tree = expr()
    if index != len(tokens):
        raise ExpressionError(f"bad expression {text!r}: unexpected {tokens[index][1]!r}")
    return ShapeExpr(text=text, tree=tree)


def _validate_expr(value: Any) -> Union[int, str]:
    # bool is an int subclass; `true` in a shape is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected an integer or an expression string, got {type(value).__name__}")
    if isinstance(value, str):
        try:
            parse_expr(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
    return value


# An integer or an expression over dimension names; stored as written so rendering round-trips.
Expr = Annotated[Union[int, str], PlainValidator(_validate_expr)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]


def _as_expr(value: Union[int, str]) -> ShapeExpr:
    return parse_expr(str(value)) if isinstance(value, str) else ShapeExpr(str(value), ("int", value))


# --------------------------------------------------------------------------------------------
# Family rules: which dimensions exist and the invariants the family's math relies on.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyRules:
    """Dimension names a family knows, which part needs which, and cross-dimension invariants."""

    text_dims: tuple[str, ...]
    optional_text_dims: tuple[str, ...]
    part_dims: dict[str, tuple[str, ...]]
    # (dims the rule reads, predicate over (dims, params), message). The error points at the
    # first dim's line.
    invariants: tuple[tuple[tuple[str, ...], Callable[[dict, dict], bool], str], ...]

    @property
    def known_dims(self) -> set[str]:
        out = set(self.text_dims) | set(self.optional_text_dims)
        for names in self.part_dims.values():
            out |= set(names)
        return out


FAMILIES: dict[str, FamilyRules] = {
    "qwen3_5_hybrid": FamilyRules(
        text_dims=(
            "vocab_rows", "hidden", "layers", "intermediate", "attn_heads", "kv_heads", "head_dim",
            "rotary_dim", "gdn_k_heads", "gdn_k_dim", "gdn_v_heads", "gdn_v_dim", "conv_kernel",
        ),
        # Only needed when the layer pattern is written as `attention_every`.
        optional_text_dims=("full_attention_interval",),
        part_dims={
            "mtp": ("mtp_layers",),
            "draft_head": ("draft_rows",),
            "vision": (
                "vision_depth", "vision_hidden", "vision_intermediate", "vision_heads",
                "vision_patch_in", "vision_positions", "vision_merge_in", "vision_out",
            ),
        },
        invariants=(
            (("attn_heads", "kv_heads"), lambda d, p: d["attn_heads"] % d["kv_heads"] == 0,
             "attn_heads must be a multiple of kv_heads (grouped-query attention)"),
            (("gdn_v_heads", "gdn_k_heads"), lambda d, p: d["gdn_v_heads"] % d["gdn_k_heads"] == 0,
             "gdn_v_heads must be a multiple of gdn_k_heads (value heads share key heads)"),
            (("rotary_dim", "head_dim"),
             lambda d, p: d["rotary_dim"] <= d["head_dim"] and d["rotary_dim"] % 2 == 0,
             "rotary_dim must be even and at most head_dim (NeoX partial rotary)"),
            (("rotary_dim",),
             lambda d, p: p.get("mrope_section") is None or 2 * sum(p["mrope_section"]) == d["rotary_dim"],
             "params.mrope_section must sum to rotary_dim/2 (one frequency per rotated pair)"),
            (("rotary_dim", "head_dim"),
             lambda d, p: p.get("partial_rotary_factor") is None
             or abs(p["partial_rotary_factor"] * d["head_dim"] - d["rotary_dim"]) < 1e-6,
             "params.partial_rotary_factor must equal rotary_dim/head_dim"),
            (("vocab_rows",), lambda d, p: p["token_ids"] <= d["vocab_rows"],
             "params.token_ids must not exceed vocab_rows"),
            (("mtp_layers",), lambda d, p: d.get("mtp_layers", 1) == 1,
             "mtp_layers must be 1 (the NInfer MTP inventory holds one unindexed layer)"),
            (("draft_rows",), lambda d, p: d.get("draft_rows", 0) <= p["token_ids"],
             "draft_rows must not exceed params.token_ids (draft rows are distinct token ids)"),
            (("vision_out",), lambda d, p: d.get("vision_out", d["hidden"]) == d["hidden"],
             "vision_out must equal hidden (merged vision tokens replace text embeddings)"),
            (("vision_hidden", "vision_heads"),
             lambda d, p: "vision_hidden" not in d or "vision_heads" not in d
             or d["vision_hidden"] % d["vision_heads"] == 0,
             "vision_hidden must be a multiple of vision_heads"),
        ),
    ),
}


# --------------------------------------------------------------------------------------------
# The YAML schema
# --------------------------------------------------------------------------------------------


class StrictModel(BaseModel):
    """Base of every contract node: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Params(StrictModel):
    """Scalar hyper-parameters the math needs (not shapes)."""

    rms_eps: PositiveFloat = Field(description="RMSNorm epsilon of the text model")
    rope_theta: PositiveFloat = Field(description="RoPE base of the text attention")
    partial_rotary_factor: Optional[PositiveFloat] = Field(
        None, description="rotary_dim/head_dim; derived from the dims when omitted")
    mrope_section: Optional[list[Annotated[int, Field(strict=True, ge=0)]]] = Field(
        None, description="frequencies per (temporal, height, width) MRoPE axis; None = 1-D RoPE")
    mrope_interleaved: StrictBool = Field(False, description="MRoPE axes interleaved per frequency")
    token_ids: PositiveInt = Field(description="tokenizer-addressable ids 0..token_ids-1 (<= vocab_rows)")
    max_positions: Optional[PositiveInt] = Field(None, description="native context capacity")
    vision_rope_theta: Optional[PositiveFloat] = Field(None, description="RoPE base of the vision tower")


class LayerPattern(StrictModel):
    """Which text layers are full attention. Either `attention_every: N` (layer l is attention
    iff (l+1) % N == 0, the Qwen3.5 rule) or an explicit `kinds` list of length `count`."""

    count: Expr = Field(description="number of text layers (usually the dim name `layers`)")
    attention_every: Optional[Expr] = None
    kinds: Optional[list[LayerKind]] = None


class Parts(StrictModel):
    """Per model component: `required`, `absent`, or `optional` (all of its objects or none)."""

    text: PartStatus
    mtp: PartStatus
    draft_head: PartStatus
    vision: PartStatus
    frontend: PartStatus


class TensorPattern(StrictModel):
    """One tensor object; inside a repeating section, one per index (name holds `{l}`/`{b}`)."""

    name: str = Field(min_length=1)
    shape: list[Expr] = Field(min_length=1, description="expressions over the dims, [N, K] for matrices")
    role: Identifier = Field(description="key into `formats`; groups tensors that share a format")


class PerLayerGroups(StrictModel):
    """The objects of one text layer, by the layer's kind, in writer order."""

    attention: list[TensorPattern]
    gdn: list[TensorPattern]


class Repeat(StrictModel):
    """Repeat a section's tensors for index = 0 .. count-1 (e.g. the vision blocks)."""

    index: Identifier
    count: Expr


class Section(StrictModel):
    """A run of consecutive objects of one part in writer order: `resources`, plain `tensors`,
    `tensors` with `repeat`, or `per_layer` (every text layer, its group chosen by layer kind)."""

    part: PartName
    resources: Optional[list[Annotated[str, Field(min_length=1)]]] = None
    tensors: Optional[list[TensorPattern]] = None
    repeat: Optional[Repeat] = None
    per_layer: Optional[PerLayerGroups] = None


class ViewGroup(StrictModel):
    """Fused row views of one parent: role -> [begin, end) row range (expressions). The views of
    a parent must tile its rows exactly, so a wrong dim cannot silently drop or share rows."""

    parent: str = Field(min_length=1)
    rows: dict[Identifier, tuple[Expr, Expr]] = Field(min_length=1)


class Alias(StrictModel):
    """A logical consumer role served by another stored object (e.g. the MTP embedding)."""

    role: str = Field(min_length=1)
    target: str = Field(min_length=1)
    part: PartName = Field(description="the consuming part; the alias exists only when it is present")


# --------------------------------------------------------------------------------------------
# The resolved, concrete spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedObject:
    """One object the artifact must contain. Resources have shape, format and role None."""

    name: str
    kind: str  # "tensor" | "resource"
    shape: Optional[tuple[int, ...]]
    format: Optional[str]
    role: Optional[str]
    part: str

    @property
    def layout(self) -> Optional[str]:
        """The storage layout the format implies (None for resources)."""
        return FORMAT_LAYOUTS[self.format] if self.format else None

    def describe(self) -> str:
        if self.kind == "resource":
            return f"resource {self.name}"
        return f"tensor {self.name} {list(self.shape)} {self.format}"


@dataclass(frozen=True)
class RowView:
    """Rows [row_begin, row_begin+row_count) of a stored parent, shape [row_count, *parent[1:]]."""

    parent: str
    role: str
    row_begin: int
    row_count: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """A contract made concrete: every dimension evaluated, every pattern expanded.

    Treat the dicts as read-only. `objects` is in NInfer writer order."""

    model_id: str
    family: str
    dims: dict[str, int]
    params: dict[str, Any]
    layer_kinds: list[str]
    parts: dict[str, bool]
    objects: dict[str, ExpectedObject]
    views: dict[tuple[str, str], RowView]
    aliases: dict[str, str]
    contract_path: Optional[str] = None
    # layer -> {suffix after "text/layers/{l}/": object name}
    layer_objects: dict[int, dict[str, str]] = field(default_factory=dict, repr=False)

    def text_layer_objects(self, l: int) -> dict[str, str]:
        """Objects of text layer `l` keyed by suffix, e.g. {"attention/query_key": "text/layers/3/..."}."""
        if l not in self.layer_objects:
            raise ContractError(f"{self.model_id}: no text layer {l} (layers 0..{len(self.layer_kinds) - 1})")
        return dict(self.layer_objects[l])

    def views_of(self, parent: str) -> dict[str, RowView]:
        """The row views of one stored parent, by role, in row order."""
        found = [v for (p, _), v in self.views.items() if p == parent]
        return {v.role: v for v in sorted(found, key=lambda v: v.row_begin)}

    @property
    def tensor_count(self) -> int:
        return sum(1 for o in self.objects.values() if o.kind == "tensor")

    @property
    def resource_count(self) -> int:
        return sum(1 for o in self.objects.values() if o.kind == "resource")


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------

Path_ = tuple[Union[str, int], ...]


def format_field_path(path: Iterable[Union[str, int]]) -> str:
    """('inventory', 3, 'tensors', 0, 'shape', 1) -> 'inventory[3].tensors[0].shape[1]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top>"


class Contract(StrictModel):
    """One model contract file. Load with `load_contract`; make concrete with `resolve()`."""

    model_id: str = Field(pattern=MODEL_ID_PATTERN)
    family: Literal["qwen3_5_hybrid"]
    dims: dict[Identifier, PositiveInt]
    params: Params
    layers: LayerPattern
    parts: Parts
    formats: dict[Identifier, FormatName]
    inventory: list[Section] = Field(min_length=1)
    views: list[ViewGroup] = Field(default_factory=list)
    aliases: list[Alias] = Field(default_factory=list)

    # Where the contract came from, and YAML line of every field path (filled by the loader).
    _source: Optional[str] = PrivateAttr(default=None)
    _lines: dict[Path_, int] = PrivateAttr(default_factory=dict)

    # ---- locations -------------------------------------------------------------------------

    @property
    def source(self) -> Optional[str]:
        """The file this contract was loaded from (None when built in memory)."""
        return self._source

    def attach_source(self, source: Optional[str], lines: dict[Path_, int]) -> "Contract":
        self._source = source
        self._lines = dict(lines)
        return self

    def locate(self, path: Path_) -> str:
        """'file:line' of a field path: the deepest prefix of `path` the YAML had a line for."""
        name = self._source or f"<contract {self.model_id}>"
        for end in range(len(path), -1, -1):
            line = self._lines.get(tuple(path[:end]))
            if line is not None:
                return f"{name}:{line}"
        return name

    def error(self, path: Path_, message: str) -> ContractError:
        return ContractError(f"{self.locate(path)}: {format_field_path(path)}: {message}")

    # ---- evaluation helpers ----------------------------------------------------------------

    def _eval(self, value: Union[int, str], path: Path_, dims: Optional[dict[str, int]] = None) -> int:
        try:
            return _as_expr(value).evaluate(self.dims if dims is None else dims)
        except ExpressionError as exc:
            raise self.error(path, str(exc)) from None

    def _eval_positive(self, value: Union[int, str], path: Path_, what: str) -> int:
        result = self._eval(value, path)
        if result <= 0:
            raise self.error(path, f"{what} {value!r} evaluates to {result}; must be positive")
        return result

    # ---- validation pieces -----------------------------------------------------------------

    def _check_dims(self, parts_present: dict[str, bool]) -> None:
        rules = FAMILIES[self.family]
        known = rules.known_dims
        for name in self.dims:
            if name not in known:
                raise self.error(("dims", name), f"unknown dimension name {name!r} for family "
                                 f"{self.family} (known: {', '.join(sorted(known))})")
        needed = list(rules.text_dims)
        for part, names in rules.part_dims.items():
            if parts_present[part]:
                needed += names
        if self.layers.attention_every is not None and not isinstance(self.layers.attention_every, int):
            needed += sorted(_as_expr(self.layers.attention_every).names)
        missing = [n for n in needed if n not in self.dims]
        if missing:
            raise self.error(("dims",), f"missing dimension(s) {', '.join(missing)}")
        params = self.params.model_dump()
        for names, predicate, message in rules.invariants:
            if not predicate(self.dims, params):
                values = ", ".join(f"{n}={self.dims[n]}" for n in names if n in self.dims)
                raise self.error(("dims", names[0]) if names[0] in self.dims else ("dims",),
                                 f"{message} ({values})")

    def _layer_kinds(self) -> list[str]:
        count = self._eval_positive(self.layers.count, ("layers", "count"), "layer count")
        if self.dims.get("layers") is not None and count != self.dims["layers"]:
            raise self.error(("layers", "count"), f"layer count {count} differs from dims.layers={self.dims['layers']}")
        if (self.layers.attention_every is None) == (self.layers.kinds is None):
            raise self.error(("layers",), "give exactly one of attention_every or kinds")
        if self.layers.kinds is not None:
            if len(self.layers.kinds) != count:
                raise self.error(("layers", "kinds"), f"{len(self.layers.kinds)} kinds for {count} layers")
            return list(self.layers.kinds)
        every = self._eval_positive(self.layers.attention_every, ("layers", "attention_every"), "attention_every")
        return ["attention" if (l + 1) % every == 0 else "gdn" for l in range(count)]

    @staticmethod
    def _placeholders(name: str) -> set[str]:
        return set(re.findall(r"\{([^{}]*)\}", name))

    def _check_name(self, name: str, allowed: set[str], path: Path_) -> None:
        """A name holds exactly the placeholders of its section: `{l}` in per-layer sections,
        `{<index>}` in repeated ones, none elsewhere."""
        found = self._placeholders(name)
        if found != allowed:
            want = ", ".join("{" + a + "}" for a in sorted(allowed)) or "no placeholder"
            raise self.error(path, f"name {name!r} must contain {want}")
        rest = name
        for placeholder in allowed:
            rest = rest.replace("{" + placeholder + "}", "")
        if "{" in rest or "}" in rest:
            raise self.error(path, f"name {name!r} has a malformed placeholder")

    def _tensor_shape(self, tensor: TensorPattern, path: Path_, name: str) -> tuple[int, ...]:
        shape = []
        for i, extent in enumerate(tensor.shape):
            value = self._eval(extent, path + ("shape", i))
            if value <= 0:
                raise self.error(path + ("shape", i),
                                 f"{name}: extent {extent!r} evaluates to {value}; must be positive")
            shape.append(value)
        return tuple(shape)

    # ---- resolution ------------------------------------------------------------------------

    def part_status(self) -> dict[str, str]:
        return self.parts.model_dump()

    def resolve(self, present: Optional[Iterable[str]] = None) -> ModelSpec:
        """Make the contract concrete.

        `present` names the `optional` parts to include (default none); `required` parts are
        always included and `absent` ones never. Raises ContractError (file:line, field) on any
        inconsistency: unknown dims, bad placeholders, non-positive extents, views outside
        their parent, a quantized format on a non-matrix, an unused or missing format role."""
        present_set = set(present or ())
        status = self.part_status()
        unknown = present_set - set(PART_NAMES)
        if unknown:
            raise ContractError(f"{self.locate(('parts',))}: unknown part(s) {sorted(unknown)}")
        if status["text"] != "required":
            raise self.error(("parts", "text"), "the text part is always required")
        parts = {p: s == "required" or (s == "optional" and p in present_set) for p, s in status.items()}

        self._check_dims(parts)
        layer_kinds = self._layer_kinds()
        dims = dict(self.dims)

        objects: dict[str, ExpectedObject] = {}
        name_paths: dict[str, Path_] = {}
        # pattern -> (part, concrete names); patterns of absent parts are known but empty so
        # views/aliases that point at them are dropped instead of reported as dangling.
        patterns: dict[str, tuple[str, list[str]]] = {}
        layer_objects: dict[int, dict[str, str]] = {l: {} for l in range(len(layer_kinds))}
        used_roles: set[str] = set()
        roles_everywhere: set[str] = set()

        def add(obj: ExpectedObject, path: Path_) -> None:
            if obj.name in objects:
                raise self.error(path, f"object {obj.name!r} defined twice "
                                       f"(first at {self.locate(name_paths[obj.name])})")
            objects[obj.name] = obj
            name_paths[obj.name] = path

        def register_pattern(pattern: str, part: str, path: Path_) -> list[str]:
            if pattern in patterns:
                raise self.error(path, f"name pattern {pattern!r} appears twice")
            names: list[str] = []
            patterns[pattern] = (part, names)
            return names

        def tensor(t: TensorPattern, path: Path_, part: str, name: str) -> ExpectedObject:
            if t.role not in self.formats:
                raise self.error(path + ("role",), f"role {t.role!r} has no entry in formats")
            fmt = self.formats[t.role]
            shape = self._tensor_shape(t, path, name)
            if FORMAT_LAYOUTS[fmt] == ROW_SPLIT_LAYOUT and len(shape) != 2:
                raise self.error(path + ("shape",), f"{name}: quantized format {fmt} (role {t.role}) "
                                                    f"needs a matrix [N, K], shape is {list(shape)}")
            return ExpectedObject(name, "tensor", shape, fmt, t.role, part)

        for s_index, section in enumerate(self.inventory):
            spath: Path_ = ("inventory", s_index)
            given = [k for k in ("resources", "tensors", "per_layer") if getattr(section, k) is not None]
            if len(given) != 1:
                raise self.error(spath, "a section holds exactly one of resources, tensors, per_layer "
                                        f"(has {', '.join(given) or 'none'})")
            if section.repeat is not None and section.tensors is None:
                raise self.error(spath + ("repeat",), "repeat applies to a tensors section only")
            if section.part == "text" and section.resources is not None:
                raise self.error(spath, "resources belong to a non-text part (frontend)")
            present_here = parts[section.part]

            for group in self._section_groups(section):
                for t_index, t in enumerate(group[1]):
                    roles_everywhere.add(t.role)

            if section.resources is not None:
                for r_index, name in enumerate(section.resources):
                    path = spath + ("resources", r_index)
                    self._check_name(name, set(), path)
                    names = register_pattern(name, section.part, path)
                    if present_here:
                        add(ExpectedObject(name, "resource", None, None, None, section.part), path)
                        names.append(name)
                continue

            if section.per_layer is not None:
                for kind in LAYER_KINDS:
                    for t_index, t in enumerate(getattr(section.per_layer, kind)):
                        path = spath + ("per_layer", kind, t_index)
                        self._check_name(t.name, {"l"}, path + ("name",))
                        if t.name not in patterns:
                            register_pattern(t.name, section.part, path + ("name",))
                        elif patterns[t.name][0] != section.part:
                            raise self.error(path + ("name",), f"name pattern {t.name!r} appears twice")
                if not present_here:
                    continue
                for l, kind in enumerate(layer_kinds):
                    for t_index, t in enumerate(getattr(section.per_layer, kind)):
                        path = spath + ("per_layer", kind, t_index)
                        name = t.name.replace("{l}", str(l))
                        add(tensor(t, path, section.part, name), path)
                        used_roles.add(t.role)
                        patterns[t.name][1].append(name)
                        suffix = t.name.split("{l}", 1)[1].lstrip("/")
                        layer_objects[l][suffix] = name
                continue

            # plain or repeated tensors
            index_name = section.repeat.index if section.repeat is not None else None
            allowed = {index_name} if index_name else set()
            for t_index, t in enumerate(section.tensors):
                path = spath + ("tensors", t_index)
                self._check_name(t.name, allowed, path + ("name",))
                register_pattern(t.name, section.part, path + ("name",))
            if not present_here:
                continue
            count = 1
            if section.repeat is not None:
                count = self._eval_positive(section.repeat.count, spath + ("repeat", "count"), "repeat count")
            for i in range(count):
                for t_index, t in enumerate(section.tensors):
                    path = spath + ("tensors", t_index)
                    name = t.name.replace("{" + index_name + "}", str(i)) if index_name else t.name
                    add(tensor(t, path, section.part, name), path)
                    used_roles.add(t.role)
                    patterns[t.name][1].append(name)

        for role in self.formats:
            if role not in roles_everywhere:
                raise self.error(("formats", role), f"role {role!r} is used by no tensor")

        views = self._resolve_views(patterns, objects)
        aliases = self._resolve_aliases(patterns, parts)

        params = self.params.model_dump()
        if params["partial_rotary_factor"] is None:
            params["partial_rotary_factor"] = dims["rotary_dim"] / dims["head_dim"]

        return ModelSpec(
            model_id=self.model_id,
            family=self.family,
            dims=dims,
            params=params,
            layer_kinds=layer_kinds,
            parts=parts,
            objects=objects,
            views=views,
            aliases=aliases,
            contract_path=self._source,
            layer_objects=layer_objects,
        )

    def resolve_for(self, artifact: Any) -> ModelSpec:
        """Resolve for one artifact (anything with `.objects` holding `.name`s): an `optional`
        part counts as present when the artifact holds any of its objects — then all of them
        are expected, so a half-written part shows up as missing objects."""
        everything = self.resolve(present=PART_NAMES)
        names = {obj.name for obj in artifact.objects}
        present = {o.part for o in everything.objects.values() if o.name in names}
        optional = {p for p, s in self.part_status().items() if s == "optional"}
        return self.resolve(present=present & optional)

    @staticmethod
    def _section_groups(section: Section) -> list[tuple[str, list[TensorPattern]]]:
        if section.tensors is not None:
            return [("tensors", section.tensors)]
        if section.per_layer is not None:
            return [(k, getattr(section.per_layer, k)) for k in LAYER_KINDS]
        return []

    def _resolve_views(self, patterns: dict, objects: dict[str, ExpectedObject]) -> dict:
        views: dict[tuple[str, str], RowView] = {}
        seen_parents: set[str] = set()
        for v_index, group in enumerate(self.views):
            vpath: Path_ = ("views", v_index)
            if group.parent not in patterns:
                raise self.error(vpath + ("parent",), f"view parent {group.parent!r} is not an inventory name pattern")
            if group.parent in seen_parents:
                raise self.error(vpath + ("parent",), f"views of {group.parent!r} are given twice")
            seen_parents.add(group.parent)
            _, names = patterns[group.parent]
            if not names:  # the parent's part is absent
                continue
            ranges = []
            for role, (begin_expr, end_expr) in group.rows.items():
                rpath = vpath + ("rows", role)
                begin = self._eval(begin_expr, rpath + (0,))
                end = self._eval(end_expr, rpath + (1,))
                ranges.append((begin, end, role, rpath))
            if objects[names[0]].kind != "tensor":
                raise self.error(vpath + ("parent",), f"view parent {group.parent!r} is not a tensor")
            # Every concrete parent of the pattern is checked (per-layer groups of different
            # kinds could in principle give one pattern different row counts).
            for rows in sorted({objects[name].shape[0] for name in names}):
                self._check_tiling(group.parent, rows, ranges, vpath)
            for name in names:
                shape = objects[name].shape
                for begin, end, role, _ in ranges:
                    views[(name, role)] = RowView(name, role, begin, end - begin, (end - begin, *shape[1:]))
        return views

    def _check_tiling(self, parent: str, rows: int, ranges: list, vpath: Path_) -> None:
        """The row ranges of a parent's views must tile [0, rows) exactly."""
        cursor = 0
        for begin, end, role, rpath in sorted(ranges, key=lambda r: (r[0], r[1])):
            if end <= begin:
                raise self.error(rpath, f"view {role}: empty or reversed row range [{begin}, {end})")
            if begin != cursor:
                what = "overlaps the previous view" if begin < cursor else f"leaves rows [{cursor}, {begin}) uncovered"
                raise self.error(rpath, f"view {role} [{begin}, {end}) of {parent} {what}")
            if end > rows:
                raise self.error(rpath, f"view {role} [{begin}, {end}) exceeds the {rows} rows of {parent}")
            cursor = end
        if cursor != rows:
            raise self.error(vpath + ("rows",), f"views of {parent} cover rows [0, {cursor}) of {rows}")

    def _resolve_aliases(self, patterns: dict, parts: dict[str, bool]) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for a_index, alias in enumerate(self.aliases):
            apath: Path_ = ("aliases", a_index)
            if alias.target not in patterns or self._placeholders(alias.target):
                raise self.error(apath + ("target",), f"alias target {alias.target!r} is not an inventory object")
            if alias.role in aliases or alias.role in patterns:
                raise self.error(apath + ("role",), f"alias role {alias.role!r} is already a name")
            target_part, names = patterns[alias.target]
            if parts[alias.part] and names:
                aliases[alias.role] = alias.target
        return aliases
