"""bench/bench_kv.py --dry: the GPU benchmark's code paths (fill by kv_append, decode, prefill per
format, the float64-oracle error at the 27B head shape) at tiny shapes under the interpreter."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import bench_kv  # noqa: E402

from ninfer_compile.kernels.kv_cache import formats as F  # noqa: E402


def test_dry_run(tmp_path):
    assert bench_kv.main(["--dry", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "kv_dry.json").read_text())
    assert [r["kv"] for r in res["decode"]] == list(F.KV_DTYPES)
    assert all(r["finite"] and r["prefill_finite"] for r in res["decode"])
    err = res["oracle"]["64"]
    assert set(err) == set(F.KV_DTYPES)
    assert err["bf16"]["format"] < 1e-12 and err["bf16"]["kernel"] < 2e-2
    for name, e in err.items():
        assert e["kernel"] < e["format"] + 2e-2, name  # the kernel adds at most bf16 rounding


def test_markdown_renders_every_section():
    res = {"env": {"gpu": "G", "date": "d"}, "append": [{"T": 1, "kv": "bf16", "ours_us": 2.0}],
           "decode": [{"ctx": 4096, "C": 1, "kv": "bf16", "ours_us": 10.0, "best_config": "s512", "kv_bytes": 1},
                      {"ctx": 4096, "C": 1, "kv": "nvfp4", "ours_us": 9.0, "best_config": "s512", "kv_bytes": 1}],
           "prefill": [{"T": 1024, "depth": 0, "kv": "bf16", "ours_us": 100.0, "best_config": "m64"}],
           "oracle": {"4096": {"nvfp4": {"format": 0.05, "kernel": 0.051}}}}
    md = bench_kv.markdown(res)
    assert "| 4096 | 1 | nvfp4 | 9.0 | -10.0% | s512 | 1 |" in md
    assert "| 4096 | nvfp4 | 5.00e-02 | 5.10e-02 |" in md
