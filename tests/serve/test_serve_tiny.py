"""ninfer-serve over the trained tiny model under the Triton interpreter, driven by the official
`openai` client on loopback.

Interpreter tokens cost seconds each, so the checks run as one scenario on one server (a test per
check would build one server per xdist worker and lose the cache state the later checks build on)
with few tokens: max_tokens 2, prompts of <= 16 tokens (one prefill chunk). Order:
1. `ninfer-run --chat` (in-process) gives the reference greedy tokens for a chat prompt;
2. the same chat request to the server (cold): the same text, cached_tokens 0;
3. again, streamed with usage: restored whole from the prefix cache (cached_tokens = prompt), same text;
4. three requests at once (3 slots: the cached chat prompt, its continuation -> a partial restore,
   a cold token prompt) each equal to its result alone (engine.generate, before the server started);
5. a cancelled stream frees its slot; 400 / 404 / 401 bodies;
6. a bounded load: 6 requests, 4 at a time on 3 slots, max_tokens 2, nothing lost or duplicated, healthy
   after (50 requests 8 at a time run over the fake engine).
The subprocess test starts the real `ninfer-serve` CLI (with SIGINT/SIGTERM blocked, as a harness may
start it) and checks SIGTERM exits 0 within 10 s.
The scheduler / cache / HTTP paths at larger counts (50 requests, 429, stop strings, drain) run over
the fake engine in test_serve_fake.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from ninfer_runtime.serve.engine_adapter import EngineAdapter, open_engine

from .support import health, metric, ninfer_run, running, wait_until

KEY = "test-key"
MSGS = [{"role": "user", "content": "x = 1"}]  # 14 chat tokens: one prefill chunk
REPO = Path(__file__).resolve().parents[2]


def _text(engine, ids) -> str:
    stop = set(engine.frontend.stop_ids)
    return engine.frontend.decode([t for t in ids if t not in stop])


def test_openai_client_against_the_tiny_model(tiny_served_plan):
    art, plan = tiny_served_plan
    want_chat = ninfer_run(plan, art, "--prompt", MSGS[0]["content"], "--chat", "--max-new-tokens", "2")
    engine = open_engine(str(plan), str(art))
    chat_ids = engine.frontend.encode_chat(MSGS)
    assert len(chat_ids) <= 14
    # a continuation of the chat turn (restores the end-of-generation snapshot or the prompt's) and a cold prompt
    cont = chat_ids + want_chat[:1] + [201]
    cold = [1, 446, 774]
    alone = {tuple(p): r.tokens for p, r in zip((cont, cold), engine.generate([cont, cold], 2, concurrency=1))}
    adapter = EngineAdapter(engine)
    with running(adapter, api_key=KEY, model_name="tiny") as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, timeout=600, max_retries=0)
        assert [m.id for m in c.models.list().data] == ["tiny"]

        # 2. greedy chat completion == ninfer-run --chat
        r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0)
        assert r.choices[0].message.content == _text(engine, want_chat)
        assert r.usage.prompt_tokens == len(chat_ids) and r.usage.completion_tokens == len(want_chat)
        assert r.usage.prompt_tokens_details.cached_tokens == 0

        # 3. streamed with usage; restored whole from the prefix cache
        parts, usage, reasons = [], None, []
        for ch in c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
            if ch.usage is not None:
                usage = ch.usage
            for choice in ch.choices:
                parts.append(choice.delta.content or "")
                reasons.append(choice.finish_reason)
        assert "".join(parts) == r.choices[0].message.content
        assert reasons[-1] == r.choices[0].finish_reason
        assert usage is not None and usage.prompt_tokens_details.cached_tokens == len(chat_ids)
        assert usage.completion_tokens == len(want_chat)

        # 4. three at once, each equal to its result alone
        def chat():
            return c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0)

        def comp(p):
            return c.completions.create(model="tiny", prompt=p, max_tokens=2, temperature=0)

        with ThreadPoolExecutor(3) as ex:
            f_chat, f_cont, f_cold = ex.submit(chat), ex.submit(comp, cont), ex.submit(comp, cold)
            o_chat, o_cont, o_cold = f_chat.result(600), f_cont.result(600), f_cold.result(600)
        assert o_chat.choices[0].message.content == r.choices[0].message.content
        assert o_cont.choices[0].text == _text(engine, alone[tuple(cont)])
        assert o_cold.choices[0].text == _text(engine, alone[tuple(cold)])
        cached = o_cont.usage.prompt_tokens_details.cached_tokens
        assert len(chat_ids) <= cached < len(cont), cached  # restored a prefix, prefilled the rest
        assert o_cold.usage.prompt_tokens_details.cached_tokens == 0

        # 5. a cancelled stream frees its slot
        s = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        it = iter(s)
        next(it)  # the role chunk
        next(it)  # the first token
        s.close()
        wait_until(lambda: health(srv)["slots_used"] == 0, 300, 0.2, "the cancelled stream's slot")
        rec = wait_until(lambda: [x for x in srv.test_log.requests() if x["finish_reason"] == "cancelled"], 60,
                         what="the cancelled request's log line")[0]
        assert rec["completion_tokens"] < 40

        # errors: 400 naming the parameter / the limit, 404, 401; the server stays up
        for bad, param in (({"max_tokens": 2, "temperature": -1}, "temperature"), ({"max_tokens": 62}, "max_tokens")):
            try:
                c.completions.create(model="tiny", prompt=cold, **bad)
            except openai.BadRequestError as exc:
                assert exc.body["param"] == param, exc.body
                if param == "max_tokens":
                    assert "64" in exc.body["message"]
            else:
                raise AssertionError(f"{bad} was accepted")
        try:
            c.completions.create(model="gpt-4", prompt=cold, max_tokens=1)
        except openai.NotFoundError as exc:
            assert exc.body["code"] == "model_not_found"
        else:
            raise AssertionError("an unknown model was accepted")
        r401 = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": cold}, timeout=30)
        assert r401.status_code == 401 and r401.json()["error"]["code"] == "invalid_api_key"

        # 6. bounded load over the cached prompts: every answer exact, none lost or duplicated
        prompts = [cont, cold, chat_ids] * 2
        expect = {tuple(cont): o_cont.choices[0].text, tuple(cold): o_cold.choices[0].text,
                  tuple(chat_ids): r.choices[0].message.content}
        n_before = len(srv.test_log.requests())
        with ThreadPoolExecutor(4) as ex:
            outs = list(ex.map(comp, prompts))
        assert [o.choices[0].text for o in outs] == [expect[tuple(p)] for p in prompts]
        ids = {o.id for o in outs}
        assert len(ids) == 6
        recs = srv.test_log.requests()[n_before:]
        assert sorted(x["id"] for x in recs) == sorted(ids)
        assert all(x["cached_tokens"] > 0 for x in recs)
        h = health(srv)
        assert h["status"] == "ok" and h["slots_used"] == 0 and h["waiting"] == 0
        assert metric(srv, "ninfer_requests_total") >= 14
        for line in srv.test_log.requests():
            assert {"queue_wait_s", "ttft_s", "decode_tok_s", "prompt_tokens", "completion_tokens", "cached_tokens",
                    "finish_reason"} <= set(line)
    engine.close()


def test_cli_serves_and_exits_0_on_sigterm(tiny_served_plan):
    art, plan = tiny_served_plan
    from ninfer_runtime.serve.server import free_port

    port = free_port()
    from runtime.support import BLOCK_NINFER_COMPILE

    # the runtime (serve included) never imports the compiler: the child cannot import it
    argv = ["ninfer-serve", str(plan), "--artifact", str(art), "--port", str(port), "--model-name", "tiny"]
    code = (f"{BLOCK_NINFER_COMPILE}import runpy\nsys.argv = {argv!r}\n"
            "runpy.run_module('ninfer_runtime.serve', run_name='__main__')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "runtime")}
    block = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # noqa: E731
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=str(plan.parent),
                         preexec_fn=block)  # started as a harness that blocks the signals would: served anyway
    try:
        def up():
            if p.poll() is not None:
                raise AssertionError(f"ninfer-serve exited {p.returncode}: {p.stderr.read()}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"] == "ok"
            except httpx.HTTPError:
                return False

        wait_until(up, 240, 0.25, "ninfer-serve to listen")
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "tiny"
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=10)  # the bound: drained and exited within 10 s
        err = p.stderr.read()
        assert rc == 0, err
        assert "ninfer-serve: stopped" in err and '"event": "shutdown"' in err
        assert all(not ln.startswith("Traceback") for ln in err.splitlines()), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_adapter_padding_borrows_a_busy_slot_and_puts_its_state_back(tiny_served_plan):
    """Two decoding columns on the C=3 extent with the third slot mid-prefill: the pad column goes
    into that slot and its state (GDN rows, KV row 0) comes back bit for bit; snapshot / restore
    round-trips exactly."""
    import torch

    art, plan = tiny_served_plan
    engine = open_engine(str(plan), str(art))
    try:
        a = EngineAdapter(engine)
        names = sorted(engine.plan["buffers"]["state"])
        for s in range(3):
            a.reset(s)
        a.prefill(2, [1, 446, 774], 0)
        before = {n: engine.state(n)[2].clone() for n in names}
        snap = a.snapshot(2, 3, None)
        a.step([(5, 0, 0), (5, 0, 1)], busy={2}, params=[a.sampler(temperature=0, top_p=1, top_k=0, seed=0)] * 2)
        for n in names:
            assert torch.equal(engine.state(n)[2], before[n]), n
        assert any(not torch.equal(engine.state(n)[0], torch.zeros_like(engine.state(n)[0])) for n in names)
        a.restore(0, snap)
        for n in names:
            kind = engine.plan["buffers"]["state"][n]["kind"]
            got, want = engine.state(n)[0], before[n]
            if kind == "kv":
                assert torch.equal(got[:3], want[:3]) and not got[3:].any(), n
            else:
                assert torch.equal(got, want), n
    finally:
        engine.close()
