"""Fixtures for route-table tests: an isolated registry with fake routes, and a table writer."""

from __future__ import annotations

import textwrap

import pytest

from ninfer_compile.kernels.registry import ParamSpec, Registry, Route, RouteDomain

REF = "ninfer_compile.kernels.registry:load_callable"  # any importable "module:function"


def make_registry() -> Registry:
    reg = Registry()
    q4 = ("Q4G64_F16S",)
    reg.register(Route("f_gemv", "linear", RouteDomain(formats=q4 + ("Q5G64_F16S",), max_t=4,
                                                      epilogues=("none", "residual"), k_multiple=64),
                       {"BLOCK_N": ParamSpec("BLOCK_N", (32, 64, 128), 64),
                        "SPLIT_K": ParamSpec("SPLIT_K", (1, 2, 4), 1)}, REF))
    reg.register(Route("f_small", "linear", RouteDomain(formats=q4, max_t=32,
                                                       epilogues=("none", "swiglu", "residual")),
                       {"BLOCK_T": ParamSpec("BLOCK_T", (16, 32), 16)}, REF))
    reg.register(Route("f_wide", "linear", RouteDomain(formats=q4 + ("Q5G64_F16S",),
                                                      epilogues=("none", "swiglu", "residual")),
                       {}, REF))
    reg.register(Route("f_rms", "rmsnorm", RouteDomain(), {"BLOCK": ParamSpec("BLOCK", (256, 512), 512)}, REF))
    reg.register(Route("f_attn_dec", "attention",
                       RouteDomain(max_t=8, extra={"phase": ("decode",), "kv_dtype": ("bf16", "int8")}),
                       {}, REF))
    reg.register(Route("f_attn_pre", "attention",
                       RouteDomain(extra={"phase": ("prefill", "decode"), "kv_dtype": ("bf16", "int8")}), {}, REF))
    return reg


@pytest.fixture
def reg() -> Registry:
    return make_registry()


HEADER = """\
sm: 90
provenance: {source: unmeasured, reason: "test table"}
miss: %s
"""

GOOD_BODY = """\
linear:
  - match: {format: Q4G64_F16S}
    routes:
      - {t: [1, 4], route: f_gemv, params: {BLOCK_N: 128}}
      - {t: [5, 32], route: f_small}
      - {t: [33, max], route: f_wide}
  - match: {format: Q4G64_F16S, epilogue: swiglu}
    routes:
      - {t: [1, 32], route: f_small, params: {BLOCK_T: 32}}
      - {t: [33, max], route: f_wide}
  - match: {format: Q4G64_F16S, n: 5120}
    routes:
      - {t: [1, 2], route: f_gemv, params: {SPLIT_K: 4}}
      - {t: [3, max], route: f_wide, evidence: {3: {f_gemv: 12.5, f_wide: 11.0}}}
  - match: {format: Q5G64_F16S}
    routes:
      - {t: [1, 4], route: f_gemv}
      - {t: [5, max], route: f_wide}
rmsnorm:
  - match: {}
    routes:
      - {t: [1, max], route: f_rms}
attention:
  - match: {phase: decode, kv_dtype: bf16}
    routes:
      - {t: [1, 8], route: f_attn_dec}
      - {t: [9, max], route: f_attn_pre}
  - match: {phase: prefill, kv_dtype: bf16}
    routes:
      - {t: [1, max], route: f_attn_pre}
"""


@pytest.fixture
def write(tmp_path):
    """write(body, miss="error", name="sm90.yaml", header=True) -> path"""

    def _write(body: str, miss: str = "error", name: str = "sm90.yaml", header: bool = True):
        text = (HEADER % miss if header else "") + textwrap.dedent(body)
        p = tmp_path / name
        p.write_text(text)
        return p

    return _write
