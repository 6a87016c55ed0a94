"""What keeps a cold binary compile short without touching the binaries: the pool's hand-out order
(aot_binaries.pool_order), the ptx / cubin stages shared by identical inputs
(aot_stage_memo.py) and a scratch cache that keeps only metadata and cubins
(aot_device.environment). Plans stay byte-identical: the real compiles in test_aot.py /
test_binary_cache.py run through all three."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from ninfer_compile.codegen import aot_stage_memo
from ninfer_compile.codegen.aot_binaries import pool_order

PTX = "//\n.version 8.4\n.target sm_90\n.visible .entry {name}(\n)\n{{ ret; }}\n"


@dataclass
class _Rec:
    first_use: str


def test_pool_order_hands_out_prefill_and_verify_kernels_first():
    recs = [_Rec("decode_c1_k0/l0.attn.q"), _Rec("prefill_t64[3 columns]/l0.gdn.delta_rule"),
            _Rec("decode_c2_k0/lm_head"), _Rec("verify_c1_k3/l1.attn.attention"),
            _Rec("prefill_t64/l0.attn.attention"), _Rec("mtp_prefill_t64/mtp.attn")]
    assert pool_order(recs, [0, 1, 2, 3, 4, 5]) == [1, 3, 4, 5, 0, 2]
    assert pool_order(recs, [2, 4, 0]) == [4, 0, 2]  # a subset (the kernels the cache lacks) keeps its order
    assert pool_order(recs, []) == []


class _Stage:
    """A stand-in for one of Triton's stages: counts its runs, sets the name as make_ptx does."""

    def __init__(self, ext: str):
        self.ext, self.calls = ext, 0

    def __call__(self, src, metadata):
        self.calls += 1
        if self.ext == "ptx":
            name = src.split()[0]
            metadata["name"] = name
            return PTX.format(name=name)
        return b"CUBIN:" + src.encode()


def test_stage_memo_runs_a_stage_once_per_distinct_input(tmp_path):
    ptx = _Stage("ptx")
    run = aot_stage_memo._memoised(ptx, "ptx", "sm90", "options-a", str(tmp_path))
    first_meta, again_meta = {}, {}
    first = run("kern_a llvm-ir", first_meta)
    again = run("kern_a llvm-ir", again_meta)
    assert ptx.calls == 1 and again == first and again_meta == first_meta == {"name": "kern_a"}
    run("kern_b llvm-ir", {})  # another input
    other_options = aot_stage_memo._memoised(ptx, "ptx", "sm90", "options-b", str(tmp_path))
    other_options("kern_a llvm-ir", {})  # the same input under other options
    assert ptx.calls == 3
    cubin = _Stage("cubin")
    run_cubin = aot_stage_memo._memoised(cubin, "cubin", "sm90", "options-a", str(tmp_path))
    assert run_cubin(first, {}) == run_cubin(first, {}) == b"CUBIN:" + first.encode() and cubin.calls == 1
    assert not list(tmp_path.glob("*.part"))  # every entry renamed into place


def test_stage_memo_recomputes_a_damaged_ptx_entry(tmp_path):
    ptx = _Stage("ptx")
    run = aot_stage_memo._memoised(ptx, "ptx", "sm90", "o", str(tmp_path))
    run("kern_a ir", {})
    (entry,) = tmp_path.iterdir()
    entry.write_text("no entry point here")
    meta = {}
    assert run("kern_a ir", meta) == PTX.format(name="kern_a") and meta == {"name": "kern_a"} and ptx.calls == 2


def test_shared_stages_wraps_ptx_and_cubin_and_restores_the_backend(tmp_path):
    compiler = pytest.importorskip("triton.backends.nvidia.compiler")
    original = compiler.CUDABackend.add_stages

    class _Backend:
        target = "sm90"

    def fake_add(self, stages, options, language):
        stages.update(ttir=_Stage("ttir"), ptx=_Stage("ptx"), cubin=_Stage("cubin"))

    compiler.CUDABackend.add_stages = fake_add
    try:
        with aot_stage_memo.shared_stages(str(tmp_path)):
            stages = {}
            compiler.CUDABackend.add_stages(_Backend(), stages, "opts", None)
            assert isinstance(stages["ttir"], _Stage)  # the front stages are left alone
            assert not isinstance(stages["ptx"], _Stage) and not isinstance(stages["cubin"], _Stage)
        assert compiler.CUDABackend.add_stages is fake_add
    finally:
        compiler.CUDABackend.add_stages = original


