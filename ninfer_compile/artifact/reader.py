"""Memory-mapped, fully validating reader for NInfer v1 `.ninfer` artifacts.

`Artifact.open(path)` validates the 16-byte prefix, the UTF-8 JSON directory against the closed
schema, the registries, encoded sizes and payload geometry, then exposes zero-copy payload spans.
It never reads the payload region: only the prefix and JSON are touched at open, payload pages are
faulted in by the mmap when a span is decoded.

Every malformed input raises `ArtifactError` with one line naming the file, the object (index and
name when known) and the field; no other exception type escapes `open`.

Decoding (`load`, `load_quantized`) imports the torch codecs lazily so that directory-only users
(`ninfer-compile inspect`) never import torch.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Union

from ..errors import ArtifactError
from .formats import (
    FORMATS,
    LAYOUT_RANKS,
    MAGIC,
    MAX_FILE_BYTES,
    PREFIX_BYTES,
    RESOURCE_ENCODINGS,
    TENSOR_LAYOUTS,
    display,
    encoded_size,
    object_alignment,
    payload_offset_for,
    shape_text,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .codecs import QuantizedTensor


@dataclass(frozen=True)
class TensorObject:
    """A validated tensor directory entry; `offset` is payload-relative, `bytes` exact."""

    name: str
    shape: tuple[int, ...]
    format: str
    layout: str
    offset: int
    bytes: int

    @property
    def kind(self) -> str:
        return "tensor"


@dataclass(frozen=True)
class ResourceObject:
    """A validated required-resource directory entry (`raw-bytes-v1`: the span is the value)."""

    name: str
    encoding: str
    offset: int
    bytes: int

    @property
    def kind(self) -> str:
        return "resource"


ArtifactObject = Union[TensorObject, ResourceObject]

TENSOR_MEMBERS = ("name", "kind", "shape", "format", "layout", "offset", "bytes")
RESOURCE_MEMBERS = ("name", "kind", "encoding", "offset", "bytes")
ROOT_MEMBERS = ("model_id", "objects")


def _json_type(value: Any) -> str:
    """JSON spelling of a decoded value's type, for messages ("boolean true", "number 1.5")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean " + ("true" if value else "false")
    if isinstance(value, int):
        return f"integer {value}" if abs(value) < 10**30 else "a huge integer"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {display(value, 60)}"
    if isinstance(value, list):
        return f"array of {len(value)}"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__  # pragma: no cover - json never produces anything else


