"""Programmatic dependent launch (ninfer_compile/kernels/pdl.py): the contract every kernel keeps,
the launch decision, and the sm_90 code it produces.

A PDL launch lets the next kernel start before this one has finished; it is only safe when that
kernel waits (`griddepcontrol.wait`) before its first memory access. These tests read every kernel
module's source: a kernel with the PDL parameter calls `pdl_enter(PDL)` first, and every launch
site hands its own kernel to `pdl_launch`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer_compile.kernels import pdl

KERNELS = Path(pdl.__file__).resolve().parent
REPO = KERNELS.parents[1]
SKIP = {"gdn/launch_chunked_wy.py", "gdn/kernels_chunked_wy.py"}  # the fast GDN prefill: in no table, launched plainly


def _modules():
    for p in sorted(KERNELS.rglob("*.py")):
        rel = p.relative_to(KERNELS).as_posix()
        if rel not in SKIP and rel != "pdl.py":
            yield rel, ast.parse(p.read_text())


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _launch_sites(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel"):
            yield node


def test_pdl_kernels_wait_before_anything_else():
    kernels = {}
    for rel, tree in _modules():
        for fn in ast.walk(tree):
            if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn)):
                continue
            names = [a.arg for a in fn.args.args]
            if "PDL" not in names:
                continue
            kernels[fn.name] = rel
            assert names[-1] == "PDL" and ast.unparse(fn.args.defaults[-1]) == "False", (rel, fn.name)
            body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
                else fn.body
            assert ast.unparse(body[0]) == "pdl_enter(PDL)", f"{rel}:{fn.name}: first statement {ast.unparse(body[0])!r}"
    assert len(kernels) >= 20, kernels


def test_every_launch_site_passes_its_own_kernel():
    launched = set()
    for rel, tree in _modules():
        for call in _launch_sites(tree):
            name = call.func.value.id
            launched.add(name)
            star = [k.value for k in call.keywords if k.arg is None]
            own = [s for s in star if isinstance(s, ast.Call) and ast.unparse(s.func) == "pdl_launch"]
            assert len(own) == 1 and ast.unparse(own[0].args[0]) == name, f"{rel}: launch of {name} without pdl_launch({name})"
    assert len(launched) >= 20


def _stub_driver(monkeypatch, arch):
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Stub:
        def get_current_target(self):
            return GPUTarget("cuda", arch, 32)

    stub = Stub()
    monkeypatch.setattr(driver, "_active", stub, raising=False)
    monkeypatch.setattr(type(driver), "active", property(lambda self: stub), raising=False)
    pdl._ARCH.clear()


@pytest.mark.parametrize("arch, interpret, env, on", [
    (90, "0", None, True), (100, "0", None, True), (89, "0", None, False), (86, "0", None, False),
    (90, "1", None, False), (90, "0", "0", False), (90, "0", "1", True)])
def test_launch_decision(monkeypatch, arch, interpret, env, on):
    from ninfer_compile.kernels.norms.kernels import rmsnorm_rows_kernel

    _stub_driver(monkeypatch, arch)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    if env is None:
        monkeypatch.delenv("NINFER_PDL", raising=False)
    else:
        monkeypatch.setenv("NINFER_PDL", env)
    assert pdl.pdl_launch(rmsnorm_rows_kernel) == {}  # not allowed by the caller (prefill, eager)
    old = pdl.allow(True)  # what the runtime does around a launch of a decode extent
    try:
        assert pdl.pdl_launch(rmsnorm_rows_kernel) == ({"PDL": True, "launch_pdl": True} if on else {})
    finally:
        pdl.allow(old)
    from ninfer_compile.kernels.gdn.kernels_chunked_wy import gdn_wy_prep_kernel

    assert pdl.pdl_launch(gdn_wy_prep_kernel) == {}  # no PDL parameter: never launched with PDL
    pdl._ARCH.clear()


_COMPILE_CHILD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ninfer_compile.kernels.norms.kernels import rmsnorm_rows_kernel as fn
out = {}
for arch, on in ((90, True), (90, False), (86, False)):
    consts = dict(MODE=0, BLOCK=1024, PDL=on)
    names = fn.arg_names
    sig = {n: ('constexpr' if n in consts else ('*bf16' if n.endswith('_ptr') else ('fp32' if n == 'eps' else 'i32')))
           for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    ptx = triton.compile(src, target=GPUTarget('cuda', arch, 32), options={'num_warps': 4, 'launch_pdl': on}).asm['ptx']
    out[f"{arch}-{on}"] = [ptx.count('griddepcontrol.wait'), ptx.count('griddepcontrol.launch_dependents')]
print(json.dumps(out))
"""


def test_sm90_code_waits_then_releases_the_next_grid():
    """Compiled with the installed Triton (child process: the suite runs the interpreter): PDL=True
    emits one wait and one launch_dependents; PDL=False and sm_86 emit neither."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_CHILD], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"90-True": [1, 1], "90-False": [0, 0], "86-False": [0, 0]}, got
