"""`ninfer-run` (generate, and the CLI once) and `ninfer-serve` (the app, through the official
`openai` client on loopback) drive the same step API (runtime/ninfer_runtime/steps.py): the same
prompts give the same tokens and the same finish reason on both, for a max-tokens end, a stop id, a
full context (prompt + completion = max context: "length" on the wire, "context full" in the CLI's
words), plainly and with speculative rounds (MTP drafts and n-gram drafts).

The stop id: the artifact's stop ids are replaced (in the loaded engine's frontend, before the
server's adapter reads them) by a token the model emits mid-generation, so "stop" is reached in a
few tokens. The server's emitted ids are read from its scheduler's requests (the wire carries text).
Interpreter tokens cost seconds: few tokens, the tiny plans of conftest.py."""

from __future__ import annotations

import openai

from ninfer_runtime.serve.engine_adapter import EngineAdapter, open_engine

from .conftest import MAX_CONTEXT
from .support import ninfer_run, running

SHORT = [5, 17, 99, 23, 5, 17, 99]  # one prefill chunk; repeats (the n-gram drafter proposes)
FULL = [5, 17, 99, 23] * 15 + [5]  # 61 tokens: four chunks, 3 cache rows left
LONG = 64  # max_new_tokens on the ninfer-run side where the context, not max tokens, ends generation


def _cases(engine, spec: str, full: bool = True):
    """[(prompt, max_tokens or None (the server's default: the rest of the context), ignore_eos)] and
    ninfer-run's results for them: SHORT to 3 tokens, SHORT until a stop id (the engine's stop ids
    are replaced by the token SHORT emits second: under speculation it is cut out of a round), and
    with `full` FULL until the context is full."""
    first = engine.generate(SHORT, 3, ignore_eos=True, spec=spec)
    engine.frontend.stop_ids = (first.tokens[1],)
    cases = [(SHORT, 3, True), (SHORT, 3, False)] + ([(FULL, None, True)] if full else [])
    runs = [first] + [engine.generate(p, n or LONG, ignore_eos=i, spec=spec) for p, n, i in cases[1:]]
    got = [(r.tokens, r.finish_reason) for r in runs]
    assert [g[1] for g in got] == ["length", "stop", "length"][:len(cases)], got
    assert got[1][0] == first.tokens[:first.tokens.index(first.tokens[1]) + 1]
    if full:
        assert len(got[2][0]) == MAX_CONTEXT - len(FULL)  # the context, not LONG, ended it
    return cases, got


def _served(adapter, cases) -> list[tuple[list[int], str]]:
    """(emitted ids, wire finish_reason) per case, one request after another."""
    with running(adapter, model_name="tiny") as srv:
        seen = []
        submit = srv.scheduler.submit
        srv.scheduler.submit = lambda r: (seen.append(r), submit(r))[1]
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=600, max_retries=0)
        out = []
        for prompt, n, ignore_eos in cases:
            o = c.completions.create(model="tiny", prompt=prompt, temperature=0, extra_body={"ignore_eos": ignore_eos},
                                     **({} if n is None else {"max_tokens": n}))
            r = seen[-1]
            assert o.usage.completion_tokens == len(r.tokens)
            stop = set() if ignore_eos else set(adapter.stop_ids)  # the text leaves a stop id out
            assert o.choices[0].text == adapter.frontend.decode([t for t in r.tokens if t not in stop])
            out.append((list(r.tokens), o.choices[0].finish_reason))
    return out


def test_plain_run_and_serve_agree(tiny_served_plan):
    art, plan = tiny_served_plan
    # the CLI: a full context is "length" with the word "context full"
    ids, err = ninfer_run(plan, art, "--tokens", ",".join(map(str, FULL)), "--max-new-tokens", str(LONG),
                          "--ignore-eos", quiet=False)
    assert f"stopped: context full after {MAX_CONTEXT - len(FULL)} tokens" in err, err
    engine = open_engine(str(plan), str(art))
    try:
        cases, want = _cases(engine, "none")
        assert want[2][0] == ids
        assert _served(EngineAdapter(engine, spec="none"), cases) == want
    finally:
        engine.close()


def test_speculative_run_and_serve_agree(tiny_spec_plan):
    art, plan = tiny_spec_plan
    engine = open_engine(str(plan), str(art))
    eos = engine.frontend.stop_ids
    try:
        for spec in ("mtp", "ngram"):  # a full context under rounds: mtp only (suite time)
            engine.frontend.stop_ids = eos
            cases, want = _cases(engine, spec, full=spec == "mtp")
            adapter = EngineAdapter(engine, spec=spec)
            assert adapter.spec_mode == spec
            assert _served(adapter, cases) == want, spec
    finally:
        engine.close()
