"""The L2 weight prefetch (kernels/l2_prefetch/) compiles to sm_90 binaries, as its own kernel and
folded into rmsnorm (FOLD): Triton lowers it and ptxas accepts its `cp.async.bulk.prefetch.L2` (the
only check of the instruction short of a GPU), and the binaries are bound to the plan's launches. Compiled in a child (the suite runs Triton
interpreted) over a copy of the `aot` fixture's binary cache, so only the new kernel is built."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import triton

from passes.test_plan_l2_prefetch import prefetch_table

from .aot_support import aot_env, compile_child


def test_prefetch_kernel_has_an_sm90_binary(aot, tmp_path):
    cache = tmp_path / "bincache"
    shutil.copytree(aot["cache"], cache)
    plan = tmp_path / "pf.plan"
    p = compile_child(aot["artifact"], plan, aot_env(tmp_path / "user-cache"), "--cache-dir", str(cache),
                      "--routes", str(prefetch_table(tmp_path, fold=True)))
    assert p.returncode == 0, p.stderr[-3000:]
    man = json.loads((plan / "kernels" / "bin" / "manifest.json").read_text())
    assert man["failed"] == [] and man["unbound"] == []
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

    def sass(e):
        cubin = plan / "kernels" / "bin" / e["dir"] / f"{e['name']}.cubin"
        return subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, timeout=60).stdout

    own = [e for e in man["entries"] if e["kernel"].endswith("l2_prefetch_kernel")]
    assert own and all("BLKPF" in sass(e) for e in own)  # the bulk L2 prefetch, as ptxas assembled it
    # rmsnorm with PREFETCH (the folded sites) and without (layer 0's input norm, the q/k head norms)
    norms = [("BLKPF" in sass(e)) for e in man["entries"] if e["kernel"].endswith("rmsnorm_rows_kernel")]
    assert True in norms and False in norms, norms
    plan_json = json.loads((plan / "plan.json").read_text())
    kinds = [(l["kind"], "prefetch" in l["args"]) for e in plan_json["extents"].values() for l in e["launches"]]
    assert ("l2_prefetch", False) in kinds and ("rmsnorm", True) in kinds
