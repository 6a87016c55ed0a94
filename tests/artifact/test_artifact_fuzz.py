"""Property test: whatever happens to a valid artifact's header, only ArtifactError escapes
`Artifact.open`, and any artifact that opens decodes every object without other exceptions."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifact_testlib import sample_items
from ninfer_compile.artifact import Artifact, write_artifact
from ninfer_compile.errors import ArtifactError

_DIR = Path(tempfile.mkdtemp(prefix="ninfer-fuzz-"))  # at import (hypothesis tests take no tmp_path fixture)
atexit.register(shutil.rmtree, _DIR, True)  # removed when the (xdist worker) process ends: nothing left in /tmp
_BASE_PATH = _DIR / "base.ninfer"
write_artifact(_BASE_PATH, "fuzz", sample_items())
BASE = _BASE_PATH.read_bytes()
JSON_LEN = int.from_bytes(BASE[8:16], "little")
ROOT = json.loads(BASE[16:16 + JSON_LEN])
HEADER_END = 4096  # prefix + JSON + padding

odd_values = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-2**70, max_value=2**70), st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=300), max_size=4), st.just({}),
    st.sampled_from(["BF16", "Q4G64_F16S", "W8G32_F16S", "row-split-k128-v1", "contiguous-le-v1",
                     "raw-bytes-v1", "tensor", "resource"]),
)


def check(data: bytes) -> None:
    path = _DIR / "case.ninfer"
    path.write_bytes(data)
    try:
        art = Artifact.open(path)
    except ArtifactError as exc:
        assert "\n" not in str(exc)
        return
    with art:
        for obj in art.objects:
            try:
                if obj.kind == "resource":
                    assert len(art.resource_bytes(obj.name)) == obj.bytes
                else:
                    value = art.load(obj.name)
                    assert isinstance(value, torch.Tensor)
            except ArtifactError:
                pass


def rebuild(root: object, payload: bytes) -> bytes:
    text = json.dumps(root, separators=(",", ":")).encode()
    head = b"NINFER\x00\x01" + len(text).to_bytes(8, "little") + text
    head += bytes(-len(head) % 4096)
    return head + payload


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, 16 + JSON_LEN + 8), st.integers(1, 255)),
                      min_size=1, max_size=6))
def test_byte_flips_in_header(flips):
    data = bytearray(BASE)
    for position, mask in flips:
        data[position] ^= mask
    check(bytes(data))


@SETTINGS
@given(index=st.integers(0, len(ROOT["objects"])), action=st.sampled_from(["delete", "insert", "retype"]),
       member=st.sampled_from(["name", "kind", "shape", "format", "layout", "encoding", "offset",
                               "bytes", "model_id", "objects", "extra"]),
       value=odd_values)
def test_json_member_mutations(index, action, member, value):
    root = json.loads(json.dumps(ROOT))
    target = root if index == len(root["objects"]) else root["objects"][index]
    if action == "delete":
        target.pop(member, None)
    else:  # insert a new member or change an existing one's type/value
        target[member] = value
    check(rebuild(root, BASE[HEADER_END:]))


@settings(SETTINGS, max_examples=60)
@given(size=st.integers(0, len(BASE)))
def test_truncation(size):
    check(BASE[:size])


@SETTINGS
@given(dims=st.lists(st.integers(1, 300), min_size=0, max_size=3),
       fmt=st.sampled_from(["BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]),
       index=st.integers(0, 8))
def test_shape_and_format_swaps_with_consistent_sizes(dims, fmt, index):
    """Rewrite one object to another (format, shape) and fix `bytes` so that geometry checks
    are what decides; any artifact that opens must decode."""
    from ninfer_compile.artifact.formats import FORMATS, encoded_size

    root = json.loads(json.dumps(ROOT))
    entry = root["objects"][index % len(root["objects"])]
    if entry["kind"] != "tensor":
        return
    entry.update(format=fmt, layout=FORMATS[fmt].layout, shape=dims)
    try:
        entry["bytes"] = encoded_size(fmt, dims)
    except ArtifactError:
        pass
    check(rebuild(root, BASE[HEADER_END:] + bytes(8192)))
