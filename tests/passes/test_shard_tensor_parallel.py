"""shard_tensor_parallel: rank r's graph holds 1/N of every sharded weight and activation, an
all_reduce after every row-parallel projection and after the vocabulary-parallel embedding, and an
all_gather after the vocabulary-parallel head (a greedy decode twin: the head's rank columns into
all_argmax instead); over N gloo ranks (processes on 127.0.0.1) the ranks' IR executors give the
one-device logits, and the twin's ids are the argmax of the gathered rows."""

from __future__ import annotations

import math
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from ninfer_compile.errors import CompileError
from ninfer_compile.ir.lower import LowerOptions, lower, plan_extents
from ninfer_compile.passes.context import PassContext
from ninfer_compile.passes.pipeline import PIPELINE, run_pipeline

SHARD = [(n, f) for n, f in PIPELINE if n in ("bind_weights", "shard_tensor_parallel")]
OPTS = LowerOptions(prefill_chunk=6, max_context=16, draft_tokens=2, mtp=True, concurrency=(2,))
TOKENS = [5, 17, 3, 99, 200, 7]


def _open(model_id: str, path: Path):
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.contracts import check_artifact, find_contract
    from ninfer_compile.convert.synthetic import pack_synthetic

    if not path.exists():
        pack_synthetic(model_id, path, progress=False)
    art = Artifact.open(path)
    spec = find_contract(path, art.model_id).resolve_for(art)
    check_artifact(art, spec)
    return art, spec


@pytest.fixture(scope="module")
def tp_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "tiny-tp.ninfer"
    art, spec = _open("tiny-qwen3.5-tp", path)
    yield path, art, spec
    art.close()


