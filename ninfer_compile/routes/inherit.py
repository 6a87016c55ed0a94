"""`extends:` — a route table over a shared base table (routes/base.yaml for sm86/89/120).

A table that says `extends: FILE` (a path relative to it) inherits the base's family sections; each
group it writes itself replaces the base group with the same effective match, in its place, or is
added after the base's. The base is parsed with `BaseHeader` (provenance only: no sm, miss or
extends, so one level). `load_table` (table.py) checks every group against the registry in the file
it is written in, so errors and `source` name `base.yaml:LINE` for inherited rows.
`load_table_data` gives the same merge as plain data, for `tune --base`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import RouteError
from .schema import HEADER_KEYS, ParsedGroup, TableErrors, parse_table_text, read_table_file


def _match_key(match: Mapping[str, Any]) -> tuple:
    """A hashable effective match (`epilogue` defaults to `none`, as in table.effective_match)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in {"epilogue": "none", **match}.items()))


def merge_families(base: dict[str, list[tuple[str, ParsedGroup]]],
                    own: dict[str, list[tuple[str, ParsedGroup]]]) -> dict[str, list[tuple[str, ParsedGroup]]]:
    """The base's groups with each of the table's own groups replacing the base group of the same
    effective match (in its place), or appended after the base's."""
    out = {fam: list(gs) for fam, gs in base.items()}
    for fam, gs in own.items():
        merged = out.setdefault(fam, [])
        index = {_match_key(pg.match): i for i, (_, pg) in enumerate(merged)}
        for item in gs:
            i = index.get(_match_key(item[1].match))
            if i is None:
                merged.append(item)
            else:
                merged[i] = item
    return out


def read_base(path: Path, name: str, parsed, family_ok) -> tuple[Path, bytes, Any, list[str]]:
    """(path, bytes, parsed base, its errors) of the table's `extends:` file."""
    line = parsed.doc.line_of(("extends",))
    bpath = path.parent / parsed.header.extends
    if bpath.resolve() == path.resolve():
        raise TableErrors([f"{name}:{line}: extends: a table cannot extend itself"])
    try:
        bname, braw, btext = read_table_file(bpath)
    except RouteError as exc:
        raise TableErrors([f"{name}:{line}: extends: {str(exc).splitlines()[0]}"]) from None
    if bname == name:
        raise TableErrors([f"{name}:{line}: extends: the base must have another file name than the table"])
    bparsed, berrors = parse_table_text(bname, btext, family_ok, base=True)
    return bpath, braw, bparsed, list(berrors)


def base_hint(name: str, text: str) -> str | None:
    """The one error for a base file loaded as a table (a mapping with `provenance` but neither
    `sm` nor `miss`), else None (the parse errors stand)."""
    from ..yaml_lines import YamlInputError, safe_load

    try:
        data = safe_load(text, name)
    except YamlInputError:
        return None
    if isinstance(data, dict) and "provenance" in data and "sm" not in data and "miss" not in data:
        return (f"{name}:1: (top): a base table (no sm, no miss), not a table: validate a table that "
                f"says `extends: {name}`")
    return None


def load_table_data(path: str | Path) -> Any:
    """Plain data of a table file with its `extends:` base merged in (the base's family sections,
    each group replaced by the table's group of the same match): what `tune --base` carries over.
    Raises YamlInputError / OSError like `yaml_lines.read_yaml_text` + `safe_load`; the data is
    not validated (load_table does that)."""
    from ..yaml_lines import read_yaml_text, safe_load

    path = Path(path)
    data = safe_load(read_yaml_text(path), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("extends"), str):
        return data
    bpath = path.parent / data["extends"]
    base = safe_load(read_yaml_text(bpath), str(bpath))
    if not isinstance(base, dict):
        return data
    out = {k: v for k, v in data.items() if k in HEADER_KEYS and k != "extends"}
    own = {k: v for k, v in data.items() if k not in HEADER_KEYS}
    for key in [k for k in base if k not in HEADER_KEYS] + [k for k in own if k not in base]:
        merged = list(base.get(key) or []) if isinstance(base.get(key, []), list) else []
        mine = own.get(key)
        for g in mine if isinstance(mine, list) else []:
            keys = [_data_key(x) for x in merged]
            k = _data_key(g)
            if k is not None and k in keys:
                merged[keys.index(k)] = g
            else:
                merged.append(g)
        out[key] = merged
    return out


def _data_key(group: Any) -> tuple | None:
    match = group.get("match") if isinstance(group, dict) else None
    try:
        return _match_key(match if isinstance(match, dict) else {})
    except TypeError:  # an unhashable (invalid) match value: never equal to another group
        return None
