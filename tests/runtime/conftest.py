"""Shared fixture: one tiny bf16 plan (HF tiny model -> pack -> compile --sm 90, C = 1, chunk 8),
built once per test session and reused read-only by the CLI, integrity and fuzz tests (copy it
before editing)."""

from __future__ import annotations

import pytest

from . import support as S


@pytest.fixture(scope="session")
def tiny_plan(tmp_path_factory):
    """(artifact, plan directory); treat both as read-only."""
    d = tmp_path_factory.mktemp("tiny_plan")
    S.make_hf_checkpoint(d / "hf")
    table = S.interp_table(d / "interp90.yaml")
    art = S.pack(d / "hf", d / "tiny-bf16.ninfer", "bf16")
    plan = S.compile_plan(art, d / "tiny-bf16.sm90.plan", table=table, concurrency=(1,))
    return art, plan
