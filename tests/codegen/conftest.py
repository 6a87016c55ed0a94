"""Shared by the binary tests: one tiny artifact compiled with binaries twice (session scope: the
cold compile of ~80 kernels is the expensive part of these tests on a CPU).

`aot`: the first compile ("a.plan") fills a private binary cache (`bincache`), the second
("b.plan") repeats it and takes everything from that cache; every compile child gets a private
Triton user cache and XDG cache home (never the developer's ~/.cache), NINFER_AOT_STRICT=1 and
two compile workers. Tests that change the binary cache copy it first.
"""

from __future__ import annotations

import pytest

from .aot_support import aot_env, compile_child


@pytest.fixture(autouse=True)
def _private_binary_cache(tmp_path, monkeypatch):
    """In-process compiles never touch the developer's binary cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="session")
def aot(tmp_path_factory):
    from ninfer_compile.convert.synthetic import pack_synthetic

    d = tmp_path_factory.mktemp("aot")
    art = d / "tiny.ninfer"
    pack_synthetic("tiny-qwen3.5", art, progress=False)
    env = aot_env(d / "compile-user-cache")
    out = []
    for name in ("a.plan", "b.plan"):
        p = compile_child(art, d / name, env, "--cache-dir", str(d / "bincache"))
        assert p.returncode == 0, p.stderr[-3000:]
        out.append((d / name, p.stderr))
    return {"dir": d, "artifact": art, "plan": out[0][0], "again": out[1][0], "stderr": out[0][1],
            "stderr_again": out[1][1], "cache": d / "bincache"}


@pytest.fixture(scope="session")
def aot_columns(aot):
    """The `aot` fixture's artifact compiled with --column-specialization (every column count
    specialised, as before the default left the prefill-only kernels' unspecialised; its own binary cache)."""
    d = aot["dir"]
    p = compile_child(aot["artifact"], d / "columns.plan", aot_env(d / "columns-user-cache"), "--cache-dir",
                      str(d / "bincache-columns"), "--column-specialization")
    assert p.returncode == 0, p.stderr[-3000:]
    return {"plan": d / "columns.plan", "stderr": p.stderr}
