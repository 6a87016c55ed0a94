"""Deterministic NInfer v1 writer.

The whole directory (names, shapes, formats, offsets, byte counts) is computed up front from the
object specs, so the JSON is final before any payload is written; payloads then stream to disk in
spec order. Layout rules: compact JSON with stable member order, first object at payload offset 0,
each object at the next multiple of its alignment (tensors 256, resources 1), zero padding, file
truncated at the last object's end. Output goes to `<path>.tmp` and is renamed over `path` only
when every object was written.

`plan_directory(model_id, specs)` exposes the same computation without writing anything.
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Sequence, Union

from ..errors import ArtifactError
from .formats import (
    FORMATS,
    MAGIC,
    MAX_FILE_BYTES,
    RAW_BYTES,
    align_up,
    display,
    encoded_size,
    normalize_shape,
    object_alignment,
    payload_offset_for,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: logical `shape` and registered `format` (its layout is implied)."""

    name: str
    shape: tuple[int, ...]
    format: str

    def __post_init__(self) -> None:
        # Accept any int sequence (lists, torch.Size) but store a plain tuple of ints.
        try:
            shape = tuple(operator.index(d) for d in self.shape)
        except TypeError:
            raise ArtifactError(f"tensor {display(self.name)}: shape {self.shape!r} is not a "
                                f"sequence of integers") from None
        object.__setattr__(self, "shape", shape)

    @property
    def kind(self) -> str:
        return "tensor"


@dataclass(frozen=True)
class ResourceSpec:
    """A `raw-bytes-v1` resource of exactly `nbytes` (> 0) bytes."""

    name: str
    nbytes: int

    @property
    def kind(self) -> str:
        return "resource"


ObjectSpec = Union[TensorSpec, ResourceSpec]


@dataclass(frozen=True)
class PlannedObject:
    """One directory entry as it will be written: payload-relative `offset`, exact `bytes`."""

    spec: ObjectSpec
    offset: int
    bytes: int

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def end(self) -> int:
        return self.offset + self.bytes


@dataclass(frozen=True)
class DirectoryPlan:
    """The complete directory of an artifact: JSON bytes, payload offset and file size."""

    model_id: str
    objects: tuple[PlannedObject, ...]
    json_text: bytes
    payload_offset: int
    file_size: int

    def prefix(self) -> bytes:
        """The 16-byte prefix: magic + little-endian u64 JSON length."""
        return MAGIC + len(self.json_text).to_bytes(8, "little")

    def header(self) -> bytes:
        """Prefix + JSON + zero padding up to `payload_offset`."""
        head = self.prefix() + self.json_text
        return head + bytes(self.payload_offset - len(head))


def _entry(obj: PlannedObject) -> dict[str, Any]:
    spec = obj.spec
    if isinstance(spec, TensorSpec):
        return {"name": spec.name, "kind": "tensor", "shape": list(spec.shape), "format": spec.format,
                "layout": FORMATS[spec.format].layout, "offset": obj.offset, "bytes": obj.bytes}
    return {"name": spec.name, "kind": "resource", "encoding": RAW_BYTES, "offset": obj.offset,
            "bytes": obj.bytes}


