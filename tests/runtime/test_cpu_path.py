"""The CPU path of a plan (issue 28): each family's torch implementation (its spec's `torch_impl`)
travels with the plan as its kernels do (kernels/manifest.json `torch_launcher`), and the runtime
runs it on the CPU by default (`--kernels torch`), or the plan's Triton kernels under the
interpreter on request (`--kernels interpret`). The plan is the same; a family without a torch
implementation is refused in one line naming it and the route; the torch path never imports triton."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from ninfer_compile.codegen import emit as E
from ninfer_compile.kernels import family
from ninfer_compile.kernels.family import family_specs
from ninfer_compile.kernels.registry import load_callable
from ninfer_runtime.device import kernel_mode
from ninfer_runtime.errors import PlanError

from . import support as S
from .test_emit import GOOD_LAUNCH, _fake_tree, _route

# families that have no CPU path yet (each is refused in one line on the torch path)
WITHOUT_TORCH: set[str] = set()

# a python -c child: `import triton` fails (the torch path must never need it)
BLOCK_TRITON = """import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
"""


def _fake_spec(name: str, torch_impl: str | None):
    spec = family_specs()["rmsnorm"]
    return dataclasses.replace(spec, name=name, torch_impl=torch_impl)


def test_emission_copies_the_torch_implementation_and_records_it(tmp_path, monkeypatch):
    pkg = _fake_tree(tmp_path / "src", GOOD_LAUNCH)
    fam = pkg / "kernels" / "fam"
    (fam / "torch_impl.py").write_text("from ninfer_compile.kernels.shared.util import twice\n\n\n"
                                       "def fam(x, *, workspace=None, **params):\n    return twice(x)\n")
    monkeypatch.setattr(E, "_pkg_root_dir", lambda: pkg)
    specs = {**family_specs(), "fam": _fake_spec("fam", "ninfer_compile.kernels.fam.torch_impl:fam")}
    monkeypatch.setattr(family._default, "_specs", specs)
    plan = tmp_path / "a.plan"
    plan.mkdir()
    man = E.emit_kernels(plan, [(_route(), None)])
    r = man["routes"]["r1"]
    assert r["torch_launcher"] == "fam.torch_impl:fam"
    assert set(r["torch_modules"]) == {"kernels/fam/__init__.py", "kernels/fam/torch_impl.py",
                                       "kernels/shared/__init__.py", "kernels/shared/util.py"}
    text = (plan / "kernels/fam/torch_impl.py").read_text()
    assert "from ..shared.util import twice" in text and "ninfer_compile" not in text.split("\n", 1)[1]
    assert man["files"]["kernels/fam/torch_impl.py"]  # covered by the file hashes (and the plan's integrity)

    # a family without one: recorded as None, nothing copied for it
    specs["fam"] = _fake_spec("fam", None)
    shutil.rmtree(plan / "kernels")
    man = E.emit_kernels(plan, [(_route(), None)])
    assert man["routes"]["r1"]["torch_launcher"] is None and man["routes"]["r1"]["torch_modules"] == {}
    assert not (plan / "kernels/fam/torch_impl.py").exists()

    # a torch implementation importing triton (itself or through a module it imports) is refused
    (pkg / "kernels" / "shared" / "util.py").write_text("import triton\n\ndef twice(x):\n    return 2 * x\n")
    specs["fam"] = _fake_spec("fam", "ninfer_compile.kernels.fam.torch_impl:fam")
    with pytest.raises(E.EmitError, match=r"ninfer_compile\.kernels\.shared\.util \(line 1\) imports triton"):
        E.emit_kernels(plan, [(_route(), None)])
    (pkg / "kernels" / "shared" / "util.py").write_text("def twice(x):\n    return 2 * x\n")
    specs["fam"] = _fake_spec("fam", "ninfer_compile.kernels.fam.torch_impl:missing")
    with pytest.raises(E.EmitError, match=r"family fam: torch_impl .*:missing names no function"):
        E.emit_kernels(plan, [(_route(), None)])


@pytest.mark.parametrize("name", sorted(family_specs()))
def test_every_family_declares_its_torch_implementation(name):
    s = family_specs()[name]
    if name in WITHOUT_TORCH:
        assert s.torch_impl is None
        return
    assert s.torch_impl == f"{s.reference.rpartition('.')[0]}.torch_impl:{name}", s.torch_impl
    assert callable(load_callable(s.torch_impl))


def test_kernel_modes():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert kernel_mode(cpu, None) == "torch" and kernel_mode(cpu, "interpret") == "interpret"
    assert kernel_mode(gpu, None) == "triton"
    with pytest.raises(PlanError, match=r"--kernels torch selects a CPU path, and the device is a GPU"):
        kernel_mode(gpu, "torch")
    with pytest.raises(PlanError, match=r"--kernels must be one of torch, interpret, got 'cuda'"):
        kernel_mode(cpu, "cuda")


def _run_cli(*args, block_triton=False, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"PYTHONPATH": str(S.RUNTIME), **(env_extra or {})})
    code = (BLOCK_TRITON if block_triton else "") + S.BLOCK_NINFER_COMPILE + \
        "from ninfer_runtime.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_torch_path_runs_without_triton(tiny_plan):
    """ninfer-run on the CPU with triton unimportable and TRITON_INTERPRET unset: the load line says
    the torch path, and the tokens are the in-process engine's."""
    import ninfer_runtime as nr

    art, plan = tiny_plan
    with nr.load(plan, art, progress=False) as eng:
        assert eng.kernels == "torch" and "kernels: torch (CPU)" in eng.device_note
        want = eng.generate(S.PROMPT, 4, ignore_eos=True).tokens
    p = _run_cli(plan, "--artifact", art, "--tokens", ",".join(map(str, S.PROMPT)), "--max-new-tokens", 4,
                 "--ignore-eos", block_triton=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "kernels: torch (CPU)" in p.stderr
    assert p.stdout.strip().splitlines()[-1] == "tokens: " + " ".join(map(str, want))


def _without_torch_launcher(tiny_plan, dest, family_name):
    art, plan = tiny_plan
    shutil.copytree(plan, dest)
    km = dest / "kernels" / "manifest.json"
    man = json.loads(km.read_text())
    routes = sorted(r for r, info in man["routes"].items() if info["family"] == family_name)
    for r in routes:
        man["routes"][r]["torch_launcher"] = None  # what emission writes for a family without one
    km.write_text(json.dumps(man, sort_keys=True, indent=1) + "\n")
    S.seal_plan_dir(dest)
    return art, routes


def test_a_family_without_torch_implementation_is_one_line(tiny_plan, tmp_path):
    import ninfer_runtime as nr

    art, routes = _without_torch_launcher(tiny_plan, tmp_path / "p.plan", "rmsnorm")
    line = (rf"family rmsnorm \(route {routes[0]}\) has no torch implementation: the CPU's torch path cannot run "
            rf"it; use --kernels interpret")
    with pytest.raises(PlanError, match=line):
        nr.load(tmp_path / "p.plan", art, progress=False)
    p = _run_cli(tmp_path / "p.plan", "--artifact", art, "--tokens", "1,2,3", "--max-new-tokens", 1, "--quiet")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: family rmsnorm"), p.stderr


def test_interpreted_plain_generation_agrees(tiny_plan):
    """One end-to-end run of the plan's Triton kernels under the interpreter (the CPU path's twin):
    its greedy tokens and the torch path's are each the fp32 reference's argmax (near-ties aside)."""
    import ninfer_runtime as nr

    art, plan = tiny_plan
    n = 3
    with nr.load(plan, art, progress=False, kernels="interpret") as eng:
        assert eng.kernels == "interpret" and "Triton interpreter" in eng.device_note
        interp = eng.generate(S.PROMPT, n, ignore_eos=True).tokens
    with nr.load(plan, art, progress=False) as eng:
        torch_tokens = eng.generate(S.PROMPT, n, ignore_eos=True).tokens
    ref = S.reference_logits_fn(art)
    for toks in (interp, torch_tokens):
        bad = S.check_tokens_against(ref, S.PROMPT, toks)
        assert not bad, "\n".join(bad)
