"""ninfer-serve: an OpenAI-compatible HTTP server over a compiled plan (continuous batching, exact
prefix reuse of the hybrid GDN + attention state). Modules:

- engine_adapter.py: every call into the runtime's engine (the one place to re-point);
- scheduler.py: the engine loop (admission, chunked prefill, batched decode, stops, cancellation);
- prefix_cache.py: the radix tree of state snapshots (LRU, device budget, host spill);
- protocol.py: request validation, OpenAI response and error bodies;
- app.py: the FastAPI routes; metrics.py: prometheus metrics; server.py: uvicorn + drain;
- cli.py: `ninfer-serve PLAN --artifact A ...`.

Needs the `serve` extra (fastapi, uvicorn, prometheus-client); the rest of the runtime does not.
"""
