"""Shared test support for the IR / passes / plan / compile tests.

An isolated route registry covering every family (references = the executor's built-ins, and the
route library's real linear reference), a route table for it, tiny artifacts, and hand-built graphs.
"""

from __future__ import annotations

from pathlib import Path

from ninfer_compile.kernels.registry import ParamSpec, Registry, Route, RouteDomain

FAMILIES = ("embedding", "rmsnorm", "linear", "head_rmsnorm", "rope", "kv_append", "attention", "conv1d",
            "gdn_gating", "gated_delta_rule", "gated_rmsnorm", "sampling")
QFORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16")
EPIS = ("none", "swiglu", "residual")


def _ref(family: str) -> str:
    if family == "linear":
        return "ninfer_compile.kernels.linear.reference:linear"
    return f"ninfer_compile.ir.execute:b_{family}"


def make_registry() -> Registry:
    reg = Registry()
    reg.register(Route("t_gemv", "linear", RouteDomain(formats=QFORMATS, max_t=4, epilogues=EPIS),
                       {"BLOCK_N": ParamSpec("BLOCK_N", (32, 64, 128), 64)}, _ref("linear")))
    reg.register(Route("t_wide", "linear", RouteDomain(formats=QFORMATS, epilogues=EPIS),
                       {"BLOCK_T": ParamSpec("BLOCK_T", (16, 64, 128), 64)}, _ref("linear")))
    for fam in FAMILIES:
        if fam != "linear":
            reg.register(Route(f"t_{fam}", fam, RouteDomain(), {}, _ref(fam)))
    return reg


def table_text(sm: int = 90, miss: str = "error", skip: tuple[str, ...] = ()) -> str:
    lines = [f"sm: {sm}", 'provenance: {source: unmeasured, reason: "compiler test table"}', f"miss: {miss}"]
    for fam in FAMILIES:
        if fam in skip:
            continue
        lines.append(f"{fam}:")
        if fam == "linear":
            for fmt in QFORMATS:
                lines += [f"  - match: {{format: {fmt}}}", "    routes:",
                          "      - {t: [1, 4], route: t_gemv, params: {BLOCK_N: 128}}",
                          "      - {t: [5, max], route: t_wide}"]
            lines += ["  - match: {format: Q4G64_F16S, epilogue: swiglu}", "    routes:",
                      "      - {t: [1, max], route: t_wide, params: {BLOCK_T: 16}}"]
            for fmt in QFORMATS:
                if fmt == "Q4G64_F16S":
                    continue
                lines += [f"  - match: {{format: {fmt}, epilogue: swiglu}}", "    routes:",
                          "      - {t: [1, max], route: t_wide}"]
            for fmt in QFORMATS:
                lines += [f"  - match: {{format: {fmt}, epilogue: residual}}", "    routes:",
                          "      - {t: [1, 4], route: t_gemv}", "      - {t: [5, max], route: t_wide}"]
        else:
            lines += ["  - match: {}", "    routes:", f"      - {{t: [1, max], route: t_{fam}}}"]
    return "\n".join(lines) + "\n"


def write_table(dir_: Path, sm: int = 90, **kw) -> Path:
    p = Path(dir_) / f"sm{sm}.yaml"
    p.write_text(table_text(sm, **kw))
    return p


def load_test_table(dir_: Path, sm: int = 90, **kw):
    from ninfer_compile.routes.table import load_table

    return load_table(write_table(dir_, sm, **kw), make_registry())


def tiny_artifact(path: Path, model_id: str = "tiny-qwen3.5-mtp", sparse: bool = False) -> Path:
    from ninfer_compile.convert.synthetic import pack_synthetic

    if not path.exists():
        pack_synthetic(model_id, path, progress=False, sparse=sparse)
    return path
