"""Ahead-of-time kernel binaries (ninfer_compile/codegen/aot.py) and how the runtime uses them
(runtime/ninfer_runtime/triton_cache.py), on a CPU-only machine.

The test suite runs Triton in interpreter mode (tests/conftest.py), where a process cannot compile
kernels, so the binaries are built by `ninfer-compile` in a child process without TRITON_INTERPRET
(the real CLI path). The two compiles of the `aot` fixture (conftest.py) share a binary cache to
stay fast. Every child compiles with NINFER_AOT_STRICT=1: a binary compile that fails fails the
compile (and the test).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime.support import BLOCK_NINFER_COMPILE  # a child that cannot import the compiler

from .aot_support import aot_env

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime"
SM = 90
CHUNK = 16


def _env(tmp: Path, **extra) -> dict[str, str]:
    return aot_env(tmp, **extra)


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _kernel_params(src: Path, fn: str) -> list[str]:
    """Parameter names of the (decorated) function `fn` in the emitted source file `src`."""
    import ast

    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            return [a.arg for a in node.args.args]
    raise AssertionError(f"{fn} not in {src}")


def _manifests(plan: Path):
    km = json.loads((plan / "kernels" / "manifest.json").read_text())
    man = json.loads((plan / "kernels" / "bin" / "manifest.json").read_text())
    return km, man


def test_binaries_written_for_sm90(aot):
    import triton

    from ninfer_compile.codegen.aot import prefill_columns
    from ninfer_runtime.triton_cache import BIN_FORMAT, backend_digest, triton_build_digest

    plan = aot["plan"]
    km, man = _manifests(plan)
    b = km["binaries"]
    assert b["status"] == "ok" and b["reason"] is None, b
    assert b["sm"] == SM and b["triton"] == triton.__version__ and b["dir"] == "kernels/bin"
    raw = (plan / "kernels" / "bin" / "manifest.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == b["manifest_sha256"]
    assert f"kernel binaries: {b['entries']} for sm_{SM}" in aot["stderr"]
    # the manifest: what the runtime checks before using them
    assert man["format"] == BIN_FORMAT and man["triton"] == triton.__version__
    assert man["target"] == {"backend": "cuda", "arch": SM, "warp_size": 32} and man["sm"] == SM
    assert man["triton_key"] == triton_build_digest() and man["backend"] == backend_digest(SM)
    assert "release" in man["ptxas"]
    assert man["prefill_columns"] == prefill_columns(CHUNK) == [1, 2, 3, 4, 5, 7, 8, 9, 15, 16]
    assert man["failed"] == [] and man["unbound"] == []
    entries = man["entries"]
    assert len(entries) == b["entries"] > 0
    for e in entries:
        d = plan / "kernels" / "bin" / e["dir"]
        assert sorted(e["files"]) == sorted([f"{e['name']}.cubin", f"{e['name']}.json", f"__grp__{e['name']}.json"])
        for name, sha in e["files"].items():
            assert hashlib.sha256((d / name).read_bytes()).hexdigest() == sha
        grp = json.loads((d / f"__grp__{e['name']}.json").read_text())
        assert grp == {"child_paths": {f"{e['name']}.cubin": f"{e['name']}.cubin", f"{e['name']}.json": f"{e['name']}.json"}}
        assert (d / f"{e['name']}.cubin").read_bytes()[:4] == b"\x7fELF"
        meta = json.loads((d / f"{e['name']}.json").read_text())
        assert meta["target"]["arch"] == SM and meta["name"] == e["name"]
        mod, _, fn = e["kernel"].partition(":")
        assert (plan / "kernels" / (mod.replace(".", "/") + ".py")).is_file() and fn == e["name"]
        spec = json.loads(e["specialization"])
        assert spec["name"] == "{plan}." + mod + "." + fn and spec["options"]["arch"] == f"sm{SM}"
        assert spec.get("target", {"arch": SM})["arch"] == SM  # recorded by triton >= 3.7
        # the launcher binds arguments in the order of "signature": it must be the kernel's own
        # parameter order (a sorted-key dump broke every launch on the H200, 2026-11-29)
        params = _kernel_params(plan / "kernels" / (mod.replace(".", "/") + ".py"), fn)
        assert list(spec["signature"]) == [p for p in params if p in spec["signature"]], (e["kernel"], list(spec["signature"]))
    # decode extents launch with programmatic dependent launch (plan_dependent_launch), prefill plainly:
    # both specialisations are precompiled
    pdl = sorted({bool(json.loads(e["specialization"])["options"].get("launch_pdl")) for e in entries})
    assert pdl == [False, True], pdl
    pj0 = json.loads((plan / "plan.json").read_text())
    assert {x["phase"]: x["dependent_launch"]["enabled"] for x in pj0["extents"].values()} == {"decode": True,
                                                                                              "prefill": False}
    # every launched route (sampling included: it runs on the device) has its kernels precompiled
    kernels = {e["kernel"] for e in entries}
    for name, r in km["routes"].items():
        assert kernels & set(r["kernels"]), name
    pj = json.loads((plan / "plan.json").read_text())
    routed = sum(1 for x in pj["extents"].values() for L in x["launches"] if L.get("route"))
    assert sum(e["launches"] for e in entries) >= routed
    # line info names the plan-relative source, never the compile host's temp paths
    cubins = b"".join((plan / "kernels" / "bin" / e["dir"] / f"{e['name']}.cubin").read_bytes() for e in entries)
    assert b"<plan>/kernels/" in cubins and str(aot["dir"]).encode() not in cubins
    # the compiler's user cache stays untouched (it compiles into a scratch cache)
    assert not any((aot["dir"] / "compile-user-cache").rglob("*.cubin"))


def test_plan_with_binaries_is_deterministic(aot):
    a, b = _tree(aot["plan"]), _tree(aot["again"])
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k]] == []


@pytest.mark.parametrize("which", ["aot", "aot_columns"])
def test_runtime_loads_every_binary_without_compiling(request, tmp_path, which):
    """In a clean process that cannot import ninfer_compile, the runtime imports the plan's kernels
    from disk, accepts the binaries and preloads every entry from the plan: Triton computes the
    same cache keys as at compile time, compiles nothing and writes nothing to the user cache
    (also for a plan compiled with --column-specialization: `aot_columns`)."""
    aot = request.getfixturevalue(which)
    code = BLOCK_NINFER_COMPILE + """import json, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

