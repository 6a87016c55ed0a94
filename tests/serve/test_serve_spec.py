"""ninfer-serve with speculative decoding: the scheduler's rounds over the speculative fake
(tests/serve/spec_fake.py: outputs equal the plain toy model's, acceptance counted in the metrics
and the request log, the prefix cache restores MTP state only where it is exact, a round cut by a
stop leaves no snapshot, lanes freed), and the real engine in test_serve_spec_tiny.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai

from ninfer_runtime.serve.scheduler import Request, Scheduler

from .conftest import SPEC_K
from .fake_engine import STOP, fake_generate
from .spec_fake import FakeSpecAdapter
from .support import health, metric, ninfer_run, running, wait_until

MODEL = "fake-model"


def _text(ids):
    return "".join(chr(t) for t in ids if t != STOP)


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=30, max_retries=0)


def _run(s, reqs, steps=400):
    for _ in range(steps):
        if all(r.state == "done" for r in reqs):
            return
        s._step()
    raise AssertionError("requests did not finish")


def _req(prompt, n):
    return Request(prompt, max_tokens=n, temperature=0.0, ignore_eos=True)


def test_rounds_emit_the_plain_tokens_and_count_acceptance():
    a = FakeSpecAdapter(k=3, slots=3, chunk=8)
    s = Scheduler(a, log=open("/dev/null", "w"), cache_bytes=0)
    prompts = [[40 + i, 41, 42, 43 + i] for i in range(3)] + [[60 + i % 30 for i in range(21)]]  # 4 > 3 slots
    reqs = [_req(p, 17) for p in prompts]
    for r in reqs:
        s.submit(r)
    _run(s, reqs)
    for p, r in zip(prompts, reqs):
        want = fake_generate(p, 17, a.max_context)
        # ignore_eos: the toy model's stop id is just a token
        assert r.tokens[:len(want)] == want[:len(r.tokens)] and len(r.tokens) == 17, (p, r.tokens, want)
        assert r.spec_rounds >= 1 and r.spec_proposed == 3 * r.spec_rounds
        assert r.spec_accepted < r.spec_proposed and r.spec_accepted > 0
    assert sorted(a.released) == [0, 0, 1, 2] or len(a.released) == 4
    assert not a.lanes  # every lane released
    assert [c for c in a.calls if c[0] == "decode"] == []  # rounds only, no plain steps


def test_chunked_prefill_interleaves_with_rounds():
    a = FakeSpecAdapter(k=3, slots=2, chunk=8)
    s = Scheduler(a, log=open("/dev/null", "w"))
    r1 = _req([40, 41, 42], 60)
    s.submit(r1)
    s._step()
    s._step()
    assert r1.state == "decode"
    a.calls.clear()
    long_prompt = [50 + i % 40 for i in range(30)]  # chunks 8, 8, 8, 6
    r2 = _req(long_prompt, 5)
    s.submit(r2)
    for _ in range(4):
        s._step()
    assert [c[0] for c in a.calls] == ["prefill", "round"] * 4, a.calls
    # r2 joins the round of the step that ran its last chunk
    assert [c for c in a.calls if c[0] == "round"] == [("round", 1)] * 3 + [("round", 2)]
    _run(s, [r1, r2])
    assert r2.tokens == fake_generate(long_prompt, 5, a.max_context)


def test_prefix_reuse_under_mtp_is_keyed_by_the_follower():
    """Greedy: equal outputs; a second turn restores the end-of-generation state (the fake asserts its
    MTP row); the same prompt again is not restored whole (its first token follows the lookup)."""
    a = FakeSpecAdapter(k=2, slots=2, chunk=8, accept_of=lambda p: 1)  # 2 tokens per round: 1 + 2n never cut
    s = Scheduler(a, log=open("/dev/null", "w"), snapshot_interval=8)
    p1 = [50 + i % 20 for i in range(19)]  # chunks 8, 8, 3: boundary snapshots at 8 and 16
    r1 = _req(p1, 9)
    s.submit(r1)
    _run(s, [r1])
    assert r1.tokens == fake_generate(p1, 9, a.max_context)
    assert s.cache.contains(p1[:9]) and s.cache.contains(p1[:17])  # L tokens + the follower
    assert s.cache.contains(p1 + r1.tokens[:1])  # the end of the prompt + its first token
    assert s.cache.contains(p1 + r1.tokens) and not s.cache.contains(p1)
    r2 = _req(p1, 9)  # the same prompt: restores 16 tokens, prefills 3
    s.submit(r2)
    _run(s, [r2])
    assert r2.tokens == r1.tokens and r2.cached_tokens == 16
    turn2 = p1 + r1.tokens + [77, 78]
    r3 = _req(turn2, 6)
    s.submit(r3)
    _run(s, [r3])
    assert r3.cached_tokens == len(p1) + len(r1.tokens) - 1
    assert r3.tokens == fake_generate(turn2, 6, a.max_context)
    # a different token after the cached prompt: the follower-keyed end-of-prompt snapshot is not used
    other = p1 + [(r1.tokens[0] + 1) % 100]
    r4 = _req(other, 4)
    s.submit(r4)
    _run(s, [r4])
    assert r4.cached_tokens == 16 and r4.tokens == fake_generate(other, 4, a.max_context)


def test_ngram_mode_snapshots_as_without_speculation():
    """The n-gram drafter has no device state: the end-of-prompt snapshot is keyed by the prompt and
    holds its logits row, so the same prompt again is restored whole (nothing prefilled); the
    end-of-generation snapshot takes the round's logits row of the last token."""
    a = FakeSpecAdapter(k=2, slots=1, chunk=8, accept_of=lambda p: 1, mode="ngram")
    s = Scheduler(a, log=open("/dev/null", "w"))
    p = [50 + i % 20 for i in range(11)]
    r1 = _req(p, 7)  # 1 + 2 x 3: never cut
    s.submit(r1)
    _run(s, [r1])
    assert s.cache.contains(p) and s.cache.contains(p + r1.tokens[:-1])
    before = a.prefill_tokens
    r2 = _req(p, 7)
    s.submit(r2)
    _run(s, [r2])
    assert r2.tokens == r1.tokens == fake_generate(p, 7, a.max_context)
    assert r2.cached_tokens == len(p) and a.prefill_tokens == before
    turn2 = p + r1.tokens + [77]
    r3 = _req(turn2, 3)
    s.submit(r3)
    _run(s, [r3])
    assert r3.cached_tokens == len(p) + len(r1.tokens) - 1 and r3.tokens == fake_generate(turn2, 3, a.max_context)