class _DirectoryParser:
    """Validates a decoded JSON directory; one instance per open, holds the message context."""

    def __init__(self, label: str):
        self.label = label

    # -- message helpers -------------------------------------------------------------------
    def fail(self, where: str, text: str) -> ArtifactError:
        return ArtifactError(f"{self.label}: {where}{text}")

    @staticmethod
    def where(index: int, name: str | None) -> str:
        return f"object {index} {display(name)}: " if name is not None else f"object {index}: "

    # -- scalar checks ---------------------------------------------------------------------
    def string(self, where: str, obj: dict, field: str) -> str:
        value = obj[field]
        if not isinstance(value, str) or not value:
            want = "a nonempty string"
            raise self.fail(where, f"field '{field}' must be {want}, got {_json_type(value)}")
        return value

    def integer(self, where: str, obj: dict, field: str, minimum: int) -> int:
        value = obj[field]
        # bool is a subclass of int in Python, but JSON true/false is not an integer.
        if type(value) is not int:
            kind = "nonnegative" if minimum == 0 else "positive"
            raise self.fail(where, f"field '{field}' must be a {kind} integer, got {_json_type(value)}")
        if value < minimum:
            kind = "nonnegative" if minimum == 0 else "positive"
            raise self.fail(where, f"field '{field}' is {value}, must be {kind}")
        if value > MAX_FILE_BYTES:
            raise self.fail(where, f"field '{field}' is {value}, above the 2^63-1 byte limit")
        return value

    def members(self, where: str, obj: dict, expected: tuple[str, ...], what: str) -> None:
        missing = [m for m in expected if m not in obj]
        extra = [m for m in obj if m not in expected]
        if missing:
            names = ", ".join(display(m) for m in missing)
            raise self.fail(where, f"{what} is missing member{'s' if len(missing) > 1 else ''} {names}")
        if extra:
            names = ", ".join(display(m, 40) for m in extra[:5]) + (", ..." if len(extra) > 5 else "")
            raise self.fail(where, f"{what} has unexpected member{'s' if len(extra) > 1 else ''} {names}"
                            f" (allowed: {', '.join(expected)})")

    # -- objects ---------------------------------------------------------------------------
    def parse_root(self, root: Any) -> tuple[str, list]:
        if not isinstance(root, dict):
            raise self.fail("", f"JSON root must be an object, got {_json_type(root)}")
        self.members("", root, ROOT_MEMBERS, "JSON root")
        model_id = self.string("", root, "model_id")
        objects = root["objects"]
        if not isinstance(objects, list):
            raise self.fail("", f"field 'objects' must be a nonempty array, got {_json_type(objects)}")
        if not objects:
            raise self.fail("", "field 'objects' is an empty array; an artifact holds at least one object")
        return model_id, objects

    def parse_object(self, index: int, raw: Any) -> ArtifactObject:
        if not isinstance(raw, dict):
            raise self.fail(self.where(index, None), f"must be a JSON object, got {_json_type(raw)}")
        # Resolve the name first so every later message can cite it.
        name = raw.get("name")
        if "name" in raw and isinstance(name, str) and name:
            where = self.where(index, name)
        else:
            where = self.where(index, None)
            if "name" not in raw:
                raise self.fail(where, "missing member 'name'")
            self.string(where, raw, "name")
        if "kind" not in raw:
            raise self.fail(where, "missing member 'kind'")
        kind = raw["kind"]
        if kind == "tensor":
            self.members(where, raw, TENSOR_MEMBERS, "tensor object")
            return self.parse_tensor(where, raw)
        if kind == "resource":
            self.members(where, raw, RESOURCE_MEMBERS, "resource object")
            return self.parse_resource(where, raw)
        raise self.fail(where, f"field 'kind' must be \"tensor\" or \"resource\", got {_json_type(kind)}")

    def parse_tensor(self, where: str, raw: dict) -> TensorObject:
        fmt = self.string(where, raw, "format")
        layout = self.string(where, raw, "layout")
        if fmt not in FORMATS:
            raise self.fail(where, f"field 'format' is {display(fmt)}, not a registered format "
                                   f"(registered: {', '.join(FORMATS)})")
        if layout not in TENSOR_LAYOUTS:
            raise self.fail(where, f"field 'layout' is {display(layout)}, not a registered tensor layout "
                                   f"(registered: {', '.join(sorted(TENSOR_LAYOUTS))})")
        if FORMATS[fmt].layout != layout:
            raise self.fail(where, f"field 'layout' is {display(layout)}, which does not accept format "
                                   f"{fmt} (it requires {FORMATS[fmt].layout})")
        shape_raw = raw["shape"]
        if not isinstance(shape_raw, list):
            raise self.fail(where, f"field 'shape' must be an array of positive integers, "
                                   f"got {_json_type(shape_raw)}")
        lo, hi = LAYOUT_RANKS[layout]
        if not lo <= len(shape_raw) <= hi:
            want = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
            raise self.fail(where, f"field 'shape' has rank {len(shape_raw)}, {layout} requires rank {want}")
        for axis, dim in enumerate(shape_raw):
            if type(dim) is not int:
                raise self.fail(where, f"field 'shape' dimension {axis} must be a positive integer, "
                                       f"got {_json_type(dim)}")
            if dim <= 0:
                raise self.fail(where, f"field 'shape' dimension {axis} is {dim}, must be positive")
            if dim > MAX_FILE_BYTES:
                raise self.fail(where, f"field 'shape' dimension {axis} is {dim}, above the 2^63-1 limit")
        shape = tuple(shape_raw)
        offset = self.integer(where, raw, "offset", 0)
        nbytes = self.integer(where, raw, "bytes", 1)
        try:
            expected = encoded_size(fmt, shape)
        except ArtifactError as exc:
            raise self.fail(where, f"field 'shape': {exc}") from None
        if nbytes != expected:
            raise self.fail(where, f"field 'bytes' is {nbytes}, expected {expected} for {fmt} "
                                   f"{shape_text(shape)} in {layout}")
        return TensorObject(raw["name"], shape, fmt, layout, offset, nbytes)

    def parse_resource(self, where: str, raw: dict) -> ResourceObject:
        encoding = self.string(where, raw, "encoding")
        if encoding not in RESOURCE_ENCODINGS:
            raise self.fail(where, f"field 'encoding' is {display(encoding)}, not a registered resource "
                                   f"encoding (registered: {', '.join(sorted(RESOURCE_ENCODINGS))})")
        offset = self.integer(where, raw, "offset", 0)
        nbytes = self.integer(where, raw, "bytes", 1)
        return ResourceObject(raw["name"], encoding, offset, nbytes)

    def check_geometry(self, objects: list[ArtifactObject], payload_bytes: int,
                       file_size: int, payload_offset: int) -> None:
        """Ordered, aligned, non-overlapping spans inside the payload (container §5)."""
        cursor, prev = 0, None
        for index, obj in enumerate(objects):
            where = self.where(index, obj.name)
            align = object_alignment(obj.kind)
            if obj.offset % align:
                raise self.fail(where, f"field 'offset' is {obj.offset}, not a multiple of {align} "
                                       f"({obj.kind} alignment)")
            if obj.offset < cursor:
                raise self.fail(where, f"field 'offset' is {obj.offset}, before the end ({cursor}) of object "
                                       f"{prev} {display(objects[prev].name)}; objects must be ordered "
                                       f"by offset and must not overlap")
            end = obj.offset + obj.bytes
            if end > payload_bytes:
                raise self.fail(where, f"field 'offset' {obj.offset} + field 'bytes' {obj.bytes} = {end} "
                                       f"runs past the payload end {payload_bytes} (file size {file_size} "
                                       f"- payload offset {payload_offset})")
            cursor, prev = end, index