def test_environment_keeps_only_binaries_in_the_scratch_cache(tmp_path):
    pytest.importorskip("triton.backends.nvidia.compiler")
    from triton import knobs

    from ninfer_compile.codegen.aot_device import environment

    before = knobs.compilation.store_binary_only
    with environment(90, str(tmp_path), None):
        assert knobs.compilation.store_binary_only is True
    assert knobs.compilation.store_binary_only == before


# ----------------------------------------------------------------------------- --no-column-specialization


class _Param:
    def __init__(self, name, constexpr=False):
        self.name, self.is_constexpr = name, constexpr


class _Jit:
    __module__ = "_root.fam.kernels"
    fn = SimpleNamespace(__qualname__="k")
    params = [_Param("x_ptr"), _Param("T"), _Param("stride"), _Param("BLOCK", constexpr=True)]


def _spec(t_type: str, t_hint: bool, stride_hint: bool = True, x_hint: bool = True) -> str:
    import json

    sig = {"x_ptr": "*bf16", "T": t_type, "stride": "i32", "BLOCK": "constexpr"}
    attrs = [[0], [1], [2]]
    vals = [[["tt.divisibility", 16]] if x_hint else [], [["tt.divisibility", 16]] if t_hint else [],
            [["tt.divisibility", 16]] if stride_hint else []]
    return json.dumps({"signature": sig, "attrs_keys": attrs, "attrs_vals": vals})


@dataclass
class _Cap:
    jf: object
    spec: str


def test_varying_parameters_names_only_integers_whose_class_changes():
    from ninfer_compile.codegen.column_specialization import varying_parameters

    jf = _Jit()
    caps = [_Cap(jf, _spec("i32", True)), _Cap(jf, _spec("i32", False, x_hint=False)),
            _Cap(jf, _spec("constexpr", False))]  # T == 1 folded into a constant
    assert varying_parameters(caps, "_root") == {"fam.kernels:k": ["T"]}  # the pointer's alignment is not an integer
    assert varying_parameters(caps[:1], "_root") == {}
    assert varying_parameters([_Cap(jf, _spec("i32", True, stride_hint=False)), _Cap(jf, _spec("i32", True))],
                              "_root") == {"fam.kernels:k": ["stride"]}
    assert varying_parameters(caps, "_root", keep={"fam.kernels:k"}) == {}  # a kernel a decode step launches


SOURCE = '''import triton


@triton.jit
def k(x_ptr, T, NT, BLOCK: tl.constexpr):
    pass


@triton.jit
def other(x_ptr):
    pass
'''


def test_unspecialize_names_the_parameters_in_the_decorator_only():
    from ninfer_compile.codegen.column_specialization import unspecialize
    from ninfer_compile.errors import CompileError

    out = unspecialize(SOURCE, {"k": ["T", "NT"]}, "fam.kernels")
    assert out == SOURCE.replace("@triton.jit\ndef k", "@triton.jit(do_not_specialize=['NT', 'T'])\ndef k", 1)
    for kernels, what in (({"missing": ["T"]}, "defines no kernel 'missing'"), ({"k": ["Q"]}, "no parameter 'Q'")):
        with pytest.raises(CompileError, match=what):
            unspecialize(SOURCE, kernels, "fam.kernels")
    with pytest.raises(CompileError, match="bare @triton.jit"):
        unspecialize(SOURCE.replace("@triton.jit\ndef other", "@triton.jit(debug=True)\ndef other"), {"other": ["x_ptr"]},
                     "fam.kernels")


# the discovery of a real compile run twice, without a cache: as shipped (prefill extents only) and
# with every extent reproduced (as it was); the extent phases each run bound launches for
_DISCOVERY = """import json, sys
from ninfer_compile.codegen import aot
from ninfer_runtime.executor import ExtentRunner

bound, discover, reproduce = ExtentRunner.bound, aot.column_parameters, aot._reproduce
seen, out = [], {}

def logged(self, n=None):
    seen.append(self.phase)
    return bound(self, n)

def both(*args, **kw):
    out["prefill_only"] = discover(*args, **kw)
    out["phases"], seen[:] = sorted(set(seen)), []
    aot._reproduce = lambda *a, phases=None, **k: reproduce(*a, **k)
    out["every_extent"] = discover(*args, **kw)
    out["phases_every_extent"] = sorted(set(seen))
    aot._reproduce = reproduce
    return out["prefill_only"]

ExtentRunner.bound, aot.column_parameters = logged, both
from ninfer_compile.cli import main
rc = main(sys.argv[1:])
print(json.dumps(out))
sys.exit(rc)
"""


