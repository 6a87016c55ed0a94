"""Helpers of the binary tests (conftest.py's `aot` fixture, test_aot.py, test_binary_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SM = 90
CHUNK = 16
COMPILE_ARGS = ["--prefill-chunk", str(CHUNK), "--concurrency", "1", "--max-context", "64"]


def aot_env(tmp: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp)  # a private "user cache": must stay free of kernels
    env["XDG_CACHE_HOME"] = str(tmp / "xdg")  # the default binary cache: private too
    env["NINFER_AOT_JOBS"] = "2"
    env["NINFER_AOT_STRICT"] = "1"
    env.update(extra)
    return env


def compile_child(art: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """`ninfer-compile` in a child without TRITON_INTERPRET (it can build binaries)."""
    return subprocess.run([sys.executable, "-m", "ninfer_compile.cli", "compile", str(art), "--sm", str(SM),
                           "-o", str(out), *COMPILE_ARGS, *extra], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=900)