def test_a_round_cut_by_max_tokens_leaves_no_snapshot():
    """accept 3 of 3 every round: 4 tokens per round, so max_tokens 6 cuts the second round after 1
    of its 4 tokens; the slot consumed more than it emitted: no end-of-generation snapshot."""
    a = FakeSpecAdapter(k=3, slots=1, chunk=8, accept_of=lambda p: 3)
    s = Scheduler(a, log=open("/dev/null", "w"))
    p = [30, 31, 32, 33, 34]
    r = _req(p, 6)
    s.submit(r)
    _run(s, [r])
    assert r.tokens == fake_generate(p, 6, a.max_context) and r.spec_rounds == 2
    assert not s.cache.contains(p + r.tokens)
    r2 = _req(p, 5)  # 1 + 4: the second round is emitted whole -> snapshotted
    s.submit(r2)
    _run(s, [r2])
    assert r2.tokens == r.tokens[:5] and s.cache.contains(p + r2.tokens)


def test_server_metrics_log_and_cancel_with_spec():
    a = FakeSpecAdapter(k=3, slots=2, chunk=8)
    with running(a) as srv:
        c = _client(srv)
        prompts = [f"spec prompt {i}" for i in range(4)]
        with ThreadPoolExecutor(4) as ex:
            outs = list(ex.map(lambda p: c.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                                                              extra_body={"ignore_eos": True}), prompts))
        for p, o in zip(prompts, outs):
            want = fake_generate(a.encode(p), 10, a.max_context)
            assert o.usage.completion_tokens == 10 and o.choices[0].text == _text(want[:10])
        # streaming: the same text, token by token
        s = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=10, temperature=0, stream=True,
                                 extra_body={"ignore_eos": True})
        assert "".join(ch.choices[0].text for ch in s if ch.choices) == outs[0].choices[0].text
        recs = srv.test_log.requests()
        assert len(recs) == 5 and all(r["spec"]["mode"] == "mtp" for r in recs)
        rounds, proposed, accepted = (sum(r["spec"][k] for r in recs) for k in ("rounds", "proposed", "accepted"))
        assert proposed == 3 * rounds and 0 < accepted < proposed
        assert metric(srv, "ninfer_spec_rounds_total") == rounds
        assert metric(srv, "ninfer_spec_draft_tokens_total") == proposed
        assert metric(srv, "ninfer_spec_accepted_tokens_total") == accepted
        assert metric(srv, 'ninfer_spec_info{k="3",mode="mtp"}') == 1
        assert metric(srv, "ninfer_generation_tokens_total") == 50
        # a cancelled stream frees its slot and its lane
        a.step_delay = 0.05
        st = c.completions.create(model=MODEL, prompt="a long story", max_tokens=200, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
        assert next(iter(st)).choices[0].text
        st.close()
        wait_until(lambda: health(srv)["slots_used"] == 0, 10, what="the slot to be freed")
        wait_until(lambda: not a.lanes, 10, what="the lane to be released")


# ---------------------------------------------------------------------- the real engine (interpreter)
MSGS = [{"role": "user", "content": "x = 1"}]  # 14 chat tokens: one prefill chunk


def test_openai_client_with_mtp_spec_on_the_tiny_model(tiny_spec_plan, tiny_served_plan):
    """Greedy chat through ninfer-serve --spec mtp == ninfer-run --spec none == ninfer-run --spec mtp;
    streamed the same; acceptance in the log line; a cancelled stream frees its slot; the CLI refuses
    --spec mtp on a plan without a draft window in one line."""
    from ninfer_runtime.serve.cli import main as serve_main
    from ninfer_runtime.serve.engine_adapter import EngineAdapter, open_engine

    art, plan = tiny_spec_plan
    n = 3  # the prefill's token + at least one MTP round (2 tokens left, a round emits up to K + 1 = 3)
    engine = open_engine(str(plan), str(art))
    # without spec (plain decode_c1_k0 steps of the same plan) and as ninfer-run --spec mtp (tests/runtime
    # compares ninfer-run's --spec mtp with --spec none): each engine load warms every extent, seconds each here
    plain = engine.generate(engine.frontend.encode_chat(MSGS), max_new_tokens=n, greedy=True, ignore_eos=True,
                            spec="none").tokens
    assert ninfer_run(plan, art, "--chat", "--prompt", "x = 1", "--max-new-tokens", str(n), "--spec", "mtp",
                       "--ignore-eos") == plain
    adapter = EngineAdapter(engine)
    assert adapter.spec_mode == "mtp" and adapter.draft_tokens == SPEC_K
    text = engine.frontend.decode(plain)
    with running(adapter, model_name="tiny") as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=600, max_retries=0)
        r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].message.content == text and r.usage.completion_tokens == n
        s = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=n, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == text
        recs = srv.test_log.requests()
        assert [x["spec"]["mode"] for x in recs] == ["mtp", "mtp"]
        assert all(x["spec"]["rounds"] >= 1 and x["spec"]["proposed"] == SPEC_K * x["spec"]["rounds"] for x in recs)
        assert metric(srv, "ninfer_spec_draft_tokens_total") == sum(x["spec"]["proposed"] for x in recs)
        st = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
        it = iter(st)
        next(it)  # the role chunk
        next(it)  # the first token
        st.close()
        wait_until(lambda: health(srv)["slots_used"] == 0, 300, 0.2, "the cancelled stream's slot")
        assert not adapter.lanes
    engine.close()
    # a plan without a draft window: --spec mtp is one line, exit 2 (the conftest's served plan is
    # K = 0: no plan of its own to compile)
    import io
    from contextlib import redirect_stderr

    from ninfer_runtime.serve.server import free_port

    art0, k0 = tiny_served_plan
    assert not (json.loads((k0 / "plan.json").read_text()).get("options") or {}).get("draft_tokens")
    err = io.StringIO()
    with redirect_stderr(err):
        rc = serve_main([str(k0), "--artifact", str(art0), "--spec", "mtp", "--port", str(free_port())])
    assert rc == 2 and err.getvalue().startswith("error: ") and len(err.getvalue().strip().splitlines()) == 1
    assert "--draft-tokens" in err.getvalue()