def plan_directory(model_id: str, specs: Sequence[ObjectSpec]) -> DirectoryPlan:
    """Compute offsets, byte counts and the compact JSON directory for `specs` (in file order).

    ArtifactError (naming the spec index and name) for an empty inventory, a duplicate or empty
    name, an unregistered format, an illegal shape, or a non-positive resource size.
    """
    if not isinstance(model_id, str) or not model_id:
        raise ArtifactError(f"model_id must be a nonempty string, got {model_id!r}")
    specs = list(specs)
    if not specs:
        raise ArtifactError(f"{model_id}: an artifact needs at least one object")
    seen: dict[str, int] = {}
    planned: list[PlannedObject] = []
    cursor = 0
    for index, spec in enumerate(specs):
        name = getattr(spec, "name", None)
        where = f"object {index} {display(name)}" if isinstance(name, str) else f"object {index}"
        if not isinstance(spec, (TensorSpec, ResourceSpec)):
            raise ArtifactError(f"{where}: expected a TensorSpec or ResourceSpec, got {type(spec).__name__}")
        if not isinstance(name, str) or not name:
            raise ArtifactError(f"{where}: name must be a nonempty string")
        if name in seen:
            raise ArtifactError(f"{where}: name duplicates object {seen[name]}")
        seen[name] = index
        if isinstance(spec, TensorSpec):
            try:
                normalize_shape(spec.format, spec.shape)
                nbytes = encoded_size(spec.format, spec.shape)
            except ArtifactError as exc:
                raise ArtifactError(f"{where}: {exc}") from None
        else:
            nbytes = spec.nbytes
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
                raise ArtifactError(f"{where}: resource size must be a positive integer, got {nbytes!r}")
        offset = align_up(cursor, object_alignment(spec.kind))
        planned.append(PlannedObject(spec, offset, nbytes))
        cursor = offset + nbytes
    root = {"model_id": model_id, "objects": [_entry(p) for p in planned]}
    try:
        json_text = json.dumps(root, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates in a name
        raise ArtifactError(f"{model_id}: a name is not encodable as UTF-8 ({exc.reason})") from None
    payload_offset = payload_offset_for(len(json_text))
    file_size = payload_offset + cursor
    if file_size > MAX_FILE_BYTES:
        raise ArtifactError(f"{model_id}: artifact would be {file_size} bytes, above the 2^63-1 limit")
    return DirectoryPlan(model_id, tuple(planned), json_text, payload_offset, file_size)


_ZEROS = bytes(1 << 16)


def _write_zeros(fh: BinaryIO, count: int) -> None:
    while count > 0:
        step = min(count, len(_ZEROS))
        fh.write(_ZEROS[:step])
        count -= step


def _bytes_view(payload: object, where: str) -> memoryview:
    try:
        view = memoryview(payload)
    except TypeError:
        raise ArtifactError(f"{where}: payload of type {type(payload).__name__} is not bytes-like") from None
    if not view.contiguous:
        raise ArtifactError(f"{where}: payload buffer is not contiguous")
    return view.cast("B") if (view.ndim != 1 or view.format != "B") else view


class ArtifactWriter:
    """Streams an artifact to `<path>.tmp`, then renames it to `path`.

    Usage::

        with ArtifactWriter(path, model_id, specs) as w:
            for spec in specs:
                w.write(spec.name, payload)      # exact encoded bytes, in spec order

    Leaving the `with` block with an exception, or with objects unwritten, removes the temporary
    file and leaves `path` untouched (the latter raises ArtifactError).
    """

    def __init__(self, path: str | os.PathLike, model_id: str, specs: Sequence[ObjectSpec]):
        self.path = Path(path)
        self.tmp_path = Path(str(self.path) + ".tmp")
        self.plan = plan_directory(model_id, specs)
        self._fh: BinaryIO | None = None
        self._next = 0
        self._position = 0

    # -- streaming write -------------------------------------------------------------------
    def __enter__(self) -> "ArtifactWriter":
        try:
            self._fh = open(self.tmp_path, "wb")
            self._fh.write(self.plan.header())
        except OSError as exc:
            self._abort()
            raise ArtifactError(f"{self.tmp_path}: cannot write: {exc.strerror or exc}") from None
        self._next, self._position = 0, 0
        return self

    def write(self, name: str, payload: object) -> None:
        """Write the next object's payload (must be `name`, in spec order, of exact size)."""
        obj, where = self._next_object(name)
        view = _bytes_view(payload, where)
        if view.nbytes != obj.bytes:
            raise ArtifactError(f"{where}: payload is {view.nbytes} bytes, expected {obj.bytes}")
        self._emit(obj, where, [view])

    def write_chunks(self, name: str, chunks) -> int:
        """Stream the next object's payload from an iterable of byte chunks (never holding the
        whole payload); the chunks must add up to the object's exact size. Returns bytes written."""
        obj, where = self._next_object(name)
        views = (_bytes_view(c, where) for c in chunks)
        written = self._emit(obj, where, views)
        if written != obj.bytes:
            raise ArtifactError(f"{where}: payload is {written} bytes, expected {obj.bytes}")
        return written

    def _next_object(self, name: str):
        if self._fh is None:
            raise ArtifactError(f"{self.path}: write({display(name)}) outside `with ArtifactWriter(...)`")
        objects = self.plan.objects
        if self._next >= len(objects):
            raise ArtifactError(f"{self.path}: object {display(name)} written after all "
                                f"{len(objects)} objects")
        obj = objects[self._next]
        where = f"{self.path}: object {self._next} {display(obj.name)}"
        if name != obj.name:
            raise ArtifactError(f"{where}: expected next in spec order, got {display(name)}")
        return obj, where

    def _emit(self, obj, where: str, views) -> int:
        written = 0
        try:
            _write_zeros(self._fh, obj.offset - self._position)
            for view in views:
                if written + view.nbytes > obj.bytes:
                    raise ArtifactError(f"{where}: payload exceeds the expected {obj.bytes} bytes")
                self._fh.write(view)
                written += view.nbytes
        except OSError as exc:
            raise ArtifactError(f"{where}: cannot write: {exc.strerror or exc}") from None
        self._position = obj.offset + written
        self._next += 1
        return written

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._abort()
            return
        if self._next != len(self.plan.objects):
            missing = self.plan.objects[self._next].name
            self._abort()
            raise ArtifactError(f"{self.path}: object {self._next} {display(missing)} was never written "
                                f"({self._next} of {len(self.plan.objects)} written)")
        self._finish()

    def _finish(self) -> None:
        assert self._fh is not None
        try:
            # Sequential writes already end at the last object; truncate defensively so a reused
            # temporary file never keeps stale trailing bytes.
            self._fh.truncate(self.plan.file_size)
            self._fh.close()
            self._fh = None
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            self._abort()
            raise ArtifactError(f"{self.path}: cannot finish writing: {exc.strerror or exc}") from None
        except BaseException:  # an interrupt: no temp file left behind
            self._abort()
            raise

    def _abort(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        try:
            os.unlink(self.tmp_path)
        except OSError:
            pass

    # -- header-only artifacts -------------------------------------------------------------
    def write_sparse(self) -> None:
        """Write only prefix + JSON + padding and extend the file to its final size with a hole.

        The result is a structurally valid artifact whose payloads read as zero bytes (all-zero
        codes and scales, zero words) without occupying disk — for inventory-only tests of full
        size models.
        """
        if self._fh is not None:
            raise ArtifactError(f"{self.path}: write_sparse() cannot be used inside `with`")
        try:
            with open(self.tmp_path, "wb") as fh:
                self._fh = fh
                fh.write(self.plan.header())
                fh.truncate(self.plan.file_size)
            self._fh = None
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            self._abort()
            raise ArtifactError(f"{self.path}: cannot write: {exc.strerror or exc}") from None
        except BaseException:  # an interrupt: no temp file left behind
            self._abort()
            raise


def spec_and_payload(name: str, value: object) -> tuple[ObjectSpec, bytes]:
    """Infer the object spec and encode the payload of one `write_artifact` item.

    torch.bfloat16 / float32 / int32 tensor → BF16 / FP32 / I32; a `QuantizedTensor` → its
    format in row-split-k128-v1; bytes / bytearray / memoryview → a raw-bytes-v1 resource.
    """
    try:
        return _spec_and_payload(name, value)
    except ArtifactError as exc:
        raise ArtifactError(f"object {display(name)}: {exc}") from None


def _spec_and_payload(name: str, value: object) -> tuple[ObjectSpec, bytes]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return ResourceSpec(name, len(data)), data
    from .codecs import QuantizedTensor, encode_direct, encode_row_split

    if isinstance(value, QuantizedTensor):
        payload = encode_row_split(value.format, value.codes, value.scales)
        return TensorSpec(name, tuple(value.codes.shape), value.format), payload
    import torch

    if isinstance(value, torch.Tensor):
        formats = {torch.bfloat16: "BF16", torch.float32: "FP32", torch.int32: "I32"}
        fmt = formats.get(value.dtype)
        if fmt is None:
            raise ArtifactError(f"dtype {value.dtype} has no direct format (BF16/FP32/I32); "
                                f"convert it explicitly")
        return TensorSpec(name, tuple(value.shape), fmt), encode_direct(fmt, value)
    raise ArtifactError(f"cannot store a {type(value).__name__} (expected a tensor, QuantizedTensor "
                        f"or bytes)")


def write_artifact(path: str | os.PathLike, model_id: str,
                   items: Iterable[tuple[str, "torch.Tensor | object"]]) -> DirectoryPlan:
    """Write an artifact from in-memory `(name, value)` items, in order (see `spec_and_payload`).

    Each payload is encoded once and kept until written; use `ArtifactWriter` directly to stream
    objects that should not all be in memory at the same time.
    """
    encoded = []
    for name, value in items:
        try:
            encoded.append(spec_and_payload(name, value))
        except ArtifactError as exc:
            raise ArtifactError(f"{path}: {exc}") from None
    writer = ArtifactWriter(path, model_id, [spec for spec, _ in encoded])
    with writer:
        for spec, payload in encoded:
            writer.write(spec.name, payload)
    return writer.plan
