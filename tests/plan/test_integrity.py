"""Plan integrity (issue 10 §4): write_plan seals plan.json with the sha256 of its canonical body
and of every other file; the runtime's check refuses any mismatch naming the file."""

from __future__ import annotations

import hashlib
import json

import pytest

from ninfer_compile.plan.writer import write_plan
from ninfer_runtime.errors import PlanMismatch
from ninfer_runtime.integrity import (INTEGRITY_FORMAT, body_sha256, canonical_json, check_plan_integrity,
                                      integrity_record)

MANIFEST = {"format": "ninfer-plan-v1", "model_id": "m", "evidence": {8: 1.5, 16: 2.0}, "shape": (3, 4),
            "name": "é"}
EXTRA = {"kernels/__init__.py": "# emitted\n", "kernels/manifest.json": "{}\n",
         "kernels/bin/abc/k.cubin": bytes(range(256)), "kernels/bin/abc/k.json": "{}\n"}


@pytest.fixture
def plan(tmp_path):
    return write_plan(tmp_path / "x.plan", MANIFEST, "memory\n", extra_files=EXTRA)


def _read(plan):
    return json.loads((plan / "plan.json").read_text())


def test_record_covers_body_and_every_file(plan):
    pj = _read(plan)
    rec = pj["integrity"]
    assert rec["format"] == INTEGRITY_FORMAT
    on_disk = sorted(p.relative_to(plan).as_posix() for p in plan.rglob("*") if p.is_file())
    assert sorted(rec["files"]) == [p for p in on_disk if p != "plan.json"]
    for rel, sha in rec["files"].items():
        assert hashlib.sha256((plan / rel).read_bytes()).hexdigest() == sha
    # the body hash is over the parsed object without `integrity` (int keys became strings)
    body = {k: v for k, v in pj.items() if k != "integrity"}
    assert body["evidence"] == {"8": 1.5, "16": 2.0}
    assert rec["body_sha256"] == hashlib.sha256(canonical_json(body)).hexdigest() == body_sha256(pj)
    check_plan_integrity(plan, pj)  # passes


def test_sealed_plans_are_byte_identical(tmp_path, plan):
    again = write_plan(tmp_path / "y.plan", MANIFEST, "memory\n", extra_files=EXTRA)
    for p in plan.rglob("*"):
        if p.is_file():
            assert (again / p.relative_to(plan)).read_bytes() == p.read_bytes(), p


def test_write_plan_does_not_change_the_callers_manifest(tmp_path):
    m = dict(MANIFEST)
    write_plan(tmp_path / "z.plan", m, "memory\n")
    assert m == MANIFEST


def _refused(plan, match):
    with pytest.raises(PlanMismatch, match=match) as exc:
        check_plan_integrity(plan, _read(plan))
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_edited_body_is_refused(plan):
    pj = _read(plan)
    pj["model_id"] = "other"
    (plan / "plan.json").write_text(json.dumps(pj))
    msg = _refused(plan, "body sha256 .* does not match its integrity record")
    assert msg.startswith(str(plan / "plan.json"))


def test_reformatting_plan_json_is_accepted(plan):
    """The body is the parsed object: whitespace and key order do not matter."""
    pj = _read(plan)
    (plan / "plan.json").write_text(json.dumps(pj, indent=7, sort_keys=False))
    check_plan_integrity(plan, _read(plan))


def test_damaged_cubin_named(plan):
    cubin = plan / "kernels" / "bin" / "abc" / "k.cubin"
    data = bytearray(cubin.read_bytes())
    data[100] ^= 1
    cubin.write_bytes(bytes(data))
    msg = _refused(plan, "sha256 does not match plan.json integrity")
    assert msg.startswith(str(cubin))


def test_missing_unlisted_and_unsafe_files(plan):
    (plan / "memory.txt").unlink()
    assert _refused(plan, "missing").startswith(str(plan / "memory.txt"))
    (plan / "memory.txt").write_text("memory\n")
    check_plan_integrity(plan, _read(plan))
    (plan / "kernels" / "__pycache__").mkdir()
    (plan / "kernels" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    check_plan_integrity(plan, _read(plan))  # byte code Python writes itself is not a plan file
    evil = plan / "kernels" / "bin" / "abc" / "extra.cubin"
    evil.write_bytes(b"\0")
    assert _refused(plan, "not written by the compiler").startswith(str(evil))
    evil.unlink()
    pj = _read(plan)
    pj["integrity"]["files"]["../outside"] = "0" * 64
    (plan / "plan.json").write_text(json.dumps(pj))
    _refused(plan, "unsafe path '../outside'")


def test_missing_or_malformed_record(plan):
    pj = _read(plan)
    del pj["integrity"]
    (plan / "plan.json").write_text(json.dumps(pj))
    _refused(plan, "no integrity record")
    pj["integrity"] = {"format": "v0"}
    (plan / "plan.json").write_text(json.dumps(pj))
    _refused(plan, "integrity record is malformed")


def test_integrity_record_helper_matches_writer(plan):
    from ninfer_compile.plan import integrity as ci

    pj = _read(plan)
    files = {rel: (plan / rel).read_bytes() for rel in pj["integrity"]["files"]}
    assert integrity_record(pj, files) == pj["integrity"] == ci.integrity_record(pj, files)
    assert ci.INTEGRITY_FORMAT == INTEGRITY_FORMAT
    odd = {"b": [1.5, 1e300, -0.0, None, True], "a": "\u00e9\ud7ff", "c": {"9": 1, "10": 2}}
    assert ci.canonical_json(odd) == canonical_json(odd) and ci.body_sha256(odd) == body_sha256(odd)


def test_writing_a_plan_does_not_import_the_runtime(tmp_path):
    """Importing ninfer_runtime switches Triton to interpreter mode on a CPU machine: the compiler's
    plan writer must not do it (it would stop the ahead-of-time binaries)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; from ninfer_compile.plan.writer import write_plan; "
            f"write_plan({str(tmp_path / 'p.plan')!r}, {{'a': 1}}, 'm\\n'); "
            "assert not [m for m in sys.modules if m.startswith('ninfer_runtime')], 'runtime imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("keys", [("a", "b"), ("zeta", "omega"), ("a", "zz"), ("j",)])
def test_spliced_rendering_equals_a_full_render(tmp_path, keys):
    """write_plan splices the integrity member into the body's rendering: the bytes must be those
    render_json gives for the whole object, wherever the member sorts."""
    from ninfer_compile.plan.writer import render_json

    manifest = {k: {"long": "x" * 200, "n": [1, 2, 3], "nested": {"deep": ["y" * 170]}} for k in keys}
    out = write_plan(tmp_path / "s.plan", manifest, "memory\n", extra_files=EXTRA)
    text = (out / "plan.json").read_text()
    assert text == render_json({**manifest, "integrity": json.loads(text)["integrity"]})
    check_plan_integrity(out, json.loads(text))
    small = write_plan(tmp_path / "small.plan", {"a": 1}, "m\n")  # one-line body: a full render
    assert json.loads((small / "plan.json").read_text())["a"] == 1


def test_sparse_artifacts_are_recognised(tmp_path):
    from ninfer_compile.plan.integrity import is_sparse

    hole = tmp_path / "hole.ninfer"
    with open(hole, "wb") as fh:
        fh.write(b"x" * 4096)
        fh.truncate(64 * 2**20)
    dense = tmp_path / "dense.ninfer"
    dense.write_bytes(b"\1" * (2 * 2**20))
    assert is_sparse(hole) and not is_sparse(dense)
