"""The CPU path's contract: every route family (but the fused GDN decode, being removed) has a
function named like the family in its folder's `torch_impl.py`, which accepts every argument of
every route of the family (operands, launcher attributes, route params, workspace) by name, and
the torch_impl modules import without Triton."""

import importlib
import inspect
import subprocess
import sys

import pytest

from ninfer_compile.codegen.emit import route_arguments
from ninfer_compile.kernels import registry
from ninfer_compile.kernels.family import family_specs

SKIP: set[str] = set()
FAMILIES = sorted(set(family_specs()) - SKIP)


def _folder(family: str) -> str:
    routes = registry.routes_for(family)
    assert routes, family
    return routes[0].launcher.partition(":")[0].split(".")[2]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_route_argument_is_accepted(family):
    mod = importlib.import_module(f"ninfer_compile.kernels.{_folder(family)}.torch_impl")
    fn = getattr(mod, family)
    sig = inspect.signature(fn)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for route in registry.routes_for(family):
        assert _folder(family) == route.launcher.partition(":")[0].split(".")[2], route.name
        for arg in route_arguments(route):
            names = [f"{arg['name']}{i}" for i in range(arg["parts"])] if arg["parts"] else [arg["name"]]
            for name in names:
                assert name in sig.parameters or ("constexpr" in arg["kinds"] and var_kw), \
                    f"{family}.torch_impl.{family} lacks argument {name!r} of route {route.name}"
        required = [n for n, p in sig.parameters.items() if p.default is p.empty
                    and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        args = {a["name"] for a in route_arguments(route) if not a["optional"]}
        missing = [n for n in required if n not in args]
        assert not missing, f"{family}: route {route.name} binds no {missing}"


def test_torch_impls_import_without_triton():
    folders = sorted({_folder(f) for f in FAMILIES})
    code = ("import sys, importlib\n"
            "class B:\n"
            "    def find_spec(self, n, p=None, t=None):\n"
            "        if n == 'triton' or n.startswith('triton.'): raise ImportError('triton blocked')\n"
            "sys.meta_path.insert(0, B())\n"
            f"for f in {folders!r}: importlib.import_module('ninfer_compile.kernels.' + f + '.torch_impl')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
