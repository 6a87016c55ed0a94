"""Shared fixtures of the tuner tests: the 27B contract's match set, derived once per process.

The CLI's default derivation (all seven KV formats, draft windows K = 1..5) lowers ~100 graphs of
the 64-layer model; the tests derive a representative subset (three KV formats: plain, int8,
packed 4-bit; windows K = 1 and 3) and test_tune_new.py checks the defaults themselves."""

from __future__ import annotations

import pytest

KV_SUBSET = ("bf16", "int8", "nvfp4")
DRAFT_SUBSET = (1, 3)


@pytest.fixture(scope="session")
def cases27b():
    from ninfer_compile.tune.shapes import derive_match_set, load_model

    spec, objects, _ = load_model()  # graphs/qwen3.6-27b.yaml, dims only
    return derive_match_set(spec, objects, kv_dtypes=KV_SUBSET, draft_tokens=DRAFT_SUBSET)