class Stub:  # no GPU here: the target the GPU would report
    def get_current_target(self): return GPUTarget("cuda", %d, 32)
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0

driver.set_active(Stub())
from ninfer_runtime import triton_cache as tc
from ninfer_runtime.loader import import_kernels, read_plan
plan_dir = Path(sys.argv[1])
plan, km = read_plan(plan_dir)
pkg = import_kernels(plan_dir, km)
b, note = tc.binaries_for(plan_dir, plan, km)
assert b is not None, note
n = tc.preload_binaries(b, pkg)
stats, bnote = b.stats(), b.note()
b.release()
# the loader's GPU path: the same binaries through the Engine's default device backend (cuda:0 here
# is the stub's; torch.cuda.device is a no-op without CUDA)
import contextlib, torch
from ninfer_runtime.device import TorchDevice
from ninfer_runtime.plan_source import PlanDir
torch.cuda.device = lambda d: contextlib.nullcontext()
dev = TorchDevice(torch.device("cuda", 0), interpreting=lambda: False)
b2, note2 = dev.kernel_binaries(PlanDir(plan_dir), pkg)
assert b2 is not None and dev.warm and dev.capture_graphs, note2
assert b2.preloaded == len(b2.entries) and b2.stats()["compiled"] == 0 and not b2.stale, b2.note()
b2.release()
print(json.dumps({"n": n, "entries": len(b.entries), "stale": b.stale, "stats": stats, "note": bnote,
                  "compile": [m for m in sys.modules if m.startswith("ninfer_compile")]}))
