"""Kernel emission (ninfer_compile/codegen/emit.py): standalone copies, import rewriting, the
self-containment rule, deterministic bytes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer_compile.codegen import emit as E
from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain

from . import support as S


def _fake_tree(root: Path, launch_src: str) -> Path:
    pkg = root / "ninfer_compile"
    (pkg / "kernels" / "fam").mkdir(parents=True)
    (pkg / "kernels" / "shared").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("class RouteError(Exception):\n    pass\n")
    (pkg / "kernels" / "__init__.py").write_text("from .registry import *  # never copied\n")
    (pkg / "kernels" / "registry.py").write_text("raise RuntimeError('the registry must not be emitted')\n")
    (pkg / "kernels" / "fam" / "__init__.py").write_text('"""fam"""\n')
    (pkg / "kernels" / "fam" / "kern.py").write_text(
        "from ninfer_compile.kernels.shared.util import twice\n\nSCALE = 3\n\ndef k(x):\n    return twice(x) * SCALE\n")
    (pkg / "kernels" / "fam" / "launch.py").write_text(launch_src)
    (pkg / "kernels" / "fam" / "unused.py").write_text("import ninfer_compile.errors as e\n")
    (pkg / "kernels" / "shared" / "__init__.py").write_text("")
    (pkg / "kernels" / "shared" / "util.py").write_text("def twice(x):\n    return 2 * x\n")
    return pkg


GOOD_LAUNCH = '''"""launcher"""
from ninfer_compile.kernels.fam import kern as K
from .kern import k
import ninfer_compile.kernels.shared.util as U


def go(x, scale=1):
    from ninfer_compile.kernels.shared.util import (
        twice,
    )
    return k(x) + twice(x) + U.twice(0) + K.SCALE * scale
'''


def _route(name="r1", params=None):
    return Route(name=name, family="fam", domain=RouteDomain(max_t=8),
                 params=params or {"scale": ParamSpec("scale", (1, 2), 1)},
                 reference="ninfer_compile.kernels.fam.kern:k", launcher="ninfer_compile.kernels.fam.launch:go",
                 kernels=("ninfer_compile.kernels.fam.kern:k",))


def _import_emitted(plan: Path, name: str):
    kdir = plan / "kernels"
    spec = importlib.util.spec_from_file_location(name, kdir / "__init__.py", submodule_search_locations=[str(kdir)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module(f"{name}.fam.launch")


def test_emit_rewrites_imports_into_a_standalone_package(tmp_path, monkeypatch):
    pkg = _fake_tree(tmp_path / "src", GOOD_LAUNCH)
    monkeypatch.setattr(E, "_pkg_root_dir", lambda: pkg)
    plan = tmp_path / "a.plan"
    plan.mkdir()
    (plan / "kernels").mkdir()
    (plan / "kernels" / "routes.json").write_text("{}\n")  # written by the plan writer: kept
    route = _route()
    man = E.emit_kernels(plan, [(route, {"scale": 2}), (route, None)])
    files = sorted(p.relative_to(plan).as_posix() for p in plan.rglob("*") if p.is_file())
    assert files == ["kernels/__init__.py", "kernels/fam/__init__.py", "kernels/fam/kern.py", "kernels/fam/launch.py",
                     "kernels/manifest.json", "kernels/routes.json", "kernels/shared/__init__.py",
                     "kernels/shared/util.py"]
    src = (plan / "kernels/fam/launch.py").read_text()
    assert "ninfer_compile" not in src.split('"""launcher"""')[1]
    assert "from . import kern as K" in src and "from ..shared import util as U" in src
    assert "from ..shared.util import twice" in src and "from .kern import k" in src
    r = man["routes"]["r1"]
    assert r["launcher"] == "fam.launch:go" and r["kernels"] == ["fam.kern:k"]
    assert r["domain"] == {"min_t": 1, "max_t": 8}
    assert r["params"] == [{"scale": 1}, {"scale": 2}]
    assert set(r["modules"]) == {"kernels/fam/kern.py", "kernels/fam/launch.py", "kernels/shared/util.py",
                                 "kernels/fam/__init__.py", "kernels/shared/__init__.py"}
    assert json.loads((plan / "kernels/manifest.json").read_text()) == man
    go = _import_emitted(plan, "_emit_test_pkg_a").go
    assert go(5, scale=2) == 5 * 2 * 3 + 10 + 0 + 6


def test_emit_is_deterministic(tmp_path, monkeypatch):
    pkg = _fake_tree(tmp_path / "src", GOOD_LAUNCH)
    monkeypatch.setattr(E, "_pkg_root_dir", lambda: pkg)
    outs = []
    for i in range(2):
        plan = tmp_path / f"p{i}"
        plan.mkdir()
        r = _route()
        E.emit_kernels(plan, [(r, {"scale": 2})] if i else [(r, {"scale": 2}), (r, {"scale": 2})])
        outs.append({p.relative_to(plan).as_posix(): p.read_bytes() for p in sorted(plan.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1]


def test_emit_refuses_imports_outside_kernels(tmp_path, monkeypatch):
    pkg = _fake_tree(tmp_path / "src", "from ninfer_compile.errors import RouteError\n\ndef go(x):\n    return x\n")
    monkeypatch.setattr(E, "_pkg_root_dir", lambda: pkg)
    plan = tmp_path / "b.plan"
    plan.mkdir()
    with pytest.raises(E.EmitError, match=r"kernel module ninfer_compile\.kernels\.fam\.launch imports "
                                          r"ninfer_compile\.errors"):
        E.emit_kernels(plan, [(_route(), None)], vendor=())
    assert not (plan / "kernels").exists()
    # relative escapes are caught too
    (pkg / "kernels" / "fam" / "launch.py").write_text("def go(x):\n    from ...errors import RouteError\n    return x\n")
    with pytest.raises(E.EmitError, match="imports ninfer_compile.errors"):
        E.emit_kernels(plan, [(_route(), None)], vendor=())
    # the explicit vendor list copies them instead
    man = E.emit_kernels(plan, [(_route(), None)], vendor=("ninfer_compile.errors",))
    assert man["vendored"] == ["ninfer_compile.errors"]
    assert "from .._ext.errors import RouteError" in (plan / "kernels/fam/launch.py").read_text()
    assert (plan / "kernels/_ext/errors.py").is_file()


def test_emit_real_route_library_standalone(tmp_path):
    """The real library's launchers emit and import with ninfer_compile blocked (its two leaf
    dependencies, KERNEL_DEPENDENCIES, are vendored into the plan)."""
    from ninfer_compile.kernels.registry import get_route

    names = ["rmsnorm_rows", "bf16_tiled", "q4_small_t_mma", "embedding_rowsplit", "attention_decode_splitkv",
             "gdn_chunked_prefill", "conv1d_prefill", "kv_append_rows", "qk_norm_rope_fused", "gated_rmsnorm_rows"]
    launches = [(get_route(n), None) for n in names]
    with pytest.raises(E.EmitError, match="outside ninfer_compile.kernels"):
        E.emit_kernels(tmp_path, launches, vendor=())
    man = E.emit_kernels(tmp_path, launches)
    import ast

    for p in (tmp_path / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level > 0 or not (node.module or "").startswith("ninfer_compile"), p
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("ninfer_compile") for a in node.names), p
    code = f"""
{S.BLOCK_NINFER_COMPILE}import importlib, importlib.util
kdir = {str(tmp_path / "kernels")!r}
spec = importlib.util.spec_from_file_location("plan_k", kdir + "/__init__.py", submodule_search_locations=[kdir])
m = importlib.util.module_from_spec(spec); sys.modules["plan_k"] = m; spec.loader.exec_module(m)
for ref in {sorted(r["launcher"] for r in man["routes"].values())!r}:
    mod, _, fn = ref.partition(":")
    getattr(importlib.import_module("plan_k." + mod), fn)
print("OK")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                       env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-2000:]