def _rank_graphs(spec, objects, tp, rank, pipeline=SHARD, opts=OPTS):
    ctx = PassContext(spec=spec, objects=objects, options={"tp": tp, "rank": rank})
    return {e.name: run_pipeline(lower(spec, e, opts), ctx, pipeline=pipeline) for e in plan_extents(spec, opts)}


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_holds_one_nth_of_every_sharded_weight(tp_tiny, tp):
    _, art, spec = tp_tiny
    full = _rank_graphs(spec, art.by_name, 1, 0)
    seen_cols = {}
    for r in range(tp):
        gs = _rank_graphs(spec, art.by_name, tp, r)
        for name, g in gs.items():
            f = full[name]
            sharded = [t for t in g.tensors.values() if t.role == "weight" and t.shard is not None]
            assert sharded
            for t in sharded:
                whole = f.tensors[t.name]
                kv = "/attention/" in t.object and ("[key]" in t.name or "[value]" in t.name)
                if kv and tp > spec.dims["kv_heads"]:  # replicated: one KV head per rank
                    assert t.shape[0] == spec.dims["head_dim"], t.name
                else:
                    assert math.prod(t.shape) * tp == math.prod(whole.shape), (name, t.name, t.shape, whole.shape)
                if t.shard.cols and len(t.shard.cols) == 1:
                    seen_cols.setdefault((name, t.name), []).append(t.shard.cols[0])
            reduces = [o for o in g.ops() if o.kind == "all_reduce"]
            layers = 1 if g.extent.graph == "mtp" else spec.dims["layers"]
            assert len(reduces) == 2 * layers + 1 and all(o.attrs["ranks"] == tp for o in reduces)
            (embed,) = [o for o in g.ops() if o.kind == "embedding"]
            table = g.tensors[embed.inputs["table"]]
            assert table.shard.rows == ((r * table.shape[0], table.shape[0]),)
            assert embed.attrs["vocab_begin"] == r * table.shape[0] and reduces[0].inputs["x"] in embed.outputs.values()
            assert [o.name for o in g.ops() if o.kind == "all_gather"] == ["lm_head.all_gather"]
            assert g.tensors["logits"].shape == f.tensors["logits"].shape
            kv = [t for t in g.tensors.values() if t.role == "state" and t.name.endswith("k_cache")]
            assert all(t.shape[2] == max(1, spec.dims["kv_heads"] // tp) for t in kv)
    # the ranks' K slices tile K exactly once
    for key, cols in seen_cols.items():
        cols.sort()
        assert len(cols) == tp and all(a[0] + a[1] == b[0] for a, b in zip(cols, cols[1:])), key


@pytest.mark.parametrize("tp", [2, 4])
def test_a_greedy_twin_feeds_the_rank_columns_to_all_argmax(tp_tiny, tp):
    _, art, spec = tp_tiny
    opts = replace(OPTS, argmax_decode=True)
    (twin,) = [e for e in plan_extents(spec, opts) if e.head == "argmax"]
    V = spec.dims["vocab_rows"]
    for r in range(tp):
        ctx = PassContext(spec=spec, objects=art.by_name, options={"tp": tp, "rank": r})
        g = run_pipeline(lower(spec, twin, opts), ctx, pipeline=SHARD)
        assert not [o for o in g.ops() if o.kind in ("all_gather", "sampling")]
        (pick,) = [o for o in g.ops() if o.kind == "all_argmax"]
        assert pick.attrs["ranks"] == tp and pick.attrs["vocab_begin"] == r * V // tp
        assert g.tensors[pick.inputs["x"]].shape == (twin.t, V // tp) and g.tensors[pick.outputs["ids"]].role == "output"


def test_refusals_are_one_line(tmp_path):
    art, spec = _open("tiny-qwen3.5-mtp", tmp_path / "mtp.ninfer")
    with art:
        e = plan_extents(spec, OPTS)[0]
        for tp, want in ((4, "4 does not divide the 2 GDN key heads of tiny-qwen3.5-mtp"), (2, "scale groups"), (3, "--tp must be one of")):
            ctx = PassContext(spec=spec, objects=art.by_name, options={"tp": tp, "rank": 0})
            with pytest.raises(CompileError, match=want) as ei:
                run_pipeline(lower(spec, e, OPTS), ctx, pipeline=SHARD)
            assert "\n" not in str(ei.value)


# ------------------------------------------------------------------------------ N gloo ranks


def _mp_context():
    """forkserver: a clean server process (not the test process, whose threads may hold locks a fork
    would copy) that imports torch and the compiler once; each rank is a fork of it."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "ninfer_compile.ir.execute"])
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_run(rank: int, tp: int, port: int, path: str, q) -> None:
    import datetime

    import torch.distributed as dist

    from ninfer_compile.ir.execute import ExecState, Executor, step_inputs
    from ninfer_compile.reference.weights import ArtifactWeights

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp,
                            timeout=datetime.timedelta(seconds=60))
    try:
        art, spec = _open("tiny-qwen3.5-tp", Path(path))
        with art:
            weights = ArtifactWeights(art)
            full_pipe = [(n, f) for n, f in PIPELINE if n in ("bind_weights", "shard_tensor_parallel", "fuse")]
            gs = _rank_graphs(spec, art.by_name, tp, rank, full_pipe, replace(OPTS, argmax_decode=True))
            pre = gs["prefill_t6"]
            ex = Executor(weights)
            dec_out = {}
            for name in ("decode_c2_k0", "decode_c2_k0_argmax"):  # from the same state: the rows, the twin
                st = ExecState.zeros(list(gs.values()))
                out = ex.run(pre, step_inputs(pre, TOKENS), st)
                nxt = int(out["ids"][0])
                dec_out[name] = ex.run(gs[name], step_inputs(gs[name], [nxt, nxt], start=len(TOKENS), slot=0,
                                                              slots=torch.tensor([0, 1], dtype=torch.int32),
                                                              positions=torch.tensor([len(TOKENS), 0], dtype=torch.int32)),
                                       st)
            d = dec_out["decode_c2_k0"]
            twin_same = torch.equal(dec_out["decode_c2_k0_argmax"]["ids"].long(), torch.argmax(d["logits"], dim=1))
            res = (rank, out["logits"], d["logits"], twin_same)
            if rank == 0:  # the one-device graphs, same inputs
                one = _rank_graphs(spec, art.by_name, 1, 0, full_pipe)
                st1 = ExecState.zeros(list(one.values()))
                o1 = ex.run(one["prefill_t6"], step_inputs(one["prefill_t6"], TOKENS), st1)
                d1 = ex.run(one["decode_c2_k0"], step_inputs(one["decode_c2_k0"], [nxt, nxt], start=len(TOKENS),
                                                             slots=torch.tensor([0, 1], dtype=torch.int32),
                                                             positions=torch.tensor([len(TOKENS), 0], dtype=torch.int32)),
                            st1)
                res = (*res, o1["logits"], d1["logits"])  # [4], [5]
            q.put(tuple(x.numpy() if torch.is_tensor(x) else x for x in res))  # by value, not shared memory
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_give_the_one_device_logits(tp_tiny, tp):
    path = str(tp_tiny[0])
    ctx = _mp_context()
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_run, args=(r, tp, port, path, q)) for r in range(tp)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in range(600):
            while not q.empty() and len(got) < tp:
                got.append(q.get())
            if len(got) == tp or any(p.exitcode not in (None, 0) for p in procs):
                break
            procs[0].join(timeout=0.25)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert len(got) == tp, [p.exitcode for p in procs]
    got.sort(key=lambda x: x[0])
    want_pre, want_dec = torch.from_numpy(got[0][4]), torch.from_numpy(got[0][5])
    assert want_pre.abs().max() > 0.1  # a real model's logits, not zeros
    for g in got:
        torch.testing.assert_close(torch.from_numpy(g[1]), want_pre, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.from_numpy(g[2]), want_dec, rtol=1e-4, atol=1e-4)
        assert g[3], f"rank {g[0]}: the greedy twin's ids are not the argmax of the gathered rows"