""" % SM
    user = tmp_path / "user-cache"
    p = subprocess.run([sys.executable, "-c", code, str(aot["plan"])], capture_output=True, text=True,
                       env=_env(user, PYTHONPATH=os.pathsep.join([str(RUNTIME)] + (
                           [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))),
                       cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["n"] == r["entries"] > 0 and r["stale"] == [], r
    assert r["stats"] == {"plan": r["entries"], "user": 0, "compiled": 0}, r
    assert f"{r['n']}/{r['n']} loaded from the plan, 0 JIT-compiled" in r["note"]
    assert r["compile"] == []
    assert not user.exists() or not any(user.rglob("*"))


def test_runtime_falls_back_to_source_and_says_why(aot, tmp_path, monkeypatch):
    import triton

    from ninfer_runtime import triton_cache as tc
    from ninfer_runtime.loader import read_plan

    plan_dir = tmp_path / "p.plan"
    shutil.copytree(aot["plan"], plan_dir)
    plan, km = read_plan(plan_dir)
    dirs = list(tc._DIRS)

    def decide(p=plan, k=km):
        b, note = tc.binaries_for(plan_dir, p, k)
        assert b is None and tc._DIRS == dirs, note
        assert note.startswith("kernels: JIT from source (") and "\n" not in note
        return note

    real = triton.__version__
    monkeypatch.setattr(triton, "__version__", "0.0.0-other")
    assert f"built by triton {real}, this runtime has triton 0.0.0-other" in decide()
    monkeypatch.setattr(triton, "__version__", real)
    assert "binaries for sm_90, plan sm_86" in decide(p={**plan, "sm": 86})
    monkeypatch.setattr(tc, "triton_build_digest", lambda: "0" * 64)
    assert "another build of triton" in decide()
    monkeypatch.undo()
    monkeypatch.setattr(tc, "backend_digest", lambda sm: "0" * 64)
    assert "ptxas" in decide()
    monkeypatch.undo()
    monkeypatch.setattr(tc, "cache_env", lambda: {"MLIR_ENABLE_DUMP": "1"})
    assert "environment differs" in decide() and "MLIR_ENABLE_DUMP=1" in decide()
    monkeypatch.undo()
    assert "no precompiled binaries" in decide(k={**km, "binaries": None})
    assert "--no-binaries" in decide(k={**km, "binaries": {"status": "disabled", "reason": "--no-binaries"}})
    _, man = _manifests(plan_dir)
    e = man["entries"][0]
    cubin = plan_dir / "kernels" / "bin" / e["dir"] / f"{e['name']}.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    from ninfer_runtime.errors import PlanMismatch

    with pytest.raises(PlanMismatch, match=r"\.cubin: kernel binary is damaged") as exc:
        tc.binaries_for(plan_dir, plan, km)
    assert "\n" not in str(exc.value) and tc._DIRS == dirs
    with pytest.raises(PlanMismatch, match=r"\.cubin: sha256 does not match plan.json integrity"):
        read_plan(plan_dir)


def test_cache_manager_reads_the_plan_and_writes_elsewhere(aot, tmp_path, monkeypatch):
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    from ninfer_runtime import triton_cache as tc
    from ninfer_runtime.loader import read_plan

    plan_dir = aot["plan"]
    before = _tree(plan_dir)
    plan, km = read_plan(plan_dir)
    monkeypatch.setattr(tc, "_FALLBACK", None)
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "user")
        knobs.cache.manager_class = FileCacheManager
        b, note = tc.binaries_for(plan_dir, plan, km)
        assert b is not None, note
        try:
            cls = tc.manager_class()
            assert knobs.cache.manager_class is cls and tc._FALLBACK is FileCacheManager
            e = b.entries[0]
            m = cls(e["dir"])
            grp = m.get_group(f"{e['name']}.json")
            d = plan_dir / "kernels" / "bin" / e["dir"]
            assert grp == {f"{e['name']}.cubin": str(d / f"{e['name']}.cubin"), f"{e['name']}.json": str(d / f"{e['name']}.json")}
            assert m.get_file(f"{e['name']}.cubin") == str(d / f"{e['name']}.cubin")
            m.put(b"launcher", "stub.so")  # writes go to the user cache, never the plan
            assert (tmp_path / "user" / e["dir"] / "stub.so").read_bytes() == b"launcher"
            other = cls("NOTINTHEPLAN")
            assert other.get_group("k.json") is None and b.stats()["compiled"] == 1
            tc._PLAN_ONLY.on = True  # while preloading, a key the plan lacks raises instead of compiling
            try:
                with pytest.raises(tc.NotInPlan):
                    cls("NOTINTHEPLAN").get_group("k.json")
                # host-side stubs (driver utils, launchers) are never in a plan: a miss falls
                # through to the user cache instead of failing the preload
                assert cls("DRIVERUTILS").get_file("cuda_utils.cpython-312-x86_64-linux-gnu.so") is None
                cls("DRIVERUTILS").put(b"so", "cuda_utils.so")
                assert cls("DRIVERUTILS").get_file("cuda_utils.so") == str(tmp_path / "user" / "DRIVERUTILS" / "cuda_utils.so")
            finally:
                tc._PLAN_ONLY.on = False
        finally:
            b.release()
        assert str(b.bin_dir) not in tc._DIRS and cls(e["dir"]).get_group(f"{e['name']}.json") is None
    assert _tree(plan_dir) == before


def test_no_binaries_switch_and_interpreter_mode(aot, aot_columns, tmp_path, capsys):
    from ninfer_compile.cli import main
    from ninfer_compile.codegen.aot import toolchain_problem

    art = aot["artifact"]
    common = ["--sm", str(SM), "--prefill-chunk", str(CHUNK), "--concurrency", "1", "--max-context", "64"]
    assert main([str(art), "-o", str(tmp_path / "off.plan"), "--no-binaries", *common]) == 0
    km = json.loads((tmp_path / "off.plan" / "kernels" / "manifest.json").read_text())
    assert km["binaries"] == {"status": "disabled", "reason": "--no-binaries"}
    assert not (tmp_path / "off.plan" / "kernels" / "bin").exists()
    assert "kernel binaries: none (disabled: --no-binaries)" in capsys.readouterr().err
    # apart from the binaries, a plan with and without them is the same plan (without binaries the
    # column counts stay specialised: the --column-specialization plan is the one to compare)
    on = _tree(aot_columns["plan"])
    off = _tree(tmp_path / "off.plan")
    assert sorted(k for k in on if not k.startswith("kernels/bin/")) == sorted(off)
    assert all(on[k] == off[k] for k in off if k not in ("kernels/manifest.json", "plan.json"))
    # plan.json differs only in its integrity record (which lists the binaries' sha256)
    body = lambda raw: {k: v for k, v in json.loads(raw).items() if k != "integrity"}  # noqa: E731
    assert body(on["plan.json"]) == body(off["plan.json"])
    problem = toolchain_problem(SM)
    if problem and "interpreter mode" in problem:  # this test process (CPU): a recorded skip, same plan
        assert main([str(art), "-o", str(tmp_path / "interp.plan"), *common]) == 0
        km = json.loads((tmp_path / "interp.plan" / "kernels" / "manifest.json").read_text())
        assert km["binaries"]["status"] == "skipped" and "TRITON_INTERPRET" in km["binaries"]["reason"]
        assert _tree(tmp_path / "interp.plan").keys() == off.keys()


def test_aot_failure_is_recorded_not_fatal(aot, tmp_path, monkeypatch, capsys):
    from ninfer_compile.cli import main
    from ninfer_compile.codegen import aot as A

    def boom(*a, **k):
        raise RuntimeError("ptxas exploded\nsecond line")

    monkeypatch.delenv("NINFER_AOT_STRICT", raising=False)  # what a user's ninfer-compile does
    monkeypatch.setattr(A, "toolchain_problem", lambda sm, runtime=True: None)
    monkeypatch.setattr(A, "_precompile", boom)
    out = tmp_path / "x.plan"
    assert main([str(aot["artifact"]), "-o", str(out), "--sm", str(SM), "--prefill-chunk", str(CHUNK),
                 "--concurrency", "1", "--max-context", "64"]) == 0
    km = json.loads((out / "kernels" / "manifest.json").read_text())
    assert km["binaries"] == {"status": "skipped",
                              "reason": "ahead-of-time compilation failed: RuntimeError: ptxas exploded"}
    assert (out / "plan.json").is_file() and (out / "kernels" / "linear" / "launch.py").is_file()
    assert not (out / "kernels" / "bin").exists()
    err = capsys.readouterr().err.splitlines()
    assert [ln for ln in err if ln.startswith("warning: ")] == [
        "warning: binaries: none built (ahead-of-time compilation failed: RuntimeError: ptxas exploded); "
        "the runtime JITs the source"], err
    assert not any(ln.startswith("kernel binaries:") for ln in err), err
    # no temp directories left behind (the user cache may hold what the column-count discovery found)
    assert sorted(os.listdir(tmp_path)) in (["x.plan"], ["x.plan", "xdg-cache"])


def test_prefill_columns():
    from ninfer_compile.codegen.aot import prefill_columns

    assert prefill_columns(1) == [1]
    assert prefill_columns(8) == [1, 2, 3, 4, 5, 7, 8]
    cols = prefill_columns(1024)
    assert cols[0] == 1 and cols[-1] == 1024 and 1023 in cols and 513 in cols and 1025 not in cols


def test_strict_aot_failure_fails_the_compile(aot, tmp_path, monkeypatch, capsys):
    """NINFER_AOT_STRICT=1 (the suite's setting): the same failure is one error line, no plan."""
    from ninfer_compile.cli import main
    from ninfer_compile.codegen import aot as A

    def boom(*a, **k):
        raise RuntimeError("ptxas exploded\nsecond line")

    monkeypatch.setenv("NINFER_AOT_STRICT", "1")
    monkeypatch.setattr(A, "toolchain_problem", lambda sm, runtime=True: None)
    monkeypatch.setattr(A, "_precompile", boom)
    out = tmp_path / "x.plan"
    assert main([str(aot["artifact"]), "-o", str(out), "--sm", str(SM), "--prefill-chunk", str(CHUNK),
                 "--concurrency", "1", "--max-context", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: binaries failed (NINFER_AOT_STRICT=1): ahead-of-time compilation failed: "
                       "RuntimeError: ptxas exploded"), err
    # no plan and nothing of it left; the user cache may hold what the column-count discovery found
    assert not out.exists() and sorted(os.listdir(tmp_path)) in ([], ["xdg-cache"])
    # a process in interpreter mode cannot compile kernels: a recorded skip, strict or not
    assert A.failure({"status": "skipped", "reason": A.INTERPRETER_PROBLEM}) is None
    assert A.failure({"status": "disabled", "reason": "--no-binaries"}) is None
    assert A.failure({"status": "partial", "reason": "1 kernel(s) failed"}).startswith("binaries: 1 kernel(s) failed")


_FAILING_CAPTURE = """import sys
from ninfer_compile.codegen import aot

def boom(engine, session, AotTensor, memo=None, phases=None):
    assert type(engine).__name__ == "Engine" and engine.extents  # the real engine was built first
    raise RuntimeError("capture exploded")

aot.reproduce_launches = boom
from ninfer_compile.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("strict", ["1", "0"])
def test_failing_capture_in_a_real_compile(aot, tmp_path, strict):
    """The real configuration (a child without TRITON_INTERPRET) with the capture failing after the
    engine is built: strict, the compile fails in one line; otherwise ninfer-compile writes the plan
    (source only) and says why in one warning line."""
    out = tmp_path / "p.plan"
    p = subprocess.run([sys.executable, "-c", _FAILING_CAPTURE, str(aot["artifact"]), "--sm", str(SM), "-o", str(out),
                        "--prefill-chunk", str(CHUNK), "--concurrency", "1", "--max-context", "64", "--quiet"],
                       capture_output=True, text=True, cwd=REPO, timeout=600,
                       env=_env(tmp_path / "user-cache", NINFER_AOT_STRICT=strict, TMPDIR=str(tmp_path)))
    err = p.stderr.strip().splitlines()
    assert not any("Traceback" in ln for ln in err), p.stderr[-3000:]
    reason = "ahead-of-time compilation failed: RuntimeError: capture exploded"
    if strict == "1":
        assert p.returncode == 2 and err[-1] == f"error: binaries failed (NINFER_AOT_STRICT=1): {reason}", err
        assert not out.exists()
    else:
        assert p.returncode == 0, p.stderr[-3000:]
        assert [ln for ln in err if ln.startswith("warning: ")] == [
            f"warning: binaries: none built ({reason}); the runtime JITs the source"], err
        km = json.loads((out / "kernels" / "manifest.json").read_text())
        assert km["binaries"] == {"status": "skipped", "reason": reason}
        assert (out / "plan.json").is_file() and not (out / "kernels" / "bin").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("ninfer-aot-")] == []


def test_aot_engine_is_built_by_the_engine_constructor(aot, tmp_path, monkeypatch):
    """The AOT engine is the runtime's Engine, constructed through Engine.__init__ with the fake device
    injected: whatever __init__ sets is there, memory is fake cuda:0 (no data), nothing is uploaded
    or captured, and every extent binds through the runtime's ExtentRunner."""
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.cli import main
    from ninfer_compile.codegen import aot as A
    from ninfer_compile.codegen.aot_capture import MemoryImporter
    from ninfer_compile.codegen.aot_device import FakeTensors, aot_engine, fake_tensors
    from ninfer_runtime.loader import Engine

    import torch

    out = tmp_path / "p.plan"
    assert main([str(aot["artifact"]), "-o", str(out), "--sm", str(SM), "--prefill-chunk", str(CHUNK),
                 "--concurrency", "1", "--max-context", "64", "--no-binaries", "--quiet"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    plan.pop("integrity")
    files = {p.relative_to(out).as_posix(): p.read_text() for p in sorted((out / "kernels").rglob("*"))
             if p.is_file() and p.suffix in (".py", ".json")}
    km = json.loads(files["kernels/manifest.json"])
    with Artifact.open(aot["artifact"]) as art:
        objects = dict(art.by_name)
    real_init = Engine.__init__

    def init(self, *a, **k):
        self.probe = "set in __init__"
        real_init(self, *a, **k)

    monkeypatch.setattr(Engine, "__init__", init)
    root = "_ninfer_aot_test_engine"
    importer = MemoryImporter(root, files)
    sys.meta_path.insert(0, importer)
    try:
        __import__(root)
        fake: FakeTensors = fake_tensors()
        with fake.AllocMode():
            eng = aot_engine(plan, km, root, objects, SM, fake)
            bound = {name: r.bound() for name, r in eng.extents.items()}
    finally:
        sys.meta_path.remove(importer)
        A._forget_package(root, importer)
    assert type(eng) is Engine and eng.probe == "set in __init__"
    assert set(eng.load_times) == {"upload", "kernels", "capture", "total"} and eng.graphs == {}
    assert eng.device == torch.device("cuda", 0) and eng.binaries is None and eng.plan_dir is None
    assert isinstance(eng.arena, fake.AotTensor) and eng.arena.device == eng.device
    assert eng.arena.data_ptr() % (1 << 40) == 0
    assert all(isinstance(s, fake.AotTensor) for s in eng._state.values())
    for n in sorted({ref["weight"] for x in plan["extents"].values() for L in x["launches"]
                     for ref in list((L.get("args") or {}).values()) + list((L.get("outs") or {}).values())
                     if "weight" in ref}):
        w = eng.weight(n)
        planes = [w] if isinstance(w, torch.Tensor) else [w.base, w.scale]
        assert all(isinstance(t, fake.AotTensor) for t in planes), n
    assert eng.kernel_package == root and eng.frontend.tokenizer is None
    assert "ahead-of-time compilation for sm_90" in eng.device_note
    assert sorted(bound) == sorted(n for n, x in plan["extents"].items() if x.get("graph", "text") == "text")
    assert all(bound.values())
    with pytest.raises(RuntimeError, match="no data"):
        eng.arena.cpu()
