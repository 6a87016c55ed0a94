"""Route registry: dataclasses, domain checks, isolated registries, lazy family loading."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels import registry as R
from ninfer_compile.kernels.registry import ParamSpec, Registry, Route, RouteDomain

from .conftest import REF


def test_import_is_light_and_registration_does_not_import_triton():
    code = ("import sys, ninfer_compile.kernels.registry as r, ninfer_compile.routes; "
            "print('torch' in sys.modules, 'triton' in sys.modules); "
            "r.all_routes(); print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # importing the registry and the table code pulls neither torch nor triton; loading every
    # family's routes.py (registration is data only) must not import triton
    assert out.stdout.split() == ["False", "False", "False"], out.stdout


def test_duplicate_and_lookup():
    reg = Registry()
    r = reg.register(Route("a1", "rmsnorm", RouteDomain(), {}, REF))
    with pytest.raises(RouteError, match="already registered"):
        reg.register(Route("a1", "linear", RouteDomain(), {}, REF))
    assert reg.get_route("a1") is r and reg.routes_for("rmsnorm") == [r] and reg.all_routes() == [r]
    assert reg.families() == ["rmsnorm"] and "a1" in reg and len(reg) == 1
    with pytest.raises(RouteError, match="unknown route 'zz'"):
        reg.get_route("zz")


def test_route_validation():
    with pytest.raises(RouteError, match="default 3 is not one of"):
        ParamSpec("X", (1, 2), 3)
    with pytest.raises(RouteError, match="reference must be 'module:function'"):
        Route("a", "linear", RouteDomain(), {}, "nocolon")
    with pytest.raises(RouteError, match="max_t"):
        RouteDomain(min_t=4, max_t=2)
    with pytest.raises(RouteError, match="params"):
        Route("a", "linear", RouteDomain(), {"X": ParamSpec("Y", (1,), 1)}, REF)
    with pytest.raises(RouteError, match="tuple"):
        RouteDomain(formats="Q4G64_F16S")


def test_covers_and_params():
    r = Route("g", "linear", RouteDomain(formats=("Q4G64_F16S",), max_t=4, epilogues=("none", "residual"),
                                         k_multiple=64, max_n=8192, extra={"layout": ("rs",)}),
              {"B": ParamSpec("B", (32, 64), 64)}, REF)
    m = {"format": "Q4G64_F16S", "layout": "rs"}
    assert r.covers(1, 4, m) is None
    assert "max_t 4" in r.covers(1, 5, m)
    assert "unbounded" in r.covers(1, None, m)
    assert "min_t" in Route("h", "linear", RouteDomain(min_t=2), {}, REF).covers(1, 3, {})
    assert "format Q5G64_F16S" in r.covers(1, 1, {**m, "format": "Q5G64_F16S"})
    assert "does not pin format" in r.covers(1, 1, {"layout": "rs"})
    assert "epilogue swiglu" in r.covers(1, 1, {**m, "epilogue": "swiglu"})
    assert r.covers(1, 1, {**m, "epilogue": "residual"}) is None
    assert "does not pin layout" in r.covers(1, 1, {"format": "Q4G64_F16S"})
    assert "k=96 is not a multiple of 64" in r.covers(1, 1, {**m, "k": 96})
    assert "n=9000 exceeds max_n 8192" in r.covers(1, 1, {**m, "n": 9000})
    assert r.check_params({"B": 32}) is None
    assert "B=48" in r.check_params({"B": 48})
    assert "B=True" in r.check_params({"B": True})
    assert "no param 'C'" in r.check_params({"C": 1})
    assert r.resolve_params({}) == {"B": 64}
    assert r.domain.describe()["t"] == [1, 4]


def test_autoload_isolated_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fakekernels"
    (pkg / "fam_a").mkdir(parents=True)
    (pkg / "fam_b").mkdir()
    (pkg / "notes").mkdir()  # no routes.py: ignored
    (pkg / "__init__.py").write_text("from ninfer_compile.kernels.registry import Registry\nREG = Registry()\n")
    (pkg / "fam_a" / "__init__.py").write_text("")
    body = textwrap.dedent("""\
        from fakekernels import REG
        from ninfer_compile.kernels.registry import Route, RouteDomain
        REG.register(Route("{name}", "{fam}", RouteDomain(), {{}}, "{ref}"))
        """)
    (pkg / "fam_a" / "routes.py").write_text(body.format(name="ra", fam="fam_a", ref=REF))
    (pkg / "fam_b" / "routes.py").write_text(body.format(name="rb", fam="fam_b", ref=REF))  # namespace pkg
    monkeypatch.syspath_prepend(str(tmp_path))
    import fakekernels  # noqa: F401

    lazy = Registry(autoload="fakekernels")
    assert fakekernels.REG.families() == []
    assert lazy.families() == []  # loading imported the modules...
    assert sorted(lazy.loaded_modules) == ["fakekernels.fam_a.routes", "fakekernels.fam_b.routes"]
    assert [r.name for r in fakekernels.REG.all_routes()] == ["ra", "rb"]  # ...which registered


def test_autoload_broken_family_is_loud(tmp_path, monkeypatch):
    pkg = tmp_path / "brokenkernels"
    (pkg / "fam").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fam" / "routes.py").write_text("raise ValueError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RouteError, match="importing brokenkernels.fam.routes failed: ValueError: boom"):
        Registry(autoload="brokenkernels").all_routes()


def test_default_registry_loads_every_family_folder():
    R.all_routes()
    import pathlib

    kdir = pathlib.Path(R.__file__).parent
    with_routes = sorted(d.name for d in kdir.iterdir() if (d / "routes.py").is_file())
    loaded = sorted(m.split(".")[2] for m in R.default_registry.loaded_modules)
    assert loaded == with_routes
