"""Test-wide setup.

Without a GPU every Triton kernel runs under the interpreter: TRITON_INTERPRET must be set before
any kernel module is imported (triton.jit reads it at decoration time), so it is set here.
Tests marked `gpu` need CUDA and are skipped on CPU-only machines (CI); they run on the GPU machine.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
