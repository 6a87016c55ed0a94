"""Speculative decoding end to end on compiled plans (docs/SPECULATIVE.md): HF tiny model + random MTP
head -> pack -> compile --draft-tokens K -> ninfer_runtime rounds (Triton interpreter on CPU; the
same file runs on the GPU with CUDA graphs).

Every greedy token equals the plain (--spec none) run's from the same plan and the reference's argmax
for its prefix (near-ties excepted); an oracle drafter gives 100% acceptance, an always-wrong one 0%,
both the same output; after a round the slot's GDN / conv / KV / MTP state equals a prefill over the
accepted tokens; sampling is reproducible; the CLI prints the spec line and refuses bad --spec in one
line (exit 2). Plans are compiled once per module (small max context and prefill chunk)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import support as S

PROMPT = S.PROMPT[:9]  # two prefill chunks of 8 (the MTP prefill runs after each)
N_NEW = 5  # the plain truth (plain3): 5 tokens, so a round of K + 1 = 4 after t0 stays inside it
# the speculative runs compared with it (suite time): 4 tokens = the prefill's + 3 rounds when no draft
# is accepted (the random MTP head, the always-wrong drafter), each rolled back; greedy, so each run
# must equal the truth's first N_GEN tokens
N_GEN = 4


def _compile(art, out, table, *, k, concurrency, mtp=True, chunk=8):
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    opts = LowerOptions(prefill_chunk=chunk, concurrency=tuple(concurrency), max_context=40, draft_tokens=k, mtp=mtp)
    c = compile_artifact(Path(art), 90, routes=table, opts=opts)
    write_plan(out, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec_rt")
    model = S.make_hf_mtp_checkpoint(d / "hf")
    table = S.interp_table(d / "interp90.yaml")
    art = S.pack(d / "hf", d / "tiny-mtp.ninfer", "bf16")
    return d, model, table, art


@pytest.fixture(scope="module")
def eng3(tiny):
    """K = 3, C = 1, 2, MTP."""
    import ninfer_runtime as nr

    d, _, table, art = tiny
    plan = _compile(art, d / "k3.plan", table, k=3, concurrency=(1, 2))
    eng = nr.load(plan, art, progress=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def eng1(tiny):
    """K = 1, C = 1, no MTP extents (n-gram / host drafters only)."""
    import ninfer_runtime as nr

    d, _, table, art = tiny
    plan = _compile(art, d / "k1.plan", table, k=1, concurrency=(1,), mtp=False)
    eng = nr.load(plan, art, progress=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def plain3(eng3):
    """The plain (--spec none) greedy outputs of the K = 3 plan, C = 2 (two prompts)."""
    res = eng3.generate([PROMPT, PROMPT[2:]], N_NEW, spec="none", ignore_eos=True, concurrency=2)
    return [r.tokens for r in res]


class Oracle:
    """Proposes `truth`'s continuation; wrong=True: a token that never is it; `bad_at`: the j-th
    draft of every proposal is wrong (so exactly j drafts are accepted)."""

    def __init__(self, prompt, truth, V, wrong=False, bad_at=None):
        self.n0, self.seq, self.truth, self.V, self.wrong, self.bad_at = len(prompt), list(prompt), truth, V, wrong, bad_at

    def extend(self, toks):
        self.seq += list(toks)

    def propose(self, k):
        i = len(self.seq) - self.n0
        d = list(self.truth[i:i + k])
        if self.wrong:
            return [(t + 1) % self.V for t in d]
        if self.bad_at is not None and self.bad_at < len(d):
            d[self.bad_at] = (d[self.bad_at] + 1) % self.V
        return d


def test_plan_extents_bound(eng3, eng1):
    assert eng3.draft_tokens == 3 and eng3.has_mtp_drafts
    assert [r.name for r in eng3.verify_runners] == ["verify_c1_k3", "verify_c2_k3"]
    assert [r.name for r in eng3.decode_runners] == ["decode_c1_k0", "decode_c2_k0"]
    assert eng3.mtp_prefill_runner.name == "mtp_prefill_t8"
    assert [r.name for r in eng3.mtp_verify_runners] == ["mtp_verify_c1_k3", "mtp_verify_c2_k3"]
    assert eng1.draft_tokens == 1 and not eng1.has_mtp_drafts and eng1.mtp_prefill_runner is None


def test_mtp_greedy_equals_plain_and_reference(tiny, eng3, plain3):
    _, model, _, _ = tiny
    res = eng3.generate([PROMPT, PROMPT[2:]], N_GEN, ignore_eos=True, concurrency=2)  # default spec: mtp
    assert [r.tokens for r in res] == [p[:N_GEN] for p in plain3]
    sp = eng3.last_stats["spec"]
    assert sp["mode"] == "mtp" and sp["k"] == 3 and sp["rounds"] >= 1 and sp["proposed"] == 3 * sp["lane_rounds"]
    for p, r in zip([PROMPT, PROMPT[2:]], res):
        bad = S.check_tokens_against(lambda t: S.hf_logits(model, t), p, r.tokens)
        assert not bad, "\n".join(bad)
    r1 = eng3.generate(PROMPT, N_GEN, ignore_eos=True, spec="mtp", concurrency=1)
    assert r1.tokens == plain3[0][:N_GEN]


def test_oracle_and_always_wrong_drafters(eng3, plain3):
    V = eng3.vocab_rows
    truth = plain3[0]
    for wrong in (False, True):
        r = eng3.generate(PROMPT, N_GEN, ignore_eos=True, concurrency=1,
                          spec=lambda p, w=wrong: Oracle(p, truth, V, wrong=w))
        assert r.tokens == truth[:N_GEN]
        sp = eng3.last_stats["spec"]
        assert sp["mode"] == "custom" and sp["proposed"] > 0
        assert sp["accepted"] == (0 if wrong else sp["proposed"])


def test_ngram_k1(eng1):
    plain = eng1.generate(PROMPT, N_GEN, ignore_eos=True, spec="none").tokens
    r = eng1.generate(PROMPT, N_GEN, ignore_eos=True, spec="ngram")
    assert r.tokens == plain and eng1.last_stats["spec"]["mode"] == "ngram"
    truth = plain
    r = eng1.generate(PROMPT, N_GEN, ignore_eos=True, spec=lambda p: Oracle(p, truth, eng1.vocab_rows))
    assert r.tokens == plain
    sp = eng1.last_stats["spec"]
    assert sp["accepted"] == sp["proposed"] > 0
    with pytest.raises(ValueError, match="--spec mtp needs MTP draft extents"):
        eng1.generate(PROMPT, 2, spec="mtp")
    eng1.generate(PROMPT, 2, ignore_eos=True)  # the default without MTP extents: plain steps
    assert "spec" not in eng1.last_stats


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _same_state(eng, n, *, mtp: bool) -> None:
    """Slots 0 and 1: GDN conv / recurrent state, and KV rows [0, n) (MTP KV too when `mtp`), agree."""
    for name, info in eng.plan["buffers"]["state"].items():
        if name.startswith("mtp_") and not mtp:
            continue
        t = eng.state(name)
        x, y = (t[0, :n], t[1, :n]) if info["kind"] == "kv" else (t[0], t[1])
        assert _rel(x.float(), y.float()) < 3e-2, name


def test_state_after_a_round_equals_prefill_of_the_accepted(eng3, plain3):
    """Slot 0: prefill + one round; slot 1: prefill of the prompt + the tokens that round consumed
    (t0 and the accepted drafts). Their GDN conv / recurrent state, KV rows up to the frontier and
    next token agree: with a host drafter that gets exactly 2 of 3 drafts right, and with MTP drafts
    (then the MTP KV rows and the next round's first draft too: slot 0's come from mtp_verify, slot
    1's from mtp_prefill)."""
    from ninfer_runtime.speculative.rounds import Lane, prefill_lane, spec_buffers, spec_round

    eng, truth = eng3, plain3[0]
    for drafter in (Oracle(PROMPT, truth, eng.vocab_rows, bad_at=2), None):
        a = Lane(0, None, drafter)
        prefill_lane(eng, a, PROMPT)
        g = a.last
        stats = {}
        em = spec_round(eng, [a], use_graphs=True, stats=stats)[0]
        assert em == truth[1:1 + len(em)] and len(em) == stats["accepted"] + 1
        if drafter is not None:
            assert stats["accepted"] == 2
        consumed = PROMPT + [g] + em[:-1]  # t0, then the accepted drafts
        b = Lane(1)
        prefill_lane(eng, b, consumed)
        assert (b.last, b.position) == (a.last, a.position) == (em[-1], len(consumed))
        _same_state(eng, len(consumed), mtp=drafter is None)
        if drafter is None:
            bufs = spec_buffers(eng)
            assert int(bufs.draft_ids[0, 0]) == int(bufs.draft_ids[1, 0])


def test_sampling_is_reproducible(eng3):
    kw = dict(ignore_eos=True, temperature=0.9, top_p=0.95, seed=7, concurrency=2)
    # 3 tokens (suite time): the prefill's sampled token, then sampled rounds (one or two: a round
    # emits 1 + its accepted drafts) in each run
    one = [r.tokens for r in eng3.generate([PROMPT, PROMPT], 3, **kw)]
    two = [r.tokens for r in eng3.generate([PROMPT, PROMPT], 3, **kw)]
    assert one == two and len(one[0]) == 3


def _cli(*args):
    env = {"PYTHONPATH": f"{S.REPO}:{S.RUNTIME}", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "ninfer_runtime", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=S.REPO)


def test_cli_spec_line_and_errors(eng3, tiny, tiny_plan):
    d, _, _, art = tiny
    toks = ",".join(map(str, PROMPT))
    p = _cli(d / "k3.plan", "--artifact", art, "--tokens", toks, "--max-new-tokens", "3", "--ignore-eos",
             "--spec", "ngram")
    assert p.returncode == 0, p.stderr
    assert "spec ngram K=3: acceptance " in p.stderr and "tokens/round" in p.stderr and "plain steps)" in p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("tokens: ")
    art0, plan0 = tiny_plan  # K = 0
    for spec in ("mtp", "ngram"):
        p = _cli(plan0, "--artifact", art0, "--tokens", "1,2,3", "--spec", spec, "--quiet")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--draft-tokens" in p.stderr, p.stderr
    p = _cli(plan0, "--artifact", art0, "--tokens", "1,2,3", "--spec", "eagle")
    assert p.returncode == 2 and p.stderr.startswith("error: ") and p.stderr.count("\n") == 1


@pytest.mark.slow
def test_packed_verify_attention_through_the_plan(tiny, plain3):
    """A table whose verify attention rows select attention_verify_packed: the plan binds the op's
    `window` to that launch (and only there), and the rounds still give the plain tokens (MTP drafts
    and a host drafter that gets 2 of 3 right)."""
    import json

    import yaml

    import ninfer_runtime as nr

    d, _, table, art = tiny
    data = yaml.safe_load(Path(table).read_text())
    for g in data["attention"]:
        if g["match"].get("phase") == "verify":
            g["routes"] = [{"t": [1, 128], "route": "attention_verify_packed", "params": {"split_tokens": 256}},
                           {"t": [129, "max"], "unsupported": "verify rounds are at most 72 columns"}]
    packed = d / "packed90.yaml"
    packed.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = _compile(art, d / "k3_packed.plan", packed, k=3, concurrency=(1, 2))
    ext = json.loads((plan / "plan.json").read_text())["extents"]
    for name, x in ext.items():
        att = [L for L in x["launches"] if L["kind"] == "attention"]
        windows = [[b for b in L["bind"] if b["arg"] == "window"] for L in att]
        if "verify" in name:
            assert {L["route"] for L in att} == {"attention_verify_packed"}, name
            assert all(len(w) == 1 and w[0]["scalar"] == 4 for w in windows), (name, windows)
        else:
            assert not any(windows), name
    eng = nr.load(plan, art, progress=False)
    try:
        res = eng.generate([PROMPT, PROMPT[2:]], N_GEN, ignore_eos=True, concurrency=2)
        assert [r.tokens for r in res] == [p[:N_GEN] for p in plain3]
        r = eng.generate(PROMPT, N_GEN, ignore_eos=True, concurrency=1,
                         spec=lambda p: Oracle(p, plain3[0], eng.vocab_rows, bad_at=2))
        assert r.tokens == plain3[0][:N_GEN] and eng.last_stats["spec"]["accepted"] >= 2
    finally:
        eng.close()


def test_trained_tiny_mtp_k5(tmp_path_factory, tiny_trained_bf16):
    """The trained tiny model (examples/tiny-trained, with its MTP head), K = 5, C = 1: MTP rounds give
    the plain run's tokens (each the reference's argmax for its prefix) and accept real drafts."""
    import ninfer_runtime as nr
    from quality import support as Q

    d = tmp_path_factory.mktemp("spec_trained")
    art = tiny_trained_bf16  # Q.pack(..., "bf16"), once per session (tests/conftest.py)
    plan = _compile(art, d / "k5.plan", S.interp_table(d / "interp90.yaml"), k=5, concurrency=(1,))
    prompt = Q.heldout_ids()[:9]
    with nr.load(plan, art, progress=False) as eng:
        assert eng.draft_tokens == 5 and eng.has_mtp_drafts
        plain = eng.generate(prompt, 8, spec="none", ignore_eos=True).tokens
        r = eng.generate(prompt, 8, ignore_eos=True)
        sp = eng.last_stats["spec"]
    assert r.tokens == plain
    assert sp["mode"] == "mtp" and sp["accepted"] > 0, sp
    ref = Q.reference_model(art)
    bad = S.check_tokens_against(lambda t: ref.prefill(list(t)).float(), prompt, r.tokens)
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_gpu_trained_tiny_graphs_match_eager_and_repeat(tmp_path_factory, tiny_trained_bf16):
    """Issue #17 item 1 on the GPU: the trained tiny model (real MTP head), K = 3, C = 2: the verify and
    MTP extents are CUDA-graph captured; three graph runs, an eager run and the plain (--spec none)
    run give the same tokens, and every run accepts the same drafts."""
    import ninfer_runtime as nr
    from quality import support as Q

    d = tmp_path_factory.mktemp("spec_gpu")
    art = tiny_trained_bf16  # Q.pack(..., "bf16"), once per session (tests/conftest.py)
    plan = _compile(art, d / "k3.plan", S.interp_table(d / "interp90.yaml"), k=3, concurrency=(1, 2))
    ids = Q.heldout_ids()
    prompts = [ids[:9], ids[40:57]]
    with nr.load(plan, art, device="cuda", progress=False) as eng:
        captured = sorted(eng.graphs)
        assert any(n.startswith("verify_") for n in captured), captured
        assert any(n.startswith("mtp_verify_") for n in captured), captured
        runs, accepted = [], []
        for _ in range(3):
            runs.append([r.tokens for r in eng.generate(prompts, 16, ignore_eos=True)])
            accepted.append((eng.last_stats["spec"]["rounds"], eng.last_stats["spec"]["accepted"]))
        eager = [r.tokens for r in eng.generate(prompts, 16, ignore_eos=True, use_graphs=False)]
        accepted.append((eng.last_stats["spec"]["rounds"], eng.last_stats["spec"]["accepted"]))
        plain = [r.tokens for r in eng.generate(prompts, 16, spec="none", ignore_eos=True)]
    assert runs[0] == runs[1] == runs[2] == eager == plain
    assert len(set(accepted)) == 1 and accepted[0][1] > 0, accepted
