"""The capture's fake device and launch signatures without a compile (codegen/aot_device.py,
codegen/aot_capture.py): the matmuls the fake computes itself give torch's shapes, dtypes and
refusals, and a launch signature leaves caches (repr=False dataclass fields) out."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

from ninfer_compile.codegen.aot_capture import launch_signature
from ninfer_compile.codegen.aot_device import fake_tensors

from .aot_support import REPO

BF = torch.bfloat16


def _both(fake, shape, dtype=BF, t=False):
    """(fake tensor, CPU tensor) of one shape; `t`: both transposed views."""
    f, c = fake.empty(shape, dtype), torch.zeros(shape, dtype=dtype)
    return (f.t(), c.t()) if t else (f, c)


CASES = [  # (name, call) over x [a,k], w [k,n] (a transposed view), o [out_rows,n] (an out or a base)
    ("mm", lambda x, w, o, r: torch.mm(x, w)),
    ("mm out", lambda x, w, o, r: torch.mm(x, w, out=o)),
    ("Tensor.mm", lambda x, w, o, r: x.mm(w)),
    ("addmm", lambda x, w, o, r: torch.addmm(o, x, w)),
    ("addmm out", lambda x, w, o, r: torch.addmm(o, x, w, out=r)),  # r: a separate [a,n] out
    ("Tensor.addmm", lambda x, w, o, r: o.addmm(x, w)),
    ("addmm_", lambda x, w, o, r: o.addmm_(x, w)),
]


@pytest.mark.parametrize("name,call", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("a,k,n,out_rows,wdtype", [
    (3, 8, 5, 3, BF),  # fits
    (1, 7, 9, 1, BF),  # odd sizes
    (3, 8, 5, 2, BF),  # out / base of the wrong rows
    (3, 8, 5, 1, BF),  # a base row that broadcasts (addmm) but cannot be written in place (addmm_)
    (3, 8, 5, 3, torch.float32),  # mixed dtypes
])
def test_fake_matmuls_give_torchs_shapes_and_refusals(name, call, a, k, n, out_rows, wdtype):
    fake = fake_tensors()
    (fx, cx), (fw, cw), (fo, co) = _both(fake, (a, k)), _both(fake, (n, k), wdtype, t=True), _both(fake, (out_rows, n))
    fr, cr = _both(fake, (a, n))
    try:
        want = call(cx, cw, co, cr)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            call(fx, fw, fo, fr)
        return
    got = call(fx, fw, fo, fr)
    assert isinstance(got, fake.AotTensor)
    assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype)
    written = {"mm out": fo, "addmm out": fr, "addmm_": fo}.get(name)
    if written is not None:  # the result is `out` (resized as torch resizes it)
        assert got.data_ptr() == written.data_ptr()


def test_fake_matmuls_import_neither_dynamo_nor_sympy():
    """torch's meta kernels for these matmuls import torch._dynamo and sympy (seconds of CPU): the
    fake computes the shapes without them."""
    code = ("import sys, torch\n"
            "from ninfer_compile.codegen.aot_device import fake_tensors\n"
            "f = fake_tensors(); x = f.empty((4, 8), torch.bfloat16); w = f.empty((16, 8), torch.bfloat16).t()\n"
            "o = f.empty((4, 16), torch.bfloat16)\n"
            "torch.mm(x, w, out=o); torch.addmm(o, x, w, out=o); o.addmm_(x, w)\n"
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"


@dataclass(eq=False)
class _Weight:
    planes: torch.Tensor
    rows: int
    _views: dict = field(default_factory=dict, repr=False)


def test_signature_leaves_cache_fields_out():
    """A repr=False field (a cache a launcher fills) does not change the signature; a value does."""
    fake = fake_tensors()
    planes = fake.empty((64,), torch.uint8)
    out = fake.empty((4, 4), BF)
    w = _Weight(planes, 4)
    before = launch_signature({"weight": w, "out": out}, fake.AotTensor)
    w._views["words"] = planes.view(torch.int32)
    assert launch_signature({"weight": w, "out": out}, fake.AotTensor) == before
    assert launch_signature({"weight": _Weight(planes, 8), "out": out}, fake.AotTensor) != before
