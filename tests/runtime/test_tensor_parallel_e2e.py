"""--tp 2 and --tp 4 plans (draft window K = 2, the MTP head) of a TP-friendly tiny transformers
model (bf16 recipe) run as 2 / 4 gloo rank processes on the CPU's torch path: rank 0's greedy tokens,
plain and speculative (MTP drafts, verify rounds), are transformers' argmax (near-tie rule: the
all-reduce changes the summation order), every rank uploads only its section's weights, every rank
runs exactly the all-reduces the plan lists for the extents rank 0 ran, and a prefix-cache snapshot
rank 0 takes, spills to the host and restores is every rank's."""

from __future__ import annotations

import inspect
import json
import math
import os
from pathlib import Path

import pytest

from . import support as S

N_NEW = 6
# every head count, the intermediate rows and the vocabulary divide by 4 (KV heads replicated at 4)
TP_OVERRIDES = dict(num_attention_heads=8, num_key_value_heads=2, linear_num_key_heads=4, linear_num_value_heads=8,
                    tie_word_embeddings=False)


def _torch_path() -> bool:
    import ninfer_runtime as nr

    return "kernels" in inspect.signature(nr.load).parameters


pytestmark = pytest.mark.skipif(not _torch_path() and not os.environ.get("NINFER_TP_E2E_INTERPRET"),
                                reason="needs the torch CPU path (under the Triton interpreter a run takes minutes; "
                                       "NINFER_TP_E2E_INTERPRET=1 runs it anyway)")


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory):
    import torch
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("tp")
    model = S._tiny.make_hf_model(0, **TP_OVERRIDES)
    (d / "hf").mkdir()
    model.save_pretrained(d / "hf", safe_serialization=True)
    sd = load_file(str(d / "hf" / "model.safetensors"))  # + the random MTP head (tests/reference/hf_tiny.py)
    sd.update({k: v.to(torch.bfloat16) for k, v in S._tiny.random_hf_mtp(model.config).items()})
    save_file(sd, str(d / "hf" / "model.safetensors"), metadata={"format": "pt"})
    art = S.pack(d / "hf", d / "tp-bf16.ninfer", "bf16")
    return d, model, art