def _reject_constant(token: str) -> Any:
    # NaN / Infinity / -Infinity are Python extensions, not JSON.
    raise ValueError(f"non-JSON constant {token}")


def _unique_members(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            # Duplicate members would make the closed schema ambiguous (which one wins?).
            raise ValueError(f"duplicate member {display(key)}")
        out[key] = value
    return out


class Artifact:
    """An open, validated `.ninfer` artifact (memory-mapped; use as a context manager).

    Attributes: `path`, `model_id`, `objects` (file order), `by_name`, `payload_offset`,
    `json_bytes`, `file_size`. Payload spans are zero-copy views of the mmap.
    """

    def __init__(self, path: Path, model_id: str, objects: list[ArtifactObject], json_text: bytes,
                 payload_offset: int, file_size: int, mm: mmap.mmap | None):
        self.path = path
        self.model_id = model_id
        self.objects: tuple[ArtifactObject, ...] = tuple(objects)
        self.by_name: dict[str, ArtifactObject] = {o.name: o for o in objects}
        self.index_of: dict[str, int] = {o.name: i for i, o in enumerate(objects)}
        self.payload_offset = payload_offset
        self.json_bytes = len(json_text)
        self.file_size = file_size
        self._json_text = json_text
        self._mmap = mm
        self._view = memoryview(mm) if mm is not None else None

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike) -> "Artifact":
        """Open and fully validate `path`; ArtifactError (one line) on any malformed input."""
        try:
            path = Path(path)
        except TypeError:
            raise ArtifactError(f"{path!r}: not a file path") from None
        label = str(path) if str(path).isprintable() else ascii(str(path))
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise ArtifactError(f"{label}: cannot open: {exc.strerror or exc}") from None
        with fh:
            try:
                file_size = os.fstat(fh.fileno()).st_size
                prefix = fh.read(PREFIX_BYTES)
            except OSError as exc:
                raise ArtifactError(f"{label}: cannot read: {exc.strerror or exc}") from None
            json_bytes, payload_offset = cls._check_prefix(label, prefix, file_size)
            try:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError, OverflowError) as exc:
                raise ArtifactError(f"{label}: cannot memory-map: {exc}") from None
        try:
            json_text = mm[PREFIX_BYTES:PREFIX_BYTES + json_bytes]
            model_id, objects = cls._parse_directory(label, json_text, file_size, payload_offset)
        except BaseException:
            mm.close()
            raise
        return cls(path, model_id, objects, json_text, payload_offset, file_size, mm)

    @staticmethod
    def _check_prefix(label: str, prefix: bytes, file_size: int) -> tuple[int, int]:
        if len(prefix) < PREFIX_BYTES or file_size < PREFIX_BYTES:
            raise ArtifactError(f"{label}: file is {file_size} bytes, shorter than the "
                                f"{PREFIX_BYTES}-byte NInfer prefix")
        if prefix[:8] != MAGIC:
            raise ArtifactError(f"{label}: field 'magic' is {prefix[:8].hex(' ')}, expected "
                                f"{MAGIC.hex(' ')} (NINFER\\0 revision 1)")
        json_bytes = int.from_bytes(prefix[8:16], "little")
        if json_bytes == 0:
            raise ArtifactError(f"{label}: field 'json_bytes' is 0, must be positive")
        metadata_end = PREFIX_BYTES + json_bytes
        if metadata_end > file_size:
            raise ArtifactError(f"{label}: field 'json_bytes' is {json_bytes}, but the JSON range "
                                f"[16, {metadata_end}) runs past the file end {file_size}")
        payload_offset = payload_offset_for(json_bytes)
        if payload_offset > file_size:
            raise ArtifactError(f"{label}: file is {file_size} bytes, shorter than the payload "
                                f"offset {payload_offset} (JSON ends at {metadata_end})")
        return json_bytes, payload_offset

    @staticmethod
    def _parse_directory(label: str, json_text: bytes, file_size: int,
                         payload_offset: int) -> tuple[str, list[ArtifactObject]]:
        try:
            text = json_text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{label}: JSON directory is not valid UTF-8 (byte {exc.start}: "
                                f"{exc.reason})") from None
        try:
            root = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_members)
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{label}: JSON directory is not valid JSON: {exc.msg} "
                                f"(line {exc.lineno} column {exc.colno})") from None
        except RecursionError:
            raise ArtifactError(f"{label}: JSON directory is nested too deeply") from None
        except ValueError as exc:  # duplicate members, NaN constants, over-long integer literals
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "integer string conversion" in reason:  # Python's int-digits safety limit
                reason = "an integer literal has too many digits"
            raise ArtifactError(f"{label}: JSON directory is invalid: {reason}") from None
        parser = _DirectoryParser(label)
        model_id, raw_objects = parser.parse_root(root)
        objects: list[ArtifactObject] = []
        seen: dict[str, int] = {}
        for index, raw in enumerate(raw_objects):
            obj = parser.parse_object(index, raw)
            if obj.name in seen:
                raise parser.fail(parser.where(index, obj.name),
                                  f"field 'name' duplicates object {seen[obj.name]}; names must be unique")
            seen[obj.name] = index
            objects.append(obj)
        parser.check_geometry(objects, file_size - payload_offset, file_size, payload_offset)
        return model_id, objects

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mapping. Spans handed out earlier stay valid until they are dropped."""
        view, mm = self._view, self._mmap
        self._view = self._mmap = None
        if view is not None:
            view.release()
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # A caller still holds a span; the mapping is unmapped when the last one goes.
                pass

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Artifact({str(self.path)!r}, model_id={self.model_id!r}, objects={len(self.objects)})"

    # -- directory queries -----------------------------------------------------------------
    def _label(self) -> str:
        return str(self.path)

    def object(self, name: str) -> ArtifactObject:
        """The object `name` (tensor or resource); ArtifactError naming it if absent."""
        obj = self.by_name.get(name)
        if obj is None:
            raise ArtifactError(f"{self._label()}: no object named {display(name)}")
        return obj

    def tensor(self, name: str) -> TensorObject:
        obj = self.object(name)
        if not isinstance(obj, TensorObject):
            raise ArtifactError(f"{self._label()}: object {self.index_of[name]} {display(name)} is a "
                                f"resource, not a tensor")
        return obj

    def resource(self, name: str) -> ResourceObject:
        obj = self.object(name)
        if not isinstance(obj, ResourceObject):
            raise ArtifactError(f"{self._label()}: object {self.index_of[name]} {display(name)} is a "
                                f"tensor, not a resource")
        return obj

    def tensors(self) -> Iterator[TensorObject]:
        return (o for o in self.objects if isinstance(o, TensorObject))

    def resources(self) -> Iterator[ResourceObject]:
        return (o for o in self.objects if isinstance(o, ResourceObject))

    def directory_sha256(self) -> str:
        """sha256 (hex) of the JSON directory bytes exactly as stored."""
        return hashlib.sha256(self._json_text).hexdigest()

    @property
    def directory_json(self) -> bytes:
        return self._json_text

    # -- payload access --------------------------------------------------------------------
    def span(self, name: str) -> memoryview:
        """Zero-copy view of object `name`'s payload bytes."""
        obj = self.object(name)
        if self._view is None:
            raise ArtifactError(f"{self._label()}: artifact is closed; cannot read {display(name)}")
        start = self.payload_offset + obj.offset
        return self._view[start:start + obj.bytes]

    def resource_bytes(self, name: str) -> bytes:
        """The complete value of `raw-bytes-v1` resource `name` (a copy)."""
        self.resource(name)
        return bytes(self.span(name))

    def _context(self, name: str) -> str:
        return f"{self._label()}: object {self.index_of[name]} {display(name)}"

    def load(self, name: str) -> "torch.Tensor":
        """Tensor `name` decoded: direct formats in their own dtype (bf16/f32/i32) and logical
        shape; grouped formats dequantized to float32 [N, K]."""
        from .codecs import decode_direct

        obj = self.tensor(name)
        if FORMATS[obj.format].kind == "direct":
            try:
                return decode_direct(obj.format, obj.shape, self.span(name))
            except ArtifactError as exc:
                raise ArtifactError(f"{self._context(name)}: {exc}") from None
        return self.load_quantized(name).dequantize()

    def load_quantized(self, name: str, rows: tuple[int, int] | None = None) -> "QuantizedTensor":
        """Codes and scales of grouped tensor `name`; `rows=(begin, count)` decodes only those rows
        (read through the three plane row spans)."""
        from .codecs import decode_row_split

        obj = self.tensor(name)
        if FORMATS[obj.format].kind != "grouped":
            raise ArtifactError(f"{self._context(name)}: format {obj.format} is direct, not quantized")
        try:
            return decode_row_split(obj.format, obj.shape, self.span(name), rows=rows)
        except ArtifactError as exc:
            raise ArtifactError(f"{self._context(name)}: {exc}") from None
