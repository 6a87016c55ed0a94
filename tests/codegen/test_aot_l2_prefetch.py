"""The L2 weight prefetch (kernels/l2_prefetch/) compiles to an sm_90 binary: Triton lowers it and
ptxas accepts its `cp.async.bulk.prefetch.L2` (the only check of the instruction short of a GPU),
and the binary is bound to the plan's prefetch launches. Compiled in a child (the suite runs Triton
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
                      "--routes", str(prefetch_table(tmp_path)))
    assert p.returncode == 0, p.stderr[-3000:]
    man = json.loads((plan / "kernels" / "bin" / "manifest.json").read_text())
    assert man["failed"] == [] and man["unbound"] == []
    entries = [e for e in man["entries"] if e["kernel"].endswith("l2_prefetch_kernel")]
    assert entries, sorted({e["kernel"] for e in man["entries"]})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for e in entries:
        cubin = plan / "kernels" / "bin" / e["dir"] / f"{e['name']}.cubin"
        sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, timeout=60).stdout
        assert "BLKPF" in sass, sass[-2000:]  # the bulk L2 prefetch, as ptxas assembled it
    plan_json = json.loads((plan / "plan.json").read_text())
    n = sum(l["kind"] == "l2_prefetch" for e in plan_json["extents"].values() for l in e["launches"])
    assert n > 0