def _rank(rank: int, world: int, init: str, plan: str, art: str, out: str) -> None:
    import torch.distributed as dist

    import ninfer_runtime as nr
    from ninfer_runtime import tensor_parallel as tp

    tp.init_ranks(rank, world, init, backend="gloo")
    eng = nr.load(plan, art, progress=False)
    calls, runs, gathered = [0], [], []
    real = dist.all_reduce
    real_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def counting(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    def gathering(out, x, *a, **k):  # the bytes every all_gather hands this rank
        gathered.append(out.numel() * out.element_size())
        return real_gather(out, x, *a, **k)

    dist.all_reduce = counting
    dist.all_gather_single = dist.all_gather_into_tensor = gathering
    if rank == 0:
        real_run = eng.lockstep.run

        def record(runner, n, graph=False):
            runs.append(runner.name)
            real_run(runner, n, graph)

        eng.lockstep.run = record
        restored_same = _snapshot_round_trip(eng)
        plain = eng.generate(S.PROMPT, N_NEW, ignore_eos=True, spec="none").tokens  # greedy twins
        rows = eng.generate(S.PROMPT, N_NEW, ignore_eos=True, spec="none", return_logits=True).tokens  # gathers
        eng.generate(S.PROMPT, 3, ignore_eos=True, spec="none", temperature=0.8, seed=1)  # sampled: gathers
        spec = eng.generate(S.PROMPT, N_NEW, ignore_eos=True, spec="mtp")
        assert spec.finish_reason == "length" and eng.last_stats["spec"]["rounds"] >= 1
        tokens = [plain, rows, spec.tokens]
    else:
        tp.follow(eng)
        tokens = restored_same = None
    Path(f"{out}.{rank}").write_text(json.dumps({"tokens": tokens, "restored_same": restored_same,
                                                 "all_reduce": calls[0], "runs": runs, "gathered": gathered,
                                                 "weight_bytes": eng.weight_bytes}))
    eng.close()
    tp.shutdown()


def _snapshot_round_trip(eng) -> bool:
    """Rank 0 snapshots slot 0 after the prompt (every rank its shards), spills it to the host, dirties
    the slot with another prompt, restores the snapshot: the next decode step's logits are the ones
    it gave straight after the prompt (so every rank restored its part, not only rank 0)."""
    import torch

    from ninfer_runtime.steps import Stepper

    a = Stepper(eng, spec="none", use_graphs=False, keep_logits=True)  # the logits rows: the gather extent
    row, first = a.admit(0, S.PROMPT, None)
    snap = a.spill_snapshot(a.snapshot(0, len(S.PROMPT), row))
    col = [(first, len(S.PROMPT), 0)]
    want = a.step(col, set(), [None])[0].rows[0]
    a.admit(0, S.PROMPT[::-1], None)
    a.restore(0, snap)
    got = a.step(col, set(), [None])[0].rows[0]
    a.drop_snapshot(snap)
    return bool(torch.equal(got, want))


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_plan_greedy_matches_transformers(tp_model, tp, tmp_path):
    from ninfer_runtime.tensor_parallel import launch_ranks

    d, model, art = tp_model
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    opts = LowerOptions(prefill_chunk=8, concurrency=(1,), max_context=32, draft_tokens=2, mtp=True)
    c = compile_artifact(art, 90, opts=opts, tp=tp, binaries=False)
    plan = write_plan(tmp_path / "plan", c.manifest, c.memory_txt, extra_files=c.kernel_files)
    out = tmp_path / "rank"
    launch_ranks(_rank, tp, (str(plan), str(art), str(out)), start_method="forkserver")
    res = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(tp)]
    assert res[0]["restored_same"]
    assert res[0]["tokens"][0] == res[0]["tokens"][1]  # the distributed argmax = argmax of the gathered rows
    for tokens in res[0]["tokens"]:  # plain (greedy twins), plain with logits rows (gathers), speculative
        bad = S.check_tokens_against(lambda t: S.hf_logits(model, t), S.PROMPT, tokens)
        assert len(tokens) == N_NEW and not bad, "\n".join(bad)
    p = json.loads((plan / "plan.json").read_text())
    sections = p["tensor_parallel"]["ranks"]
    per_extent = {n: sum(L["kind"] == "all_reduce" for L in x["launches"]) for n, x in sections[0]["extents"].items()}
    want = sum(per_extent[n] for n in res[0]["runs"])
    assert want > 0 and all(x["all_reduce"] == want for x in res), ([x["all_reduce"] for x in res], want)
    for r, x in enumerate(res):  # each rank uploaded its section's weights, not the model's
        assert x["weight_bytes"] == sections[r]["memory"]["weights_bytes"]
    # every rank's all_gathers are the plan's for the extents rank 0 ran: the whole logits rows
    # (R x V bf16) in a gather extent, 2 float32 per row and rank in a greedy twin
    def shape(x, ref):
        return x["tensors"][ref["buffer"]]["shape"]

    per_run = {n: [2 * math.prod(shape(x, L["outs"]["out"])) if L["kind"] == "all_gather"
                   else 2 * 4 * tp * shape(x, L["args"]["x"])[0]
                   for L in x["launches"] if L["kind"] in ("all_gather", "all_argmax")]
               for n, x in sections[0]["extents"].items()}
    V = shape(sections[0]["extents"]["decode_c1_k0"], {"buffer": "logits"})[1]
    assert per_run["decode_c1_k0_argmax"] == [8 * tp] and per_run["decode_c1_k0"] == [2 * V]
    want = [b for n in res[0]["runs"] for b in per_run[n]]
    assert all(x["gathered"] == want for x in res), ([x["gathered"] for x in res], want)
    twin_steps = res[0]["runs"].count("decode_c1_k0_argmax")
    # only the plain greedy run took the twin; the logits rows, the sampled rows, the rounds gathered
    assert twin_steps == N_NEW - 1 and res[0]["runs"].count("decode_c1_k0") >= N_NEW - 1 + 2


