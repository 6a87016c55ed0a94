"""A minimal, read-only view of a NInfer v1 artifact (`.ninfer`): the runtime's own reader.

Parses only the framing (16-byte prefix: magic + little-endian u64 JSON length), the JSON
directory and the payload offset; every object's bytes are a zero-copy memoryview of one mmap.
Validation beyond the framing is the compiler's job: the runtime only checks that the artifact's
directory hash equals the one the plan was compiled for (`directory_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import NinferRuntimeError

MAGIC = b"NINFER\x00\x01"
PREFIX_BYTES = 16
PAYLOAD_ALIGN = 4096

# The row-split formats. Their plane geometry is not repeated here: the loader binds them with the
# plan's kernel library (`linear.weights` + the emitted `_ext/artifact/formats.py`).
GROUPED = frozenset({"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"})


class ArtifactViewError(NinferRuntimeError):
    """The file is not a readable NInfer v1 artifact (one line)."""


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class ObjectEntry:
    name: str
    kind: str  # "tensor" | "resource"
    offset: int  # payload-relative
    bytes: int
    shape: tuple[int, ...] | None = None
    format: str | None = None
    layout: str | None = None


class ArtifactView:
    """`ArtifactView.open(path)`; attributes `path`, `model_id`, `objects` (name -> ObjectEntry,
    file order), `json_bytes`, `payload_offset`; `directory_sha256()`, `span(name)`,
    `resource_bytes(name)`, `close()`. Context manager."""

    def __init__(self, path: Path, fh, mm: mmap.mmap, json_bytes: bytes, payload_offset: int,
                 model_id: str, objects: dict[str, ObjectEntry]):
        self.path = path
        self._fh = fh
        self._mm = mm
        self.json_bytes = json_bytes
        self.payload_offset = payload_offset
        self.model_id = model_id
        self.objects = objects
        self._sha: str | None = None

    @classmethod
    def open(cls, path) -> "ArtifactView":
        path = Path(path)
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise ArtifactViewError(f"{path}: cannot open artifact: {exc.strerror or exc}") from None
        try:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(PREFIX_BYTES)
            if len(head) < PREFIX_BYTES or head[:8] != MAGIC:
                raise ArtifactViewError(f"{path}: not a NInfer v1 artifact (bad magic)")
            (jlen,) = struct.unpack("<Q", head[8:16])
            if jlen == 0 or PREFIX_BYTES + jlen > size:
                raise ArtifactViewError(f"{path}: JSON directory length {jlen} exceeds the file ({size} bytes)")
            payload_offset = _align(PREFIX_BYTES + jlen, PAYLOAD_ALIGN)
            if payload_offset > size:
                raise ArtifactViewError(f"{path}: file ends before the payload offset {payload_offset}")
            # ACCESS_COPY: writable (copy-on-write) pages, so torch.frombuffer needs no read-only
            # warning and never writes back to the file.
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            json_bytes = bytes(mm[PREFIX_BYTES:PREFIX_BYTES + jlen])
            try:
                root = json.loads(json_bytes.decode("utf-8"))
                model_id = root["model_id"]
                objects: dict[str, ObjectEntry] = {}
                for o in root["objects"]:
                    e = ObjectEntry(name=o["name"], kind=o["kind"], offset=int(o["offset"]), bytes=int(o["bytes"]),
                                    shape=tuple(int(d) for d in o["shape"]) if "shape" in o else None,
                                    format=o.get("format"), layout=o.get("layout"))
                    if payload_offset + e.offset + e.bytes > size:
                        raise ArtifactViewError(f"{path}: object {e.name} extends past the end of the file")
                    objects[e.name] = e
            except ArtifactViewError:
                raise
            except (ValueError, KeyError, TypeError) as exc:
                raise ArtifactViewError(f"{path}: malformed JSON directory: {exc}") from None
        except BaseException:
            fh.close()
            raise
        return cls(path, fh, mm, json_bytes, payload_offset, model_id, objects)

    def __enter__(self) -> "ArtifactView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def directory_sha256(self) -> str:
        if self._sha is None:
            self._sha = hashlib.sha256(self.json_bytes).hexdigest()
        return self._sha

    def entry(self, name: str) -> ObjectEntry:
        e = self.objects.get(name)
        if e is None:
            raise ArtifactViewError(f"{self.path}: no object {name!r}")
        return e

    def span(self, name: str) -> memoryview:
        """The object's payload bytes, zero-copy (a writable copy-on-write view of the mmap)."""
        e = self.entry(name)
        start = self.payload_offset + e.offset
        return memoryview(self._mm)[start:start + e.bytes]

    def has_resource(self, name: str) -> bool:
        e = self.objects.get(name)
        return e is not None and e.kind == "resource"

    def resource_bytes(self, name: str) -> bytes:
        e = self.entry(name)
        if e.kind != "resource":
            raise ArtifactViewError(f"{self.path}: object {name!r} is a {e.kind}, not a resource")
        return bytes(self.span(name))

    def close(self) -> None:
        # Tensors made with torch.frombuffer may still reference the map; closing it then raises
        # BufferError. Leave the map to the garbage collector in that case.
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        self._fh.close()
