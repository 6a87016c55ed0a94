"""Test-wide setup.

Without a GPU every Triton kernel runs under the interpreter: TRITON_INTERPRET must be set before
any kernel module is imported (triton.jit reads it at decoration time), so it is set here.
NINFER_AOT_STRICT=1 makes a failed ahead-of-time binary compile an error (children inherit it).
Tests marked `gpu` need CUDA and are skipped on CPU-only machines (CI); they run on the GPU machine.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# a compile that builds kernel binaries (a child without TRITON_INTERPRET, or any compile on the
# GPU machine) fails the test when they fail, instead of writing a source-only plan (codegen/aot.py)
os.environ.setdefault("NINFER_AOT_STRICT", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