@pytest.fixture(scope="module")
def trained_plans(tiny_trained_bf16, tmp_path_factory):
    """The trained tiny model's --tp 1 and --tp 2 plans, a prompt whose one-device greedy continuation
    has no near-tie (the reference's top two logits further apart than 2% of the spread: the --tp 2
    tokens must then be the same tokens), and those tokens."""
    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    art, d = tiny_trained_bf16, tmp_path_factory.mktemp("tp_trained")
    opts = LowerOptions(prefill_chunk=16, concurrency=(1,), max_context=64)
    plans = {}
    for tp in (1, 2):
        c = compile_artifact(art, 90, opts=opts, tp=tp, binaries=False)
        plans[tp] = write_plan(d / f"tp{tp}", c.manifest, c.memory_txt, extra_files=c.kernel_files)
    ref = S.reference_logits_fn(art)
    eng = nr.load(plans[1], art, progress=False)
    try:
        for text in ("Once upon a time", "The cat sat", "Hello", "In the beginning", "def main"):
            prompt = eng.frontend.encode(text)
            tokens = eng.generate(prompt, N_NEW, ignore_eos=True, spec="none").tokens
            rows = ref(prompt + tokens[:-1])[len(prompt) - 1:]
            top2 = rows.topk(2, dim=-1).values
            if bool(((top2[:, 0] - top2[:, 1]) > 0.02 * (rows.max(-1).values - rows.min(-1).values)).all()):
                break
        else:
            pytest.fail("every candidate prompt has a near-tie")
        return art, plans, prompt, tokens, eng.frontend.decode(tokens)
    finally:
        eng.close()


def _ninfer_run(plan, art, prompt, *extra):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "ninfer_runtime", str(plan), "--artifact", str(art), "--tokens",
                             ",".join(map(str, prompt)), "--ignore-eos", "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ninfer_run_over_two_ranks(trained_plans):
    """ninfer-run with the --tp 2 plan starts its 2 ranks: the one-device greedy tokens."""
    art, plans, prompt, tokens, _ = trained_plans
    p = _ninfer_run(plans[2], art, prompt, "--max-new-tokens", str(N_NEW))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert f"tokens: {' '.join(map(str, tokens))}" in out, (out, err)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the rank processes through /proc")
@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_ends_ninfer_run_with_one_line(trained_plans, victim):
    """SIGKILL one rank of a running ninfer-run: the run ends, every rank with it, and stderr is one
    line naming the killed rank (not the other rank's broken collective)."""
    import os
    import signal
    import time

    art, plans, prompt, _, _ = trained_plans
    p = _ninfer_run(plans[2], art, prompt, "--max-new-tokens", "40")
    try:
        deadline = time.monotonic() + 60
        while True:
            ranks = [k for k in _children(p.pid) if "spawn_main" in Path(f"/proc/{k}/cmdline").read_text()]
            if len(ranks) == 2 or p.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(ranks) == 2, p.communicate()
        time.sleep(1.0)  # the ranks are inside init / load / their first collectives
        os.kill(ranks[victim], signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: tensor parallel: rank {victim} (pid {ranks[victim]}) was killed by SIGKILL")
    assert not any(Path(f"/proc/{k}").exists() and Path(f"/proc/{k}/stat").read_text().split()[2] != "Z"
                   for k in ranks)


def test_trained_tiny_served_over_two_ranks(trained_plans):
    """ninfer-serve with a --tp 2 plan of the trained tiny model (it starts the 2 ranks itself): the
    openai client's greedy completion is the one-device plan's text, again when the prompt comes back
    from the prefix cache (every rank restores its shards of the snapshot); SIGTERM drains and ends
    every rank."""
    import signal
    import subprocess
    import sys
    import time

    import httpx
    import openai

    from ninfer_runtime.serve.server import free_port

    art, plans, prompt, _, want = trained_plans
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "ninfer_runtime.serve", str(plans[2]), "--artifact", str(art),
                          "--port", str(port), "--model-name", "tiny"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "ninfer-serve did not listen"
            time.sleep(0.25)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        for i in range(2):  # the second: rank 0's prefix cache restores the prompt on every rank
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=N_NEW, temperature=0)
            assert got.choices[0].text == want and got.usage.completion_tokens == N_NEW, i
        cache = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["prefix_cache"]
        assert cache["hits"] >= 1 and cache["hit_tokens"] >= len(prompt), cache
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        err = p.stderr.read()
        assert "Traceback" not in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
