"""The sparse-MoE qwen3.6-35b-a3b has a contract (check passes) but no router / expert kernel
families yet: compiling it stops with one line naming what is missing, never a traceback."""

from __future__ import annotations

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact


@pytest.mark.parametrize("model_id", ["qwen3.6-35b-a3b", "tiny-moe"])
def test_moe_compile_names_the_missing_family(model_id, tmp_path_factory, tmp_path, capsys):
    art = tiny_artifact(tmp_path_factory.mktemp(model_id) / f"{model_id}.ninfer", model_id, sparse=True)
    assert main(["check", str(art)]) == 0
    capsys.readouterr()
    out = tmp_path / "moe.plan"
    assert main([str(art), "--sm", "90", "-o", str(out), "--no-binaries"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "op moe_experts" in err[0] and "no kernel family 'moe'" in err[0] and "qwen3_5_moe" in err[0]
    assert not out.exists()
