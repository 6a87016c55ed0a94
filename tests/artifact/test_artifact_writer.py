"""Writer: deterministic bytes, directory layout rules, streaming contract, sparse artifacts."""

from __future__ import annotations

import json
import os

import pytest
import torch

from artifact_testlib import sample_items
from ninfer_compile.artifact import (
    Artifact,
    ArtifactWriter,
    ResourceSpec,
    TensorSpec,
    plan_directory,
    write_artifact,
)
from ninfer_compile.artifact.formats import MAGIC, encoded_size
from ninfer_compile.errors import ArtifactError


def test_output_is_deterministic(tmp_path):
    a, b = tmp_path / "a.ninfer", tmp_path / "b.ninfer"
    write_artifact(a, "m", sample_items(seed=3))
    write_artifact(b, "m", sample_items(seed=3))
    assert a.read_bytes() == b.read_bytes()
    assert not (tmp_path / "a.ninfer.tmp").exists()


def test_layout_rules(tmp_path):
    path = tmp_path / "x.ninfer"
    plan = write_artifact(path, "m", sample_items())
    raw = path.read_bytes()
    json_len = int.from_bytes(raw[8:16], "little")
    text = raw[16:16 + json_len]
    assert raw[:8] == MAGIC and text == plan.json_text
    # Compact JSON with the stable member order.
    assert text.startswith(b'{"model_id":"m","objects":[{"name":"direct/bf16","kind":"tensor","shape":[3,5],'
                           b'"format":"BF16","layout":"contiguous-le-v1","offset":0,"bytes":30}')
    assert b'"kind":"resource","encoding":"raw-bytes-v1","offset":' in text
    assert b" " not in text.replace(b'"tokens": ', b"")  # only the resource's own bytes had spaces
    assert set(raw[16 + json_len:plan.payload_offset]) == {0}
    assert plan.payload_offset % 4096 == 0 and plan.payload_offset >= 16 + json_len
    cursor = 0
    for entry in json.loads(text)["objects"]:
        align = 256 if entry["kind"] == "tensor" else 1
        assert entry["offset"] == -(-cursor // align) * align  # first permitted offset
        # Inter-object padding is zero.
        gap = raw[plan.payload_offset + cursor:plan.payload_offset + entry["offset"]]
        assert set(gap) <= {0}
        cursor = entry["offset"] + entry["bytes"]
    assert len(raw) == plan.file_size == plan.payload_offset + cursor  # truncated at last end
    assert json.loads(text)["objects"][0]["offset"] == 0


def test_plan_matches_written_directory(tmp_path):
    specs = [TensorSpec("a", (2, 130), "Q5G64_F16S"), ResourceSpec("r", 3), TensorSpec("b", [4], "FP32")]
    plan = plan_directory("m", specs)
    assert [(p.name, p.offset, p.bytes) for p in plan.objects] == [("a", 0, 528), ("r", 528, 3), ("b", 768, 16)]
    path = tmp_path / "p.ninfer"
    with ArtifactWriter(path, "m", specs) as w:
        w.write("a", bytes(528))
        w.write("r", bytearray(b"xyz"))
        w.write("b", memoryview(torch.arange(4, dtype=torch.float32).numpy()))
    with Artifact.open(path) as art:
        assert art.directory_json == plan.json_text and art.file_size == plan.file_size
        assert art.load("b").tolist() == [0.0, 1.0, 2.0, 3.0]
        assert art.resource_bytes("r") == b"xyz"


def _specs():
    return [TensorSpec("a", (3,), "FP32"), ResourceSpec("r", 2)]


def test_write_order_and_size_are_checked(tmp_path):
    path = tmp_path / "w.ninfer"
    with pytest.raises(ArtifactError, match="object 0 'a': expected next in spec order, got 'r'"):
        with ArtifactWriter(path, "m", _specs()) as w:
            w.write("r", b"xy")
    assert not path.exists() and not (tmp_path / "w.ninfer.tmp").exists()
    with pytest.raises(ArtifactError, match="object 0 'a': payload is 4 bytes, expected 12"):
        with ArtifactWriter(path, "m", _specs()) as w:
            w.write("a", bytes(4))
    with pytest.raises(ArtifactError, match="object 1 'r' was never written"):
        with ArtifactWriter(path, "m", _specs()) as w:
            w.write("a", bytes(12))
    assert not path.exists() and not (tmp_path / "w.ninfer.tmp").exists()


def test_write_chunks_streams_and_checks_size(tmp_path):
    """write_chunks gives the same bytes as write, and refuses short or long streams."""
    whole, chunked = tmp_path / "whole.ninfer", tmp_path / "chunked.ninfer"
    payload = bytes(range(12))
    with ArtifactWriter(whole, "m", _specs()) as w:
        w.write("a", payload)
        w.write("r", b"xy")
    with ArtifactWriter(chunked, "m", _specs()) as w:
        assert w.write_chunks("a", [payload[:5], memoryview(payload)[5:11], payload[11:]]) == 12
        w.write_chunks("r", iter([b"x", b"y"]))
    assert whole.read_bytes() == chunked.read_bytes()
    with pytest.raises(ArtifactError, match="object 0 'a': payload is 8 bytes, expected 12"):
        with ArtifactWriter(tmp_path / "short.ninfer", "m", _specs()) as w:
            w.write_chunks("a", [bytes(8)])
    with pytest.raises(ArtifactError, match="object 0 'a': payload exceeds the expected 12 bytes"):
        with ArtifactWriter(tmp_path / "long.ninfer", "m", _specs()) as w:
            w.write_chunks("a", [bytes(8), bytes(8)])
    assert not (tmp_path / "short.ninfer").exists() and not (tmp_path / "long.ninfer").exists()


def test_failed_write_keeps_previous_file(tmp_path):
    path = tmp_path / "keep.ninfer"
    write_artifact(path, "m", [("x", b"old")])
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with ArtifactWriter(path, "m", _specs()) as w:
            w.write("a", bytes(12))
            raise RuntimeError("converter crashed")
    assert path.read_bytes() == before and not (tmp_path / "keep.ninfer.tmp").exists()


@pytest.mark.parametrize("specs,needle", [
    ([], "at least one object"),
    ([TensorSpec("a", (3,), "FP32"), ResourceSpec("a", 2)], "object 1 'a': name duplicates object 0"),
    ([TensorSpec("", (3,), "FP32")], "name must be a nonempty string"),
    ([TensorSpec("a", (3,), "FP16")], "object 0 'a': format 'FP16' is not registered"),
    ([TensorSpec("a", (3,), "Q4G64_F16S")], "object 0 'a': rank 1 is illegal"),
    ([TensorSpec("a", (0, 3), "BF16")], "not positive"),
    ([ResourceSpec("r", 0)], "object 0 'r': resource size must be a positive integer"),
])
def test_invalid_specs_rejected(specs, needle):
    with pytest.raises(ArtifactError, match=needle):
        plan_directory("m", specs)


def test_write_artifact_rejects_unstorable_values(tmp_path):
    with pytest.raises(ArtifactError, match="object 'x': dtype torch.float16 has no direct format"):
        write_artifact(tmp_path / "f.ninfer", "m", [("x", torch.zeros(2, dtype=torch.float16))])
    with pytest.raises(ArtifactError, match="object 'y': cannot store a list"):
        write_artifact(tmp_path / "f.ninfer", "m", [("y", [1, 2])])


def test_sparse_header_only_artifact(tmp_path):
    # A realistic-size inventory: ~1.3 GB of payload that never touches the disk.
    specs = [TensorSpec(f"text/layers/{i}/mlp/down", (5120, 17408), "Q4G64_F16S") for i in range(25)]
    specs.append(ResourceSpec("frontend/tokenizer.json", 12345))
    path = tmp_path / "sparse.ninfer"
    writer = ArtifactWriter(path, "qwen3.6-27b", specs)
    writer.write_sparse()
    st = os.stat(path)
    assert st.st_size == writer.plan.file_size
    assert st.st_size > 25 * encoded_size("Q4G64_F16S", (5120, 17408))
    with Artifact.open(path) as art:
        assert len(art.objects) == 26
        rows = art.load_quantized("text/layers/3/mlp/down", rows=(100, 2))  # the hole reads as zeros
        assert rows.codes.abs().sum() == 0 and rows.scales.float().abs().sum() == 0