def test_discovery_reproduces_only_prefill_extents_and_answers_as_every_extent_did(tmp_path):
    """The column-count discovery binds no decode or verify launch (their kernels keep their
    specialisation, read from the plan), and names the same parameters as the discovery that
    reproduced every extent, on a plan with decode and verify extents (tiny model, no binaries)."""
    import json
    import subprocess
    import sys

    from ninfer_compile.convert.synthetic import pack_synthetic

    from .aot_support import COMPILE_ARGS, REPO, SM, aot_env

    art = tmp_path / "tiny.ninfer"
    pack_synthetic("tiny-qwen3.5", art, progress=False)
    p = subprocess.run([sys.executable, "-c", _DISCOVERY, str(art), "--sm", str(SM), "-o", str(tmp_path / "p.plan"),
                        *COMPILE_ARGS, "--concurrency", "1,2", "--draft-tokens", "2", "--no-binaries",
                        "--no-column-specialization", "--quiet"],
                       capture_output=True, text=True, env=aot_env(tmp_path / "user-cache"), cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["phases"] == ["prefill"]
    assert got["phases_every_extent"] == ["decode", "prefill", "verify"]
    assert got["prefill_only"] and got["prefill_only"] == got["every_extent"]


def test_default_plan_leaves_prefill_column_counts_unspecialised(aot, aot_columns):
    """The tiny plan compiled by default (binaries built): the prefill-only kernels' column count is
    named in their emitted decorator, each remaining specialisation is compiled (strict, no failure),
    there are fewer binaries than with --column-specialization, and the plan says it was compiled
    so; the --column-specialization plan is unmarked."""
    import json

    plan, specialised = aot["plan"], aot_columns["plan"]
    options = json.loads((plan / "plan.json").read_text())["options"]
    assert options["column_specialization"] is False
    assert "column_specialization" not in json.loads((specialised / "plan.json").read_text())["options"]
    marked = [p for p in (plan / "kernels").rglob("*.py") if "do_not_specialize=" in p.read_text()]
    assert marked and not [p for p in (specialised / "kernels").rglob("*.py") if "do_not_specialize=" in p.read_text()]
    man = json.loads((plan / "kernels" / "bin" / "manifest.json").read_text())
    man_specialised = json.loads((specialised / "kernels" / "bin" / "manifest.json").read_text())
    assert man["failed"] == [] and man["unbound"] == []
    assert 0 < len(man["entries"]) < len(man_specialised["entries"])
    named = {}  # "module:kernel" -> the parameters its decorator leaves unspecialised
    for p in marked:
        module = p.relative_to(plan / "kernels").with_suffix("").as_posix().replace("/", ".")
        for params, name in re.findall(r"@triton\.jit\(do_not_specialize=(\[.*?\])\)\ndef (\w+)", p.read_text()):
            named[f"{module}:{name}"] = ast.literal_eval(params)
    checked = 0
    for e in man["entries"]:  # never folded to a constant (== 1), never given a divisibility hint
        spec = json.loads(e["specialization"])
        names = list(spec["signature"])
        hinted = {names[k[0]] for k, v in zip(spec["attrs_keys"], spec["attrs_vals"]) if v}
        for param in named.get(e["kernel"], []):
            assert spec["signature"][param] != "constexpr" and param not in hinted, (e["kernel"], param)
            checked += 1
    assert checked
    # a kernel a decode (or verify) extent launches keeps its specialisation: the decode step's code
    # is the default plan's
    routes = json.loads((plan / "kernels" / "manifest.json").read_text())["routes"]
    steady = {k for ext in json.loads((plan / "plan.json").read_text())["extents"].values()
              if ext["phase"] != "prefill" for launch in ext["launches"] for k in routes[launch["route"]]["kernels"]}
    assert steady and not steady & set(named), sorted(steady & set(named))
