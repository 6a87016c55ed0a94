"""Reader: round trips through the writer, the Artifact API, and every malformed-input class."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from artifact_testlib import VALID_PAYLOAD_BYTES, raw_artifact, sample_items, valid_root
from ninfer_compile.artifact import Artifact, write_artifact
from ninfer_compile.artifact.codecs import QuantizedTensor
from ninfer_compile.artifact.formats import MAGIC
from ninfer_compile.errors import ArtifactError


def open_error(path) -> str:
    with pytest.raises(ArtifactError) as info:
        Artifact.open(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path) + ": ")
    assert info.type is ArtifactError
    return message


# -- round trips -------------------------------------------------------------------------------

def test_round_trip_every_format_and_resource(tmp_path):
    items = sample_items()
    path = tmp_path / "all.ninfer"
    write_artifact(path, "tiny-test", items)
    with Artifact.open(path) as art:
        assert art.model_id == "tiny-test"
        assert [o.name for o in art.objects] == [name for name, _ in items]
        assert art.payload_offset == 4096 and art.file_size == path.stat().st_size
        for name, value in items:
            if isinstance(value, bytes):
                assert art.object(name).kind == "resource"
                assert art.resource_bytes(name) == value
            elif isinstance(value, QuantizedTensor):
                q = art.load_quantized(name)
                assert torch.equal(q.codes, value.codes)
                assert torch.equal(q.scales.view(torch.int16), value.scales.view(torch.int16))
                assert torch.equal(art.load(name), value.dequantize())
            else:
                loaded = art.load(name)
                assert loaded.dtype == value.dtype and loaded.shape == value.shape
                carrier = torch.int16 if value.dtype == torch.bfloat16 else torch.int32
                assert torch.equal(loaded.view(carrier), value.view(carrier))
        assert {t.format for t in art.tensors()} == {"BF16", "FP32", "I32", "Q4G64_F16S",
                                                      "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"}


def test_api_queries_and_errors(tmp_path):
    path = tmp_path / "a.ninfer"
    write_artifact(path, "m", sample_items())
    art = Artifact.open(path)
    raw = path.read_bytes()
    json_len = int.from_bytes(raw[8:16], "little")
    assert art.json_bytes == json_len
    assert art.directory_sha256() == hashlib.sha256(raw[16:16 + json_len]).hexdigest()
    obj = art.tensor("quant/Q5G64_F16S")
    span = art.span(obj.name)
    assert isinstance(span, memoryview) and span.nbytes == obj.bytes
    assert bytes(span) == raw[art.payload_offset + obj.offset:][:obj.bytes]
    assert art.by_name["direct/fp32"].kind == "tensor"
    rows = art.load_quantized("quant/Q4G64_F16S", rows=(1, 2))
    assert torch.equal(rows.codes, art.load_quantized("quant/Q4G64_F16S").codes[1:3])
    with pytest.raises(ArtifactError, match="no object named 'missing'"):
        art.tensor("missing")
    with pytest.raises(ArtifactError, match="'frontend/tokenizer.json' is a resource, not a tensor"):
        art.load("frontend/tokenizer.json")
    with pytest.raises(ArtifactError, match="is a tensor, not a resource"):
        art.resource_bytes("direct/fp32")
    with pytest.raises(ArtifactError, match="'direct/bf16': format BF16 is direct"):
        art.load_quantized("direct/bf16")
    with pytest.raises(ArtifactError, match="row range"):
        art.load_quantized("quant/Q4G64_F16S", rows=(2, 5))
    held = art.span("direct/i32")
    art.close()
    art.close()  # idempotent, even while a span is still held
    assert held.nbytes == 96
    with pytest.raises(ArtifactError, match="closed"):
        art.span("direct/fp32")


def test_gaps_and_trailing_bytes_are_allowed(tmp_path):
    root = valid_root()
    root["objects"][3]["offset"] = 2048  # a gap before the object is legal
    path = raw_artifact(tmp_path / "gap.ninfer", root, payload_bytes=4096)  # trailing bytes too
    with Artifact.open(path) as art:
        assert art.tensor("w/i32").offset == 2048 and art.load("w/i32").item() == 0


# -- malformed inputs --------------------------------------------------------------------------

def mutate(change):
    def build(tmp_path):
        root = valid_root()
        change(root)
        return raw_artifact(tmp_path / "bad.ninfer", root)
    return build


def obj(i, **fields):
    def change(root):
        for key, value in fields.items():
            if value is DELETE:
                del root["objects"][i][key]
            else:
                root["objects"][i][key] = value
    return mutate(change)


DELETE = object()
Q5_WHERE = "object 0 'w/q5': "
BF_WHERE = "object 1 'w/bf16': "
TOK_WHERE = "object 2 'tok': "
I32_WHERE = "object 3 'w/i32': "

CASES = {
    # framing
    "file shorter than prefix": (lambda p: _write(p, MAGIC[:6]), "shorter than the 16-byte"),
    "wrong magic": (lambda p: raw_artifact(p / "bad.ninfer", valid_root(), magic=b"NINFER\x00\x02"),
                    "field 'magic' is 4e 49 4e 46 45 52 00 02"),
    "json_bytes zero": (lambda p: raw_artifact(p / "bad.ninfer", valid_root(), json_bytes_field=0),
                        "field 'json_bytes' is 0"),
    "json_bytes past end": (lambda p: raw_artifact(p / "bad.ninfer", valid_root(),
                                                   json_bytes_field=2**64 - 1), "runs past the file end"),
    "truncated before payload": (lambda p: _truncate(p, 3000), "shorter than the payload offset 4096"),
    "truncated payload": (lambda p: _truncate(p, 4096 + 500),
                          Q5_WHERE + "field 'offset' 0 + field 'bytes' 528 = 528 runs past the payload end 500"),
    # JSON text
    "bad json": (lambda p: raw_artifact(p / "bad.ninfer", json_text=b'{"model_id":'), "not valid JSON"),
    "non utf8": (lambda p: raw_artifact(p / "bad.ninfer", json_text=b'{"model_id":"\xff"}'), "not valid UTF-8"),
    "duplicate member": (lambda p: raw_artifact(
        p / "bad.ninfer", json_text=b'{"model_id":"a","model_id":"b","objects":[]}'), "duplicate member 'model_id'"),
    "NaN constant": (lambda p: raw_artifact(p / "bad.ninfer", json_text=b'{"model_id":NaN}'), "non-JSON constant"),
    "huge integer literal": (lambda p: raw_artifact(p / "bad.ninfer", json_text=b'{"a":' + b"9" * 5000 + b"}"),
                             "an integer literal has too many digits"),
    "deep nesting": (lambda p: raw_artifact(p / "bad.ninfer", json_text=b"[" * 100000 + b"]" * 100000),
                     "JSON directory"),
    # root
    "root is array": (lambda p: raw_artifact(p / "bad.ninfer", [1, 2]), "JSON root must be an object"),
    "root extra member": (mutate(lambda r: r.update(version=1)), "JSON root has unexpected member 'version'"),
    "root missing objects": (mutate(lambda r: r.pop("objects")), "JSON root is missing member 'objects'"),
    "empty model_id": (mutate(lambda r: r.update(model_id="")), "field 'model_id' must be a nonempty string"),
    "null model_id": (mutate(lambda r: r.update(model_id=None)), "field 'model_id' must be a nonempty string, got null"),
    "empty objects": (mutate(lambda r: r.update(objects=[])), "field 'objects' is an empty array"),
    "objects not array": (mutate(lambda r: r.update(objects={})), "field 'objects' must be a nonempty array"),
    "object not dict": (mutate(lambda r: r["objects"].__setitem__(2, "tok")), "object 2: must be a JSON object"),
    # members
    "missing bytes": (obj(1, bytes=DELETE), BF_WHERE + "tensor object is missing member 'bytes'"),
    "missing name": (obj(1, name=DELETE), "object 1: missing member 'name'"),
    "missing kind": (obj(1, kind=DELETE), BF_WHERE + "missing member 'kind'"),
    "extra member": (obj(1, source="model.safetensors"), BF_WHERE + "tensor object has unexpected member 'source'"),
    "resource with shape": (obj(2, shape=[10]), TOK_WHERE + "resource object has unexpected member 'shape'"),
    "tensor with encoding": (obj(3, encoding="raw-bytes-v1"), I32_WHERE + "tensor object has unexpected member 'encoding'"),
    # values
    "null offset": (obj(1, offset=None), BF_WHERE + "field 'offset' must be a nonnegative integer, got null"),
    "bool bytes": (obj(1, bytes=True), BF_WHERE + "field 'bytes' must be a positive integer, got boolean true"),
    "float offset": (obj(1, offset=768.0), BF_WHERE + "field 'offset' must be a nonnegative integer, got number 768.0"),
    "string bytes": (obj(1, bytes="24"), BF_WHERE + "field 'bytes' must be a positive integer, got string '24'"),
    "bool dim": (obj(1, shape=[True, 4]), BF_WHERE + "field 'shape' dimension 0 must be a positive integer, got boolean"),
    "float dim": (obj(1, shape=[3.0, 4]), BF_WHERE + "field 'shape' dimension 0 must be a positive integer, got number"),
    "zero dim": (obj(1, shape=[0, 4]), BF_WHERE + "field 'shape' dimension 0 is 0, must be positive"),
    "negative dim": (obj(1, shape=[3, -4]), BF_WHERE + "field 'shape' dimension 1 is -4, must be positive"),
    "shape not array": (obj(1, shape=12), BF_WHERE + "field 'shape' must be an array"),
    "row-split rank 1": (obj(0, shape=[260]), Q5_WHERE + "field 'shape' has rank 1, row-split-k128-v1 requires rank exactly 2"),
    "contiguous rank 17": (obj(1, shape=[1] * 17), BF_WHERE + "field 'shape' has rank 17"),
    "zero bytes": (obj(2, bytes=0), TOK_WHERE + "field 'bytes' is 0, must be positive"),
    "negative offset": (obj(1, offset=-256), BF_WHERE + "field 'offset' is -256, must be nonnegative"),
    "huge offset": (obj(1, offset=2**64), BF_WHERE + "field 'offset' is 18446744073709551616, above the 2^63-1"),
    "huge dims": (obj(1, shape=[2**62, 2**62]), BF_WHERE + "field 'shape': element count of [4611686018427387904,4611686018427387904]"),
    "empty name": (obj(1, name=""), "object 1: field 'name' must be a nonempty string"),
    "int name": (obj(1, name=5), "object 1: field 'name' must be a nonempty string, got integer 5"),
    "bad kind": (obj(1, kind="weights"), BF_WHERE + "field 'kind' must be \"tensor\" or \"resource\""),
    "wrong byte count": (obj(0, bytes=100),
                         Q5_WHERE + "field 'bytes' is 100, expected 528 for Q5G64_F16S [2,130] in row-split-k128-v1"),
    "unknown format": (obj(1, format="FP16"), BF_WHERE + "field 'format' is 'FP16', not a registered format"),
    "unknown layout": (obj(1, layout="contiguous-be-v1"), BF_WHERE + "field 'layout' is 'contiguous-be-v1', not a registered"),
    "wrong format/layout pair": (obj(1, layout="row-split-k128-v1", shape=[3, 4]),
                                 BF_WHERE + "field 'layout' is 'row-split-k128-v1', which does not accept format BF16"),
    "grouped in contiguous": (obj(0, layout="contiguous-le-v1"), Q5_WHERE + "field 'layout' is 'contiguous-le-v1', which does not accept format Q5G64_F16S"),
    "unknown encoding": (obj(2, encoding="gzip-v1"), TOK_WHERE + "field 'encoding' is 'gzip-v1', not a registered"),
    # geometry
    "overlap": (obj(1, offset=512), BF_WHERE + "field 'offset' is 512, before the end (528) of object 0 'w/q5'"),
    "misaligned tensor": (obj(1, offset=800), BF_WHERE + "field 'offset' is 800, not a multiple of 256"),
    "out of order": (obj(3, offset=512), I32_WHERE + "field 'offset' is 512, before the end (802) of object 2 'tok'"),
    "offset past end": (obj(3, offset=4096), I32_WHERE + "field 'offset' 4096 + field 'bytes' 4 = 4100 runs past the payload end 1028"),
    "duplicate names": (obj(3, name="w/bf16"), "object 3 'w/bf16': field 'name' duplicates object 1"),
    "control chars in name": (obj(1, name="a\nb", offset=800), "object 1 'a\\nb': field 'offset'"),
}


def _write(tmp_path, data: bytes):
    path = tmp_path / "bad.ninfer"
    path.write_bytes(data)
    return path


def _truncate(tmp_path, size: int):
    path = raw_artifact(tmp_path / "bad.ninfer", valid_root())
    with open(path, "r+b") as fh:
        fh.truncate(size)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input_raises_one_line_artifact_error(tmp_path, case):
    build, needle = CASES[case]
    path = build(tmp_path)
    message = open_error(path)
    assert needle in message, message


def test_valid_fixture_opens(tmp_path):
    path = raw_artifact(tmp_path / "ok.ninfer", valid_root())
    with Artifact.open(path) as art:
        assert len(art.objects) == 4 and art.file_size == 4096 + VALID_PAYLOAD_BYTES
        assert art.resource_bytes("tok") == bytes(10)


def test_unopenable_paths(tmp_path):
    assert "cannot open" in open_error(tmp_path / "missing.ninfer")
    assert "cannot open" in open_error(tmp_path)  # a directory


def test_resource_needs_no_alignment_but_tensor_does(tmp_path):
    root = valid_root()
    assert root["objects"][2]["offset"] % 2 == 0
    root["objects"][2]["offset"] = 793  # odd offset is fine for raw-bytes-v1 (ends 803 < 1024)
    with Artifact.open(raw_artifact(tmp_path / "r.ninfer", root)) as art:
        assert art.resource("tok").offset == 793
    assert json.dumps(valid_root())  # fixture untouched
