"""Programmatic dependent launch (ninfer_compile/kernels/pdl.py): the contract every kernel keeps,
the launch decision, and the sm_90 code it produces.

A PDL launch lets the next kernel start before this one has finished; it is only safe when that
kernel waits (`griddepcontrol.wait`) before its first memory access. These tests read every kernel
module's source: a kernel with the PDL parameter calls `pdl_enter(PDL)` first, or
`pdl_release(PDL)`, weight-prefetch calls (arguments: kernel parameters only; bodies: address
arithmetic and `pdl_prefetch_rows` only) and `pdl_acquire(PDL)`; every launch site hands its own
kernel to `pdl_launch`.
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
PREFETCHERS = {"lowreg_prefetch", "gemv_prefetch", "w8_tc_prefetch"}  # linear/prefetch.py
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
    prefetching = {}
    for rel, tree in _modules():
        for fn in ast.walk(tree):
            if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn)):
                continue
            names = [a.arg for a in fn.args.args]
            if "PDL" not in names or fn.name in PREFETCHERS:  # (the prefetchers are checked below)
                continue
            kernels[fn.name] = rel
            assert names[-1] == "PDL" and ast.unparse(fn.args.defaults[-1]) == "False", (rel, fn.name)
            body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
                else fn.body
            first = ast.unparse(body[0])
            if first == "pdl_release(PDL)":
                n = _prefetch_entry(rel, fn, body, names)
                prefetching[fn.name] = n
            else:
                assert first == "pdl_enter(PDL)", f"{rel}:{fn.name}: first statement {first!r}"
    assert len(kernels) >= 20, kernels
    # the T = 1 GEMVs of the sm90 table prefetch their weights (low-register, plain, W8 tensor-core)
    assert set(prefetching) == {"gemv_lowreg_kernel", "qlinear_gemv_kernel", "gemv_tc_w8_kernel"}, prefetching


def _prefetch_entry(rel, fn, body, params) -> int:
    """`pdl_release(PDL)`, then prefetch calls whose arguments are bare kernel parameters (no load can
    hide in them), then `pdl_acquire(PDL)`; returns the number of prefetch calls."""
    n = 0
    for stmt in body[1:]:
        text = ast.unparse(stmt)
        if text == "pdl_acquire(PDL)":
            assert n >= 1, f"{rel}:{fn.name}: pdl_release without a prefetch"
            return n
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        assert isinstance(call, ast.Call) and ast.unparse(call.func) in PREFETCHERS, \
            f"{rel}:{fn.name}: {text!r} before pdl_acquire(PDL)"
        assert not call.keywords and all(isinstance(a, ast.Name) and a.id in params for a in call.args), \
            f"{rel}:{fn.name}: {text!r}: prefetch arguments must be kernel parameters"
        n += 1
    raise AssertionError(f"{rel}:{fn.name}: pdl_release(PDL) without pdl_acquire(PDL)")


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)}


def test_prefetchers_touch_memory_only_by_an_l2_prefetch():
    """The pre-wait code reads no memory a previous kernel may write: the prefetchers only compute
    addresses (program ids, arithmetic) and call pdl_prefetch_rows, which only issues the bulk L2
    prefetch asm (no load, store or atomic in its text)."""
    found = {}
    for rel, tree in [*_modules(), ("pdl.py", ast.parse(Path(pdl.__file__).read_text()))]:
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and (fn.name in PREFETCHERS or fn.name == "pdl_prefetch_rows"):
                found[fn.name] = _calls(fn)
    assert set(found) == PREFETCHERS | {"pdl_prefetch_rows"}, found
    for name in PREFETCHERS:
        assert found[name] <= {"tl.program_id", "tl.static_range", "pdl_prefetch_rows"}, (name, found[name])
    assert found["pdl_prefetch_rows"] <= {"row0.to", "(n_rows - 1).to", "ptr.to", "tl.minimum", "tl.maximum",
                                          "tl.maximum(e - a, 0).to", "tl.inline_asm_elementwise"}, \
        found["pdl_prefetch_rows"]
    asm = pdl.PREFETCH_L2_ASM.value
    assert "cp.async.bulk.prefetch.L2.global" in asm
    for op in ("ld.", "st.", "atom", "red.", "cp.async.bulk.global", "cp.async.bulk.shared"):
        assert op not in asm.replace("cp.async.bulk.prefetch", ""), op


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


@pytest.mark.parametrize("arch, interpret, env, early, want", [
    (90, "0", None, None, pdl.PDL_LATE), (100, "0", None, None, pdl.PDL_LATE), (89, "0", None, None, None),
    (86, "0", None, None, None), (90, "1", None, None, None), (90, "0", "0", None, None),
    (90, "0", "1", None, pdl.PDL_LATE), (90, "0", None, "0", pdl.PDL_LATE), (90, "0", None, "1", pdl.PDL_EARLY),
    (90, "0", "0", "1", None), (86, "0", None, "1", None), (90, "1", None, "1", None)])
def test_launch_decision(monkeypatch, arch, interpret, env, early, want):
    """PDL on sm_90+ outside the interpreter unless NINFER_PDL=0; the entry order (the PDL constexpr,
    part of the binary's key) from NINFER_PDL_EARLY."""
    from ninfer_compile.kernels.norms.kernels import rmsnorm_rows_kernel

    _stub_driver(monkeypatch, arch)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    for var, val in (("NINFER_PDL", env), ("NINFER_PDL_EARLY", early)):
        if val is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, val)
    assert pdl.pdl_launch(rmsnorm_rows_kernel) == {}  # not allowed by the caller (prefill, eager)
    old = pdl.allow(True)  # what the runtime does around a launch of a decode extent
    try:
        assert pdl.pdl_launch(rmsnorm_rows_kernel) == ({} if want is None else {"PDL": want, "launch_pdl": True})
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
from ninfer_compile.kernels.norms.kernels import rmsnorm_rows_kernel
from ninfer_compile.kernels.linear.gemv import qlinear_gemv_kernel
from ninfer_compile.kernels.linear.gemv_lowreg import gemv_lowreg_kernel
from ninfer_compile.kernels.linear.gemv_tc_w8 import gemv_tc_w8_kernel
PTR = {'x_ptr': '*bf16', 'base_ptr': '*i32', 'high_ptr': '*i32', 'scale_ptr': '*fp16', 'out_ptr': '*bf16',
       'res_ptr': '*bf16', 'ws_ptr': '*fp32', 'cnt_ptr': '*i32', 'w_ptr': '*bf16'}
