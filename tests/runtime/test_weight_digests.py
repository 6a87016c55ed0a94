"""What binds a plan to an artifact (issue 10 §4): always the artifact's directory sha256; payload
digests only when recorded (`python -m ninfer_compile.plan.integrity`) and checked on request
(`ninfer-run --verify-weights` / `load(verify_weights=True)`)."""

from __future__ import annotations

import json
import shutil

import pytest

import ninfer_runtime as nr
from ninfer_compile.errors import CompileError
from ninfer_compile.plan import integrity as ci
from ninfer_runtime.artifact_view import ArtifactView
from ninfer_runtime.integrity import check_plan_integrity

from . import support as S


def _other_weights(art, dest, name):
    """A copy of `art` with one byte of object `name`'s payload changed (same directory)."""
    shutil.copy(art, dest)
    with ArtifactView.open(art) as av:
        e = av.objects[name]
        at = av.payload_offset + e.offset + e.bytes // 2
    with open(dest, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x40]))
    return dest


@pytest.fixture(scope="module")
def digested(tiny_plan, tmp_path_factory):
    art, plan = tiny_plan
    d = tmp_path_factory.mktemp("digests")
    shutil.copytree(plan, d / "p.plan")
    assert ci.main([str(d / "p.plan"), "--artifact", str(art), "--quiet"]) == 0
    return art, d / "p.plan"


def test_digests_recorded_and_sealed(digested, tiny_plan):
    art, plan = digested
    pj = json.loads((plan / "plan.json").read_text())
    digests = pj["artifact"]["payload_sha256"]
    assert sorted(digests) == ci.bound_objects(pj) and len(digests) > 10
    check_plan_integrity(plan, pj)  # the record was re-sealed
    # only plan.json changed, in the writer's own rendering
    base = json.loads((tiny_plan[1] / "plan.json").read_text())
    assert {k for k in pj if pj[k] != base.get(k)} == {"artifact", "integrity"}


def test_verify_weights_accepts_the_artifact_and_names_a_changed_object(digested, tmp_path):
    art, plan = digested
    with nr.load(plan, art, progress=False, verify_weights=True) as eng:
        assert eng.verify_weights
    name = sorted(json.loads((plan / "plan.json").read_text())["artifact"]["payload_sha256"])[3]
    other = _other_weights(art, tmp_path / "other.ninfer", name)
    # the directory header is all that binds by default: other weights load (documented)
    nr.load(plan, other, progress=False).close()
    with pytest.raises(nr.PlanMismatch) as exc:
        nr.load(plan, other, progress=False, verify_weights=True)
    msg = str(exc.value)
    assert "\n" not in msg and f"object {name!r} of other.ninfer" in msg and "--verify-weights" in msg


def test_verify_weights_refuses_a_plan_without_digests(tiny_plan):
    art, plan = tiny_plan
    with pytest.raises(nr.PlanError, match="records no payload digests"):
        nr.load(plan, art, progress=False, verify_weights=True)


def test_digests_only_for_the_plans_own_artifact_and_an_intact_plan(tiny_plan, tmp_path, capsys):
    art, plan = tiny_plan
    p = tmp_path / "p.plan"
    shutil.copytree(plan, p)
    (p / "memory.txt").write_text("edited\n")
    assert ci.main([str(p), "--artifact", str(art), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory.txt: sha256 does not match plan.json integrity" in err
    shutil.rmtree(p)
    shutil.copytree(plan, p)
    pj = json.loads((p / "plan.json").read_text())
    pj["artifact"]["directory_sha256"] = "0" * 64
    S.seal_plan_dir(p, pj)
    with pytest.raises(CompileError, match="not the artifact this plan was compiled for"):
        ci.record_weight_digests(p, art, progress=False)


def test_cli_verify_weights(digested):
    import os
    import subprocess
    import sys

    art, plan = digested
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(S.RUNTIME)}
    p = subprocess.run([sys.executable, "-m", "ninfer_runtime.cli", str(plan), "--artifact", str(art), "--tokens",
                        "5,77", "--max-new-tokens", "1", "--verify-weights"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "weights verified" in p.stderr


def test_compile_flag_records_digests_that_verify(tiny_plan, tmp_path):
    """`ninfer-compile --weight-digests` records the digests of every bound payload in the plan it
    writes (sealed): the plan loads with verify_weights and names an object whose weights changed."""
    from ninfer_compile.cli import main as cli

    art, _ = tiny_plan
    out = tmp_path / "d.plan"
    table = S.interp_table(tmp_path / "interp90.yaml")
    assert cli([str(art), "--sm", "90", "--routes", str(table), "--concurrency", "1", "--max-context", "64",
                "--prefill-chunk", "8", "--no-binaries", "--quiet", "--weight-digests", "-o", str(out)]) == 0
    pj = json.loads((out / "plan.json").read_text())
    digests = pj["artifact"]["payload_sha256"]
    assert sorted(digests) == ci.bound_objects(pj) and digests == ci.weight_digests(art, pj, progress=False)
    check_plan_integrity(out, pj)
    with nr.load(out, art, progress=False, verify_weights=True) as eng:
        assert eng.verify_weights
    name = sorted(digests)[1]
    with pytest.raises(nr.PlanMismatch, match=f"object {name!r}"):
        nr.load(out, _other_weights(art, tmp_path / "other.ninfer", name), progress=False, verify_weights=True)