def test_ngram_spec_on_the_tiny_model_restores_a_whole_prompt(tiny_spec_plan):
    """--spec ngram on the same plan: greedy == plain; the same prompt again is restored whole from
    the prefix cache (the n-gram drafter has no device state) and gives the same tokens."""
    from ninfer_runtime.serve.engine_adapter import EngineAdapter, open_engine

    art, plan = tiny_spec_plan
    engine = open_engine(str(plan), str(art))
    prompt = [5, 17, 99, 23, 5, 17, 99, 23, 5, 17]  # repeats: the n-gram drafter has something to propose
    n = 4  # the prefill's token + n-gram rounds / plain steps for 3 more (suite time)
    plain = engine.generate(prompt, max_new_tokens=n, greedy=True, ignore_eos=True, spec="none").tokens
    adapter = EngineAdapter(engine, spec="ngram")
    assert adapter.spec_mode == "ngram"
    with running(adapter, model_name="tiny") as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=600, max_retries=0)
        texts = []
        for _ in range(2):
            o = c.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})
            texts.append(o.choices[0].text)
        assert texts[0] == texts[1] == engine.frontend.decode(plain)
        assert o.usage.prompt_tokens_details.cached_tokens == len(prompt)
        recs = srv.test_log.requests()
        assert [x["spec"]["mode"] for x in recs] == ["ngram", "ngram"] and recs[0]["spec"]["rounds"] >= 1
    engine.close()
