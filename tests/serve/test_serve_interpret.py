"""One request through the server with the plan's Triton kernels under the interpreter
(`kernels="interpret"`), the official `openai` client on loopback: the served greedy text is the
CPU torch path's for the same prompt (the serve tests run on the torch path, the CPU default)."""

from __future__ import annotations

import openai

from ninfer_runtime.serve.engine_adapter import EngineAdapter, open_engine

from .support import running

PROMPT = [1, 446, 774, 12]  # one prefill chunk


def test_one_interpreted_request_gives_the_torch_path_tokens(tiny_served_plan):
    art, plan = tiny_served_plan
    torch_engine = open_engine(str(plan), str(art))
    try:
        assert torch_engine.kernels == "torch"
        want = torch_engine.generate(PROMPT, 2).tokens
        stop = set(torch_engine.frontend.stop_ids)
        want_text = torch_engine.frontend.decode([t for t in want if t not in stop])
    finally:
        torch_engine.close()
    engine = open_engine(str(plan), str(art), kernels="interpret")
    assert engine.kernels == "interpret" and "Triton interpreter" in engine.device_note
    adapter = EngineAdapter(engine)
    try:
        with running(adapter, model_name="tiny") as srv:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=600, max_retries=0)
            r = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
    finally:
        adapter.close()
    assert r.usage.completion_tokens == len(want) and r.choices[0].text == want_text