GEMV = dict(EPI=1, BLOCK_T=1, SPLIT_K=1, INTERP=False, USE_ASM=True)
CASES = {  # name: kernel, constexprs, compile options
    'norm': (rmsnorm_rows_kernel, dict(MODE=0, BLOCK=1024), {'num_warps': 4}),
    'lowreg': (gemv_lowreg_kernel, dict(GEMV, FMT=5, BLOCK_N=2, BLOCK_K=1024, CHAIN=1, PREFETCH=True, L2_HINT=False,
                                        FUSED_REDUCE=False, ASYNC=0, PDL_PREFETCH_BYTES=4096), {'num_warps': 1}),
    'gemv_bf16': (qlinear_gemv_kernel, dict(GEMV, FMT=16, BLOCK_N=16, BLOCK_K=256, USE_ASM=False, EPI=0,
                                            PDL_PREFETCH_BYTES=4096), {'num_warps': 4}),
    'tc_w8': (gemv_tc_w8_kernel, dict(EPI=1, N_TILES=1, SPLIT_K=1, NW=4, PREFETCH=True, FUSED_REDUCE=False,
                                      PDL_PREFETCH_BYTES=4096), {'num_warps': 4}),
}
def compiled(name, arch, pdl):
    fn, consts, opts = CASES[name]
    consts = dict(consts, PDL=pdl)
    names = fn.arg_names
    sig = {n: ('constexpr' if n in consts else PTR.get(n, 'fp32' if n == 'eps' else 'i32')) for n in names}
    if name == 'norm':
        sig = {n: ('*bf16' if v.startswith('*') else v) for n, v in sig.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget('cuda', arch, 32), options=dict(opts, launch_pdl=bool(pdl))).asm
def sass_order(cubin):  # SASS offsets of: PREEXIT (launch_dependents), UBLKPF (bulk prefetch), ACQBULK (wait), LDG
    import os, subprocess, tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin); f.flush()
        text = subprocess.run([tool, '-sass', f.name], capture_output=True, text=True, check=True).stdout
    return [text.find(s) for s in ('PREEXIT', 'UBLKPF.L2', 'ACQBULK', 'LDG')]
def where(text):  # first offset of: wait, launch_dependents, bulk L2 prefetch, a global load; -1 = absent
    return [text.find(s) for s in ('griddepcontrol.wait', 'griddepcontrol.launch_dependents',
                                   'cp.async.bulk.prefetch.L2', 'ld.global')] + [text.count('cp.async.bulk.prefetch.L2')]
out = {f'{name}-{arch}-{pdl}': where(compiled(name, arch, pdl)['ptx'])
       for name, runs in (('norm', ((90, 1), (90, 2), (90, 0), (86, 0))),
                          ('lowreg', ((90, 1), (90, 2), (90, 0))), ('gemv_bf16', ((90, 2),)), ('tc_w8', ((90, 2),)))
       for arch, pdl in runs}
out['sass'] = sass_order(compiled('lowreg', 90, 2)['cubin'])
print(json.dumps(out))
"""


def test_sm90_code_orders_release_prefetch_and_wait():
    """Compiled for sm_90 with the installed Triton (child process: the suite runs the interpreter):
    PDL_LATE waits, then releases the next grid; PDL_EARLY releases first; the prefetching GEMVs
    issue their bulk L2 prefetches (gate + up: base, scale and Q5 high planes = 6) after the release
    and before the wait; no global load precedes the wait (PTX; and the SASS of the early Q5
    GEMV: PREEXIT, UBLKPF.L2, ACQBULK, then the first LDG); PDL off and sm_86 emit none of it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_CHILD], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    release, prefetch, wait, load = got.pop("sass")  # the machine code keeps that order too (ptxas)
    assert 0 <= release < prefetch < wait < load, (release, prefetch, wait, load)
    for key, (wait, launch, pf, load, n_pf) in got.items():
        name, arch, mode = key.split("-")
        if mode == "0":
            assert (wait, launch, pf, n_pf) == (-1, -1, -1, 0), key
            continue
        assert 0 <= wait < load, key  # every global load after the wait
        assert (0 <= launch < wait) if mode == "2" else (wait < launch), key
        if name == "norm":
            assert n_pf == 0, key
        else:
            assert n_pf == {"lowreg": 6, "gemv_bf16": 1, "tc_w8": 4}[name] and pf < wait, key
            assert mode != "2" or launch < pf, key
    assert len(got) == 9, got
