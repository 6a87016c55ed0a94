"""Contract resolution: a validated `Contract` made concrete as a frozen `ModelSpec`.

`ContractResolver` is a mixin of `schema.Contract` (it reads the contract's fields and reports
through its `error`/`locate`, so every message is `file:line: field: why`): every dimension
evaluated, every name pattern expanded, the views checked to tile their parents, the aliases
resolved, the family invariants and the format/rank rules checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

from ..errors import ContractError
from .expr import ExpressionError, as_expr
from .vocab import FAMILIES, FORMAT_LAYOUTS, LAYER_KINDS, PART_NAMES, ROW_SPLIT_LAYOUT

if TYPE_CHECKING:  # annotations only (schema.py imports this module)
    from .schema import Section, TensorPattern

Path_ = tuple[Union[str, int], ...]


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
class ExpertBank:
    """An expert-major stored bank: `experts` blocks of `block_rows` rows; `roles` maps each role
    of one block to its (begin, count) rows relative to the block start."""

    parent: str
    experts: int
    block_rows: int
    roles: dict[str, tuple[int, int]]

    def row(self, expert: int, role: str, r: int) -> int:
        """The stored row of row `r` of `role` of expert `expert`."""
        begin, count = self.roles[role]
        if not (0 <= expert < self.experts and 0 <= r < count):
            raise IndexError(f"{self.parent}: expert {expert} row {r} of {role} is outside the bank")
        return expert * self.block_rows + begin + r


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
    # stored expert bank name -> its per-expert row geometry (views with `experts:`)
    expert_banks: dict[str, ExpertBank] = field(default_factory=dict, repr=False)

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


class ContractResolver:
    """Resolution methods of `Contract` (a mixin: it holds no fields of its own)."""

    def _eval(self, value: Union[int, str], path: Path_, dims: Optional[dict[str, int]] = None) -> int:
        try:
            return as_expr(value).evaluate(self.dims if dims is None else dims)
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
            if parts_present.get(part):
                needed += names
        if self.layers.attention_every is not None and not isinstance(self.layers.attention_every, int):
            needed += sorted(as_expr(self.layers.attention_every).names)
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
        """Status of every part the contract declares (the drafter parts only when named)."""
        return self.parts.model_dump(exclude_none=True)

    def _declared_part(self, part: str, path: Path_, status: dict[str, str]) -> str:
        if part not in status:
            raise self.error(path, f"part {part!r} is not declared under parts")
        return part

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

        def tensor(t: TensorPattern, path: Path_, part: str, name: str, layer: Optional[int] = None) -> ExpectedObject:
            role, role_path = t.role, path + ("role",)
            for other, on_layers in (t.layer_roles or {}).items():
                if layer in on_layers:
                    role, role_path = other, path + ("layer_roles", other)
            if role not in self.formats:
                raise self.error(role_path, f"role {role!r} has no entry in formats")
            fmt = self.formats[role]
            shape = self._tensor_shape(t, path, name)
            if FORMAT_LAYOUTS[fmt] == ROW_SPLIT_LAYOUT and len(shape) != 2:
                raise self.error(path + ("shape",), f"{name}: quantized format {fmt} (role {role}) "
                                                    f"needs a matrix [N, K], shape is {list(shape)}")
            used_roles.add(role)
            return ExpectedObject(name, "tensor", shape, fmt, role, part)

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
            present_here = parts[self._declared_part(section.part, spath + ("part",), status)]

            for group_key, group in self._section_groups(section):
                for t_index, t in enumerate(group):
                    roles_everywhere.add(t.role)
                    for other, on_layers in (t.layer_roles or {}).items():
                        lpath = spath + group_key + (t_index, "layer_roles", other)
                        if section.per_layer is None:
                            raise self.error(lpath, "layer_roles applies to per_layer sections only")
                        bad = [l for l in on_layers if l >= len(layer_kinds)]
                        if bad or not on_layers or len(set(on_layers)) != len(on_layers):
                            raise self.error(lpath, f"layers {on_layers} must be distinct text layers "
                                                    f"0..{len(layer_kinds) - 1}")
                        other_kind = [l for l in on_layers if layer_kinds[l] != group_key[1]]
                        if other_kind:
                            raise self.error(lpath, f"layer {other_kind[0]} is of kind {layer_kinds[other_kind[0]]}, "
                                                    f"not {group_key[1]} (the kind of this group)")
                        roles_everywhere.add(other)

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
                        add(tensor(t, path, section.part, name, l), path)
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
                    patterns[t.name][1].append(name)

        for role in self.formats:
            if role not in roles_everywhere:
                raise self.error(("formats", role), f"role {role!r} is used by no tensor")

        views, banks = self._resolve_views(patterns, objects)
        aliases = self._resolve_aliases(patterns, parts, status)

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
            expert_banks=banks,
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
    def _section_groups(section: Section) -> list[tuple[Path_, list[TensorPattern]]]:
        if section.tensors is not None:
            return [(("tensors",), section.tensors)]
        if section.per_layer is not None:
            return [(("per_layer", k), getattr(section.per_layer, k)) for k in LAYER_KINDS]
        return []

    def _resolve_views(self, patterns: dict, objects: dict[str, ExpectedObject]) -> tuple[dict, dict]:
        views: dict[tuple[str, str], RowView] = {}
        banks: dict[str, ExpertBank] = {}
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
            if group.experts is not None:
                experts = self._eval_positive(group.experts, vpath + ("experts",), "expert count")
                for name in names:
                    rows = objects[name].shape[0]
                    if rows % experts:
                        raise self.error(vpath + ("experts",), f"{name}: {rows} rows do not split "
                                                               f"into {experts} equal expert blocks")
                    self._check_tiling(f"one expert block of {name}", rows // experts, ranges, vpath)
                    banks[name] = ExpertBank(name, experts, rows // experts,
                                             {role: (b, e - b) for b, e, role, _ in ranges})
                continue
            # Every concrete parent of the pattern is checked (per-layer groups of different
            # kinds could in principle give one pattern different row counts).
            for rows in sorted({objects[name].shape[0] for name in names}):
                self._check_tiling(group.parent, rows, ranges, vpath)
            for name in names:
                shape = objects[name].shape
                for begin, end, role, _ in ranges:
                    views[(name, role)] = RowView(name, role, begin, end - begin, (end - begin, *shape[1:]))
        return views, banks

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

    def _resolve_aliases(self, patterns: dict, parts: dict[str, bool], status: dict[str, str]) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for a_index, alias in enumerate(self.aliases):
            apath: Path_ = ("aliases", a_index)
            self._declared_part(alias.part, apath + ("part",), status)
            if alias.target not in patterns or self._placeholders(alias.target):
                raise self.error(apath + ("target",), f"alias target {alias.target!r} is not an inventory object")
            if alias.role in aliases or alias.role in patterns:
                raise self.error(apath + ("role",), f"alias role {alias.role!r} is already a name")
            target_part, names = patterns[alias.target]
            if parts[alias.part] and names:
                aliases[alias.role] = alias.target
        return aliases
