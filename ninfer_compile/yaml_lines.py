"""The one YAML reader for user-editable files: bounded, alias-free, with a line for every path.

Route tables (`routes/`), model contracts (`contracts/`) and the fusion rules (`passes/`) are read
through `parse_yaml_with_lines` (or `safe_load` where no lines are needed). Hostile or careless input
is refused before it can cost time or memory:

- size: at most `MAX_YAML_BYTES` (1 MiB, 15x the largest shipped table) of text; a file is refused
  from its size, unread. PyYAML's pure-Python scanner reads some 50-100 KB/s on a loaded 2-core
  box, so the limit also bounds the time a hostile file can cost (seconds, not minutes);
- aliases (`*name`) are refused where they appear (anchors alone are harmless). An alias makes a
  shared subtree, and walking shared subtrees as a tree is exponential: the 331-byte "billion laughs"
  document of issue 10 grew past 5 GB. No shipped file uses aliases;
- at most `MAX_YAML_NODES` nodes (100 000; routes/sm90.yaml has 8 000) and `MAX_YAML_DEPTH` levels
  of nesting (64).

The composer runs over libyaml's C parser when PyYAML has it (the pure-Python one otherwise) with
our own node hook, so an alias is refused as a parser event, before any node is shared. Duplicate
mapping keys (which PyYAML would silently resolve to the last one) are reported per key with the
line of the first occurrence; the caller decides whether they are fatal.

Errors are `YamlInputError` with `.line` (1-based) and `.problem`; callers wrap them in their own
error class and format (`file:line: field: ...`, with `format_path` and `nearest_line`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.resolver import Resolver

from .errors import NinferError

MAX_YAML_BYTES = 1 * 2**20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64

Path_ = tuple  # a field path: mapping keys and sequence indices


class YamlInputError(NinferError):
    """A YAML document refused: `.line` (1-based), `.problem` (one line), `.syntax` (True for a
    YAML syntax error, False for a refused construct or a bound)."""

    def __init__(self, source: str, line: int, problem: str, *, syntax: bool = False):
        self.source = source
        self.line = line
        self.problem = problem
        self.syntax = syntax
        super().__init__(f"{source}:{line}: {problem}")


class _Refused(Exception):
    def __init__(self, mark, problem: str):
        self.mark = mark
        self.problem = problem


try:  # libyaml's parser lives in yaml.cyaml (the yaml package itself exports only its loaders)
    from yaml.cyaml import CParser as _CParser
except ImportError:
    _CParser = None
if _CParser is not None:  # libyaml's scanner + parser, our composer (its methods come first)
    _BASES: tuple = (Composer, _CParser, SafeConstructor, Resolver)
else:
    _BASES = (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, Composer, SafeConstructor, Resolver)


class _BoundedLoader(*_BASES):  # type: ignore[misc]
    """Composer over the parser that refuses aliases and bounds node count and depth."""

    def __init__(self, text: str, max_nodes: int, max_depth: int):
        if _CParser is not None:
            _CParser.__init__(self, text)
        else:
            yaml.reader.Reader.__init__(self, text)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._max_nodes = max_nodes
        self._max_depth = max_depth
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.get_event()
            raise _Refused(event.start_mark, f"alias *{event.anchor}: YAML aliases are not allowed "
                                             f"(write the value out)")
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise _Refused(self.peek_event().start_mark, f"more than {self._max_nodes} YAML nodes")
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise _Refused(self.peek_event().start_mark, f"nesting deeper than {self._max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


@dataclass
class LinedYaml:
    """Plain data (dicts, lists, scalars) with the 1-based line of every field path."""

    source: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=lambda: {(): 1})
    # (line, path of the repeated key, line of its first occurrence); the first one is kept in `data`
    duplicates: list[tuple[int, Path_, int]] = field(default_factory=list)

    def line_of(self, path) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        return nearest_line(self.lines, path)


def format_path(path, top: str = "(top)") -> str:
    """A field path for a message: ('inventory', 3, 'tensors', 0) -> 'inventory[3].tensors[0]'
    (an int is an index, a bool a key); `top` for the empty path (callers keep their spelling)."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or top


def nearest_line(lines: dict, path, default: int = 1) -> int:
    """The line of `path`, or of its nearest ancestor in `lines` (`default` if none has one)."""
    p = tuple(path)
    for end in range(len(p), -1, -1):
        line = lines.get(p[:end])
        if line is not None:
            return line
    return default


