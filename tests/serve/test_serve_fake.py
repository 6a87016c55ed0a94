"""ninfer-serve's scheduler, prefix cache and HTTP surface over the deterministic fake engine
(tests/serve/fake_engine.py): many requests, exact expected outputs, no interpreter cost.
The same paths run against the trained tiny model in test_serve_tiny.py."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from ninfer_runtime.serve.prefix_cache import PrefixCache
from ninfer_runtime.serve.scheduler import Request, Scheduler

from .fake_engine import STOP, FakeAdapter, fake_generate
from .support import health, metric, running, sse_events, wait_until

MODEL = "fake-model"


def _text(ids):
    return "".join(chr(t) for t in ids if t != STOP)


def _client(srv, key="unused"):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, timeout=30, max_retries=0)


# ---------------------------------------------------------------------- the scheduler, stepped by hand
class _Collect:
    def __init__(self):
        self.events = []

    def __call__(self, ev):
        self.events.append(ev)

    @property
    def done(self):
        return any(e.kind == "done" for e in self.events)


def _req(prompt, n, **kw):
    c = _Collect()
    return Request(prompt, max_tokens=n, temperature=0.0, on_event=c, **kw), c


def test_chunked_prefill_runs_between_decode_steps():
    a = FakeAdapter(slots=4, chunk=8)
    s = Scheduler(a, max_queue=8, log=open("/dev/null", "w"))
    r1, c1 = _req([40, 41, 42], 50)
    s.submit(r1)
    s._step()
    s._step()
    assert r1.state == "decode"
    a.calls.clear()
    long_prompt = [50 + i % 40 for i in range(30)]  # 4 chunks of 8 (the last of 6)
    r2, c2 = _req(long_prompt, 3)
    s.submit(r2)
    for _ in range(4):
        s._step()
    kinds = [c[0] for c in a.calls]
    # one prefill chunk (the default budget) then the running stream's decode step, every step
    assert kinds == ["prefill", "decode"] * 4, a.calls
    assert [c[2:] for c in a.calls if c[0] == "prefill"] == [(0, 8), (8, 8), (16, 8), (24, 6)]
    # the running stream never had to share a decode step with padding into r2's busy slot
    assert a.padding_into_busy == 0
    for _ in range(60):
        if c1.done and c2.done:
            break
        s._step()
    assert r1.tokens == fake_generate([40, 41, 42], 50) and r2.tokens == fake_generate(long_prompt, 3)


def test_prefill_budget_is_honoured():
    a = FakeAdapter(slots=2, chunk=8)
    s = Scheduler(a, prefill_budget=3, log=open("/dev/null", "w"))
    r, _ = _req(list(range(40, 50)), 2)
    s.submit(r)
    s._step()
    assert [c for c in a.calls if c[0] == "prefill"] == [("prefill", 0, 0, 3)]


def test_padding_never_writes_a_busy_slot():
    """3 decoding + 1 prefilling in 4 slots with extents (1, 4): the fake asserts every position
    is written once, so padding into the prefilling slot would fail there."""
    a = FakeAdapter(slots=4, chunk=4, decode_extents=(4,))
    s = Scheduler(a, log=open("/dev/null", "w"))
    reqs = [_req([60 + i, 61, 62], 20) for i in range(3)]
    for r, _ in reqs:
        s.submit(r)
    for _ in range(4):
        s._step()
    long_r, _ = _req([70 + i % 20 for i in range(16)], 2)
    s.submit(long_r)
    for _ in range(40):
        s._step()
    assert a.padding_into_busy > 0  # the situation did arise (the real adapter saves / restores)
    for (r, _), i in zip(reqs, range(3)):
        assert r.tokens == fake_generate([60 + i, 61, 62], 20)


# ---------------------------------------------------------------------- the prefix cache
class _Snap:
    def __init__(self, n, nbytes):
        self.length, self.nbytes, self.logits = n, nbytes, object()

    def to(self, device):
        return self


def test_radix_lookup_split_and_lru():
    c = PrefixCache(device_bytes=250)
    assert c.insert([1, 2, 3, 4], lambda: _Snap(4, 100))
    assert c.insert([1, 2, 9], lambda: _Snap(3, 100))  # splits the edge at [1, 2]
    assert not c.insert([1, 2, 3, 4], lambda: pytest.fail("already cached"))
    assert c.lookup([1, 2, 3, 4, 5])[0] == 4
    assert c.lookup([1, 2, 9])[0] == 3
    assert c.lookup([1, 2, 3])[0] == 0 and c.lookup([7])[0] == 0
    c.lookup([1, 2, 9, 9])  # [1, 2, 9] most recent -> [1, 2, 3, 4] goes first
    assert c.insert([5, 6], lambda: _Snap(2, 100))
    assert c.device_used <= 250 and c.evictions == 1
    assert c.lookup([1, 2, 3, 4])[0] == 0 and c.lookup([1, 2, 9])[0] == 3 and c.lookup([5, 6])[0] == 2


def test_host_spill_keeps_an_evicted_snapshot():
    c = PrefixCache(device_bytes=150, host_bytes=150, to_host=lambda s: s)
    c.insert([1, 2], lambda: _Snap(2, 100))
    c.insert([3, 4], lambda: _Snap(2, 100))
    assert c.device_used == 100 and c.host_used == 100
    assert c.lookup([1, 2, 5])[0] == 2 and c.lookup([3, 4])[0] == 2
    assert PrefixCache(device_bytes=0).insert([1], lambda: _Snap(1, 1)) is False


def test_every_snapshot_let_go_is_told():
    """on_drop hears of each snapshot the cache lets go (a --tp plan's other ranks free theirs then):
    one over the budget, one evicted past the host tier, and every one on clear; never a kept one."""
    dropped = []
    c = PrefixCache(device_bytes=150, host_bytes=100, to_host=lambda s: s, on_drop=dropped.append)
    big, a, b, d = _Snap(1, 200), _Snap(2, 100), _Snap(2, 100), _Snap(2, 100)
    assert not c.insert([9], lambda: big) and dropped == [big]
    c.insert([1, 2], lambda: a)
    c.insert([3, 4], lambda: b)  # a spills to the host tier: kept, not dropped
    assert dropped == [big]
    c.insert([5, 6], lambda: d)  # b spills, a leaves the full host tier
    assert dropped == [big, a] and c.lookup([1, 2])[0] == 0
    c.clear()
    assert sorted(map(id, dropped[2:])) == sorted(map(id, (b, d))) and c.snapshots == 0


# ---------------------------------------------------------------------- over HTTP
def test_concurrent_requests_equal_alone_and_prefix_reuse_counted():
    a = FakeAdapter(slots=4, chunk=8)
    with running(a) as srv:
        c = _client(srv)
        prompts = [f"prompt number {i} says" for i in range(6)]  # 6 > 4 slots: two wait
        with ThreadPoolExecutor(6) as ex:
            outs = list(ex.map(lambda p: c.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0),
                               prompts))
        for p, o in zip(prompts, outs):
            want = fake_generate(a.encode(p), 12)
            assert o.choices[0].text == _text(want), p
            assert o.choices[0].finish_reason == ("stop" if want[-1] == STOP else "length")
            assert o.usage.prompt_tokens == len(p) and o.usage.completion_tokens == len(want)
        # the same prompt again: restored whole, nothing prefilled
        before = a.prefill_tokens
        again = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=12, temperature=0)
        assert again.choices[0].text == outs[0].choices[0].text
        assert again.usage.prompt_tokens_details.cached_tokens == len(prompts[0]) and a.prefill_tokens == before
        # a continuation of prompt + completion (a second turn) restores the end-of-generation state
        gen = fake_generate(a.encode(prompts[1]), 12)
        if gen[-1] != STOP:
            turn2 = prompts[1] + _text(gen) + " and then"
            o2 = c.completions.create(model=MODEL, prompt=turn2, max_tokens=5, temperature=0)
            assert o2.choices[0].text == _text(fake_generate(a.encode(turn2), 5))
            assert o2.usage.prompt_tokens_details.cached_tokens == len(prompts[1]) + len(gen) - 1
        assert metric(srv, "ninfer_cached_prompt_tokens_total") > 0


def test_stream_with_usage_and_done():
    a = FakeAdapter()
    with running(a) as srv:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = sse_events(r)
        assert data[-1] == "[DONE]"
        import json

        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
        want = fake_generate(a.encode_chat([{"role": "user", "content": "hi there"}]), 7)
        assert text == _text(want)
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == len(want)
        assert usage["prompt_tokens"] == len(a.encode_chat([{"role": "user", "content": "hi there"}]))
        assert "cached_tokens" in usage["prompt_tokens_details"]


def test_stop_strings_cut_and_never_leak_into_the_stream():
    a = FakeAdapter()
    prompt = "stop strings please"
    full = _text(fake_generate(a.encode(prompt), 40))
    stop = full[5:7]
    assert len(stop) == 2 and full.find(stop) >= 0
    cut = full[:full.find(stop)]
    with running(a) as srv:
        c = _client(srv)
        o = c.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "\x00"])
        assert o.choices[0].text == cut and o.choices[0].finish_reason == "stop"
        parts = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                                                    temperature=0, stop=stop, stream=True)]
        assert "".join(parts) == cut


def test_errors_are_openai_bodies():
    a = FakeAdapter(max_context=64)
    with running(a) as srv:
        u = srv.url

        def post(path, **kw):
            r = httpx.post(u + path, timeout=10, **kw)
            body = r.json()
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
            return r.status_code, body["error"]

        assert post("/v1/completions", content=b"{not json")[0] == 400
        st, e = post("/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": 9})
        assert st == 400 and e["param"] == "temperature"
        st, e = post("/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
        assert st == 400 and e["param"] == "messages"
        st, e = post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 2})
        assert st == 400 and e["param"] == "n"
        st, e = post("/v1/completions", json={"model": MODEL, "prompt": "x" * 10, "max_tokens": 60})
        assert st == 400 and e["param"] == "max_tokens" and "64" in e["message"] and e["code"] == \
            "context_length_exceeded"
        st, e = post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                   "max_completion_tokens": 0})
        assert st == 400 and e["param"] == "max_completion_tokens"
        st, e = post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 999]})
        assert st == 400 and e["param"] == "prompt"
        st, e = post("/v1/completions", json={"model": "other", "prompt": "x"})
        assert st == 404 and e["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError):
            _client(srv).completions.create(model=MODEL, prompt="x", top_p=0)
        with pytest.raises(openai.NotFoundError):
            _client(srv).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        assert httpx.get(u + "/nowhere", timeout=10).json()["error"]["code"] == "not_found"
        assert health(srv)["status"] == "ok"  # no bad request takes the server down


def test_api_key():
    with running(FakeAdapter(), api_key="sekrit") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.get(srv.url + "/v1/models", headers=headers, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            _client(srv, "wrong").completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert _client(srv, "sekrit").completions.create(model=MODEL, prompt="x", max_tokens=2).usage.prompt_tokens == 1
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def test_queue_full_is_429_with_retry_after():
    a = FakeAdapter(slots=2)
    a.gate.clear()  # the engine loop blocks in its first step
    with running(a, max_queue=2) as srv:
        body = {"model": MODEL, "prompt": "queued", "max_tokens": 2, "temperature": 0}
        results = []

        def one():
            results.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=60))

        threads = [threading.Thread(target=one) for _ in range(4)]  # 2 slots + 2 queued
        for t in threads:
            t.start()
        wait_until(lambda: srv.scheduler.snapshot_state()["waiting"] + srv.scheduler.snapshot_state()["running"] >= 4,
                   what="4 requests accepted")
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        a.gate.set()
        for t in threads:
            t.join(60)
        assert [x.status_code for x in results] == [200] * 4


def test_cancelled_stream_frees_its_slot():
    a = FakeAdapter(slots=2)
    a.step_delay = 0.05  # 200 tokens would take ~10 s: the stream is still running when it is closed
    with running(a) as srv:
        c = _client(srv)
        s = c.completions.create(model=MODEL, prompt="a long story", max_tokens=200, temperature=0, stream=True,
                                 extra_body={"ignore_eos": True})
        first = next(iter(s))
        assert first.choices[0].text
        s.close()
        wait_until(lambda: health(srv)["slots_used"] == 0, 10, what="the slot to be freed")
        rec = wait_until(lambda: srv.test_log.requests(), 10, what="the request's log line")[0]
        assert rec["finish_reason"] == "cancelled" and rec["completion_tokens"] < 200
        assert c.completions.create(model=MODEL, prompt="next", max_tokens=2, temperature=0).choices[0].text


def test_drain_aborts_running_and_refuses_new():
    a = FakeAdapter(slots=2)
    a.step_delay = 0.05
    with running(a, drain_s=0.5) as srv:
        body = {"model": MODEL, "prompt": "drain me", "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
            it = r.iter_lines()
            next(x for x in it if x.startswith("data: "))
            srv.begin_shutdown()
            r2 = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=10)
            assert r2.status_code == 503
            rest = [x for x in it if x.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"abort"' in rest[-2]
        srv._thread.join(10)
        assert not srv._thread.is_alive()


def test_load_nothing_lost_or_duplicated():
    """50 requests, 8 at a time, prompts sharing prefixes; every answer exact, every log line once."""
    a = FakeAdapter(slots=4, chunk=8)
    base = "shared system prompt: "
    prompts = [base + f"question {i % 10} " + "x" * (i % 3) for i in range(50)]
    with running(a, max_queue=64) as srv:
        c = _client(srv)

        def ask(i):
            o = c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=4 + i % 5, temperature=0,
                                     user=f"u{i}")
            return i, o

        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(ask, range(50)))
        ids = set()
        for i, o in outs:
            assert o.choices[0].text == _text(fake_generate(a.encode(prompts[i]), 4 + i % 5)), i
            ids.add(o.id)
        assert len(ids) == 50
        recs = srv.test_log.requests()
        assert sorted(r["id"] for r in recs) == sorted(ids)
        assert all(r["finish_reason"] in ("stop", "length") for r in recs)
        assert sum(r["cached_tokens"] for r in recs) > 0
        h = health(srv)
        assert h["status"] == "ok" and h["slots_used"] == 0 and h["waiting"] == 0
        assert metric(srv, "ninfer_requests_total") == 50
        assert metric(srv, "ninfer_time_to_first_token_seconds_count") == 50
