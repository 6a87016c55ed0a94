"""TuneSpecs (`kernels/tuning.py`, `kernels/<folder>/tune.py`): the tuner learns every family from
them. A fake family registered through a test-only TuneSpec is planned, measured, checked at its
own tolerance, picked, ordered in the table and written without any change to tune/*.py; the
tuner's shared modules name no family."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ninfer_compile.cli import main
from ninfer_compile.errors import NinferError, RouteError
from ninfer_compile.kernels import tuning as TS
from ninfer_compile.kernels.registry import ParamSpec, Route, RouteDomain, default_registry, families, get_route
from ninfer_compile.routes import load_table
from ninfer_compile.tune import cli as tcli
from ninfer_compile.tune import crossover as X
from ninfer_compile.tune import measure as M
from ninfer_compile.tune.shapes import MatchCase, parse_families

TUNE_DIR = Path(__file__).resolve().parents[2] / "ninfer_compile" / "tune"
FAKE = "toyscale"


# --------------------------------------------------------------------------- the fake family
def _launch(x, out, scale, err):
    out.copy_(x * scale * (1.0 + err))


def _err(params) -> float:
    # BLOCK 4 is 5% off (inside the family's tolerance 0.1, outside the default 2e-2); BLOCK 2 is 50% off
    return {2: 0.5, 4: 0.05}.get(params.get("BLOCK", 1), 0.0)


class _Launch:
    """One launch; `us` is the fake timing the patched `time_launches` reports."""

    def __init__(self, fn, us):
        self.fn, self.us = fn, us

    def __call__(self):
        self.fn()


def build_toy(case, t, ctx, copies, seed=0):
    n = int(case.match["n"])
    g = M.generator(seed)
    x = M.randn((t, n), g, dtype=torch.float32)
    out = torch.empty(t, n, dtype=torch.float32, device=M.dev())
    nc = copies or 2

    def make(route, params, i):
        # rows wins small T, wide wins large T; BLOCK 4 is a little faster; deeper contexts cost more
        base = (2.0 + t) if route.name.endswith("_rows") else (10.0 + 0.1 * t)
        us = base * (0.9 if params.get("BLOCK") == 4 else 1.0) + (ctx or 0) / 1000.0
        return _Launch(lambda: _launch(x, out, 2.0, _err(params)), us)

    def check(route, params):
        make(route, params, 0)()
        return M.rel_rms(out, M.ref_call(route, x, 2.0))

    return M.Bench(case, t, ctx, x.numel() * 4, nc, make, check)


def _candidates(route, t, quick):
    # BLOCK 3 is not a legal value: the shared filter drops it; {} is the default spelling of BLOCK 1
    return [{}, {"BLOCK": 1}, {"BLOCK": 2}, {"BLOCK": 3}, {"BLOCK": 4}]


def _prune(route, t, quick):
    return route.name.endswith("_wide") and t < 4


TOY_SPEC = TS.TuneSpec(family=FAKE, order=15, builder=build_toy, tol=0.1, candidates=_candidates,
                       prune=_prune, contexts=True, group="toys")


@pytest.fixture
def toy(monkeypatch):
    default_registry.all_routes()  # the real families first
    block = {"BLOCK": ParamSpec("BLOCK", (1, 2, 4), 1)}
    for name, max_t in ((f"{FAKE}_rows", 8), (f"{FAKE}_wide", None)):
        r = Route(name, FAKE, RouteDomain(max_t=max_t, extra={"phase": ("decode", "prefill")}), block,
                  reference="torch:mul")
        monkeypatch.setitem(default_registry._routes, name, r)
    TS.register_tune_spec(TOY_SPEC)
    monkeypatch.setattr(M, "DEVICE", "cpu")
    monkeypatch.setattr(M, "time_launches", lambda fns, reps, warmup=1, use_graph=True: (fns[0].us, "graph"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    yield
    TS.default_tune_specs.unregister(FAKE)


def _args(**kw):
    base = dict(quick=False, decode_contexts="100,2000", prefill_contexts=None, reps=3, warmup=1, tol=None,
                check="once", no_graph=False, routes=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_fake_family_is_tuned_through_its_tune_spec_alone(toy, tmp_path, capsys):
    # --families knows the family and its group
    assert parse_families("toys") == (FAKE,) and FAKE in parse_families(None)
    assert parse_families("linear,toys")[1] == FAKE
    case = MatchCase(FAKE, {"phase": "decode", "n": 64}, {"x": (1, 64)}, op="l0.toy", ops=("l0.toy",))
    args = _args()
    plan = tcli.build_plan([case], (1, 2, 4, 16), args)
    # contexts: the decode contexts; candidates: legal, deduplicated, defaults first; prune: no wide below 4
    assert sorted({ctx for _, ctx, _, _ in plan}) == [100, 2000]
    by_t = {t: [(r.name, p) for r, p in c] for _, ctx, t, c in plan if ctx == 100}
    assert by_t[1] == [(f"{FAKE}_rows", {}), (f"{FAKE}_rows", {"BLOCK": 2}), (f"{FAKE}_rows", {"BLOCK": 4})]
    assert [n for n, _ in by_t[4]].count(f"{FAKE}_wide") == 3 and all(n.endswith("_wide") for n, _ in by_t[16])
    # measured through the spec's builder; the family's tolerance keeps BLOCK 4, drops BLOCK 2
    warnings: list[str] = []
    recs = tcli.measure_all([case], plan, args, warnings.append)
    assert recs and all("us" in r for r in recs if r["params"].get("BLOCK") != 2)
    assert all("us" not in r for r in recs if r["params"].get("BLOCK") == 2)
    assert any(w.startswith(f"dropping {FAKE}_rows") for w in warnings)
    assert any(r["params"] == {"BLOCK": 4} and 2e-2 < r["rel_rms"] <= 0.1 for r in recs if "rel_rms" in r)
    # a candidate outside the family's tolerance is dropped under --tol
    strict: list[str] = []
    tcli.measure_all([case], plan, _args(tol=1e-3), strict.append)
    assert any(w.startswith(f"dropping {FAKE}_rows {{'BLOCK': 4}}") for w in strict)
    # picked (contexts summed), and written in the table between linear and embedding
    saved = tmp_path / "toy.json"
    saved.write_text(json.dumps({
        "sm": 90, "source": "test", "command": "ninfer-compile tune --sm 90 --families toys",
        "environment": {"device": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
                        "triton": "3.6.0", "power_w": 700}, "t_points": [1, 2, 4, 16], "warnings": warnings,
        "cases": [dataclasses.asdict(case)], "records": recs}, default=str))
    out = tmp_path / "sm90.yaml"
    assert main(["tune", "--sm", "90", "--replay", str(saved), "-o", str(out)]) == 0, capsys.readouterr().err
    table = load_table(out)
    sel = table.select(FAKE, 2, {"phase": "decode", "n": 64})
    assert sel.route.name == f"{FAKE}_rows" and sel.params == {"BLOCK": 4}
    assert table.select(FAKE, 16, {"phase": "decode", "n": 64}).route.name == f"{FAKE}_wide"
    sections = [line[:-1] for line in out.read_text().splitlines() if line and line[0].isalpha() and
                line.endswith(":")]
    assert sections.index("linear") < sections.index(FAKE) < sections.index("embedding")
    # the provenance note and the report name the fake family as a context family
    assert f"{FAKE} sums its contexts" in table.provenance["notes"]
    assert f"{FAKE} rows sum the contexts measured" in out.with_suffix(".md").read_text()


def test_table_order_comes_from_the_specs(toy):
    assert TS.table_order(["sampling", "zz_undeclared", FAKE, "attention", "linear", "aa_undeclared"]) == \
        ["linear", FAKE, "attention", "sampling", "aa_undeclared", "zz_undeclared"]
    row = [X.Row(1, None, X.Candidate.make(f"{FAKE}_wide"))]
    text = X.render_table(90, {"source": "measured"}, [X.Group("sampling", {}, row), X.Group(FAKE, {}, row),
                                                       X.Group("linear", {}, row)])
    assert text.index("\nlinear:") < text.index(f"\n{FAKE}:") < text.index("\nsampling:")
    assert "l2norm" not in TS.tune_specs()


def test_every_tunable_family_has_a_spec_and_shared_tuner_code_names_none():
    specs = TS.tune_specs()
    assert FAKE not in specs  # the fixture's spec is gone again
    for fam in families():
        if fam in specs:
            s = specs[fam]
            assert s.family == fam and (not s.tunable or callable(s.load_builder()))
    # every route family with a spec, and no spec without routes
    assert set(specs) <= set(families())
    names = set(families()) | set(specs)
    hits = []
    for path in sorted(TUNE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            v = (node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else
                 node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None)
            if v in names:
                hits.append(f"{path.name}:{node.lineno}: {v}")
    assert not hits, hits


def test_bad_specs_are_one_line_errors(toy):
    with pytest.raises(RouteError, match="builder must be 'module:function'"):
        TS.TuneSpec(family="x", order=1, builder="nocolon")
    with pytest.raises(RouteError, match="bad group 'all'"):
        TS.TuneSpec(family="x", order=1, group="all")
    with pytest.raises(RouteError, match="order must be a number"):
        TS.TuneSpec(family="x", order="1")
    with pytest.raises(RouteError, match="not tunable"):
        TS.tune_spec("embedding").load_builder()
    with pytest.raises(RouteError, match="no tune spec for family 'nope'"):
        TS.tune_spec("nope")
    with pytest.raises(RouteError, match="no GPU builder for family embedding"):
        M.build(MatchCase("embedding", {}, {}), 1)
    with pytest.raises(NinferError, match="'embedding' is not a tunable family"):
        parse_families("embedding")


def test_loader_discovers_folders_and_refuses_duplicates(tmp_path, monkeypatch, request):
    PKG = "fake_tune_kernels"
    pkg = tmp_path / PKG
    for folder, body in (("alpha", "TUNE = (TuneSpec(family='alpha_op', order=2, builder='m:f', group='g'),)"),
                         ("beta", "TUNE = (TuneSpec(family='beta_op', order=1, builder='m:f', group='g'),\n"
                                  "        TuneSpec(family='beta_ref', order=0))"),
                         ("gamma", None)):
        (pkg / folder).mkdir(parents=True)
        if body is not None:
            (pkg / folder / "tune.py").write_text("from ninfer_compile.kernels.tuning import TuneSpec\n" + body + "\n")
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def forget():  # never restored: another test's package of the same name must not see these
        for m in [m for m in sys.modules if m.split(".")[0] == PKG]:
            del sys.modules[m]

    def load():
        forget()
        importlib.invalidate_caches()
        return TS.TuneSpecs(PKG).all()

    request.addfinalizer(forget)
    specs = load()
    assert list(specs) == ["alpha_op", "beta_op", "beta_ref"]
    (pkg / "gamma" / "tune.py").write_text("from ninfer_compile.kernels.tuning import TuneSpec\n"
                                           "TUNE = (TuneSpec(family='alpha_op', order=3),)\n")
    with pytest.raises(RouteError, match="alpha_op is declared twice"):
        load()
    (pkg / "gamma" / "tune.py").write_text("TUNE = ('not a spec',)\n")
    with pytest.raises(RouteError, match="TUNE holds a str"):
        load()
    (pkg / "gamma" / "tune.py").write_text("raise ValueError('boom')\n")
    with pytest.raises(RouteError, match="importing fake_tune_kernels.gamma.tune failed: ValueError: boom"):
        load()


def test_loading_every_tune_spec_imports_no_triton():
    code = ("import sys; from ninfer_compile.kernels.tuning import tune_specs, family_groups; "
            "s = tune_specs(); g = family_groups(); print(len(s) > 10, 'triton' in sys.modules, sorted(g))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["True", "False"], out.stdout
    assert "gdn" in out.stdout and "norms" in out.stdout and "kv_cache" in out.stdout