def check_size(source: str, nbytes: int, max_bytes: int | None = None) -> None:
    max_bytes = MAX_YAML_BYTES if max_bytes is None else max_bytes
    if nbytes > max_bytes:
        raise YamlInputError(source, 1, f"{nbytes} bytes of YAML, more than the {_size(max_bytes)} "
                                        f"limit for a YAML input")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n} bytes"


def read_yaml_bytes(path: Path | str, max_bytes: int | None = None) -> bytes:
    """The bytes of a YAML file, refused from its size before it is read (OSError passes through:
    callers name the file in their own words)."""
    path = Path(path)
    max_bytes = MAX_YAML_BYTES if max_bytes is None else max_bytes
    with open(path, "rb") as fh:
        check_size(str(path), os.fstat(fh.fileno()).st_size, max_bytes)
        raw = fh.read(max_bytes + 1)
    check_size(str(path), len(raw), max_bytes)
    return raw


def read_yaml_text(path: Path | str, max_bytes: int | None = None) -> str:
    """`read_yaml_bytes` decoded as UTF-8 (UnicodeDecodeError passes through)."""
    return read_yaml_bytes(path, max_bytes).decode("utf-8")


def parse_yaml_with_lines(text: str, source: str, *, max_bytes: int | None = None,
                          max_nodes: int | None = None, max_depth: int | None = None) -> LinedYaml:
    """Parse one YAML document (see the module doc for what is refused; the bounds default to the
    module's constants). An empty document gives `data` None. Non-scalar mapping keys are refused."""
    check_size(source, len(text.encode("utf-8", "surrogatepass")), max_bytes)
    loader = _BoundedLoader(text, MAX_YAML_NODES if max_nodes is None else max_nodes,
                            MAX_YAML_DEPTH if max_depth is None else max_depth)
    try:
        try:
            root = loader.get_single_node()
        except _Refused as exc:
            raise YamlInputError(source, exc.mark.line + 1 if exc.mark else 1, exc.problem) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise YamlInputError(source, mark.line + 1 if mark is not None else 1,
                                 str(exc.problem or exc.context or exc), syntax=True) from None
        except yaml.YAMLError as exc:
            raise YamlInputError(source, 1, str(exc).splitlines()[0] if str(exc) else "invalid YAML",
                                 syntax=True) from None
        doc = LinedYaml(source, None)
        if root is not None:
            doc.lines[()] = root.start_mark.line + 1
            doc.data = _build(loader, doc, root, ())
        return doc
    finally:
        loader.dispose()


def _scalar(loader: _BoundedLoader, doc: LinedYaml, node: yaml.Node) -> Any:
    try:
        return loader.construct_object(node)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark or node.start_mark
        raise YamlInputError(doc.source, mark.line + 1, str(exc.problem or exc), syntax=True) from None


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _build(loader: _BoundedLoader, doc: LinedYaml, node: yaml.Node, path: Path_) -> Any:
    """Plain data from the (alias-free, hence tree-shaped) node tree, recording lines."""
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
        raise YamlInputError(doc.source, node.start_mark.line + 1,
                             f"tag {node.tag!r} is not allowed (plain mappings and lists only)", syntax=True)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # merge keys (`<<`) need an alias, so this only checks them
        out: dict = {}
        for key_node, value_node in node.value:
            kline = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlInputError(doc.source, kline, "mapping keys must be scalars")
            key = _scalar(loader, doc, key_node)
            kpath = path + (key,)
            if key in out:
                doc.duplicates.append((kline, kpath, doc.lines[kpath]))
                continue
            doc.lines[kpath] = kline
            out[key] = _build(loader, doc, value_node, kpath)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            ipath = path + (i,)
            doc.lines[ipath] = item.start_mark.line + 1
            items.append(_build(loader, doc, item, ipath))
        return items
    return _scalar(loader, doc, node)


def safe_load(text: str, source: str, **bounds) -> Any:
    """Plain data of a YAML document under the same bounds; duplicate keys are an error."""
    doc = parse_yaml_with_lines(text, source, **bounds)
    if doc.duplicates:
        line, path, first = doc.duplicates[0]
        raise YamlInputError(source, line, f"duplicate key {path[-1]!r} (first at line {first})")
    return doc.data
