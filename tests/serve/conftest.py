"""The trained tiny model (examples/tiny-trained/) packed bf16 and compiled once per test session
for the serve tests: 3 slots (decode extents C = 1 and 3), prefill chunk 16, max context 64; and
with a draft window (K = 2, MTP extents, one slot) for the speculative ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

SLOTS = 3
MAX_CONTEXT = 64
CHUNK = 16
SPEC_K = 2


@pytest.fixture(scope="session")
def tiny_served_plan(tmp_path_factory, tiny_trained_bf16):
    """(artifact, plan directory) of the trained tiny model; read-only (the artifact is the
    session's tests/conftest.py tiny_trained_bf16, shared with test_serve_spec)."""
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan
    from runtime import support as RS

    d = tmp_path_factory.mktemp("serve_tiny")
    art = tiny_trained_bf16
    table = RS.interp_table(d / "interp90.yaml")
    kw = dict(prefill_chunk=CHUNK, concurrency=(1, SLOTS), max_context=MAX_CONTEXT, mtp=False)
    c = compile_artifact(art, 90, routes=table, opts=LowerOptions(**kw), binaries=False)
    plan = d / "tiny-trained-bf16.sm90.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return art, plan


@pytest.fixture(scope="session")
def tiny_spec_plan(tmp_path_factory, tiny_trained_bf16):
    """(artifact, plan directory): the trained tiny model (it has the MTP head) compiled with
    --draft-tokens 2, one slot (C = 1: the fewest extents to warm under the interpreter), chunk 16,
    context 64; read-only."""
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan
    from runtime import support as RS

    d = tmp_path_factory.mktemp("serve_spec_tiny")
    art = tiny_trained_bf16
    opts = LowerOptions(prefill_chunk=CHUNK, concurrency=(1,), max_context=MAX_CONTEXT, draft_tokens=SPEC_K)
    c = compile_artifact(art, 90, routes=RS.interp_table(d / "interp90.yaml"), opts=opts, binaries=False)
    plan = d / "tiny-trained-k2.sm90.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return art, plan
