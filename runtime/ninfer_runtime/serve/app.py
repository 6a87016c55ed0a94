"""The HTTP side: FastAPI routes over one `Scheduler`.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream or not), GET /health,
GET /metrics. Every error is an OpenAI-style JSON body (protocol.APIError); an unexpected exception
in a handler is a 500 body, never a dead server. With an API key set, /v1/* needs
`Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open (as vLLM's).

A request's tokens arrive from the engine thread through `loop.call_soon_threadsafe` into an
asyncio queue. A client that goes away is noticed by the streaming response (its generator is
closed) or, for a plain response, by polling `is_disconnected()`; either cancels the request, and
the engine loop frees its slot at its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import protocol as P
from .scheduler import Draining, Event, QueueFull, Request

DISCONNECT_POLL_S = 0.25


class ServeConfig:
    def __init__(self, *, model_name: str, api_key: str | None = None, retry_after_s: int = 1):
        self.model_name = model_name
        self.api_key = api_key or None
        self.retry_after_s = int(retry_after_s)


class _RequestStream(StreamingResponse):
    """A streaming response that cancels its request when the client goes away: on a disconnect
    message (ASGI spec >= 2.4, where Starlette itself only notices at the next send) and whenever
    the response ends before the request finished (send failed, task cancelled)."""

    def __init__(self, content, req: Request, scheduler, **kw):
        super().__init__(content, **kw)
        self._req, self._sched = req, scheduler

    def _cancel(self) -> None:
        if self._req.state != "done":
            self._req.cancel()
            self._sched.wake()

    async def __call__(self, scope, receive, send) -> None:
        spec = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        watch = None
        if spec >= (2, 4):
            async def watcher():
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        self._cancel()
                        return

            watch = asyncio.ensure_future(watcher())
        try:
            await super().__call__(scope, receive, send)
        finally:
            if watch is not None:
                watch.cancel()
            self._cancel()


def _err(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def build_app(adapter, scheduler, metrics, config: ServeConfig) -> FastAPI:
    app = FastAPI(title="ninfer-serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    model = config.model_name
    started = int(time.time())

    def reject(endpoint: str, e: P.APIError) -> JSONResponse:
        metrics.requests.labels(endpoint, str(e.status)).inc()
        scheduler.log_line({"event": "rejected", "endpoint": endpoint, "status": e.status, "code": e.code,
                            "param": e.param, "message": e.message[:200]})
        return _err(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_exc(request, exc):  # unknown route / method: an OpenAI-style body too
        code = "not_found" if exc.status_code == 404 else None
        return _err(P.APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code))

    @app.exception_handler(Exception)
    async def _any_exc(request, exc):
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _err(P.APIError(500, f"internal error: {type(exc).__name__}: {msg}", code="internal_error"))

    def check_key(request: HTTPRequest) -> None:
        if config.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise P.APIError(401, "invalid or missing API key (send Authorization: Bearer KEY)",
                             code="invalid_api_key")

    @app.get("/health")
    async def health():
        st = scheduler.snapshot_state()
        ok = st["engine_alive"] and not st["draining"]
        body = {"status": "ok" if ok else ("draining" if st["draining"] else "error"), **st}
        if scheduler.fatal:
            body["error"] = scheduler.fatal
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prom():
        scheduler.snapshot_state()
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models(request: HTTPRequest):
        try:
            check_key(request)
        except P.APIError as e:
            return reject("models", e)
        return {"object": "list", "data": [{"id": model, "object": "model", "created": started,
                                            "owned_by": "ninfer", "max_model_len": adapter.max_context}]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str, request: HTTPRequest):
        try:
            check_key(request)
            if name != model:
                raise P.APIError(404, f"the model '{name}' does not exist (this server serves '{model}')",
                                 param="model", code="model_not_found")
        except P.APIError as e:
            return reject("models", e)
        return {"id": model, "object": "model", "created": started, "owned_by": "ninfer"}

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await _serve(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: HTTPRequest):
        return await _serve(request, "chat.completions")

    def tokenize(p: P.Parsed) -> list[int]:
        if p.messages is not None:
            if not adapter.has_tokenizer or not adapter.has_chat_template:
                raise P.bad("the model has no tokenizer / chat template: use /v1/completions with token ids",
                            "messages")
            try:
                return adapter.encode_chat(p.messages)
            except Exception as exc:  # noqa: BLE001 - the template's own complaint, one line
                raise P.bad(f"chat template: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                            "messages") from None
        if p.prompt_text is not None:
            if not adapter.has_tokenizer:
                raise P.bad("the model has no tokenizer: send 'prompt' as a list of token ids", "prompt")
            return adapter.encode(p.prompt_text)
        bad_ids = [t for t in p.prompt_ids if not 0 <= t < adapter.vocab_size]
        if bad_ids:
            raise P.bad(f"'prompt' token id {bad_ids[0]} is outside the vocabulary [0, {adapter.vocab_size})",
                        "prompt")
        return p.prompt_ids

    def check_context(p: P.Parsed, ids: list[int]) -> int:
        C = adapter.max_context
        if not ids:
            raise P.bad("the prompt is empty after tokenization", "messages" if p.messages is not None else "prompt")
        if len(ids) >= C:
            raise P.bad(f"this model's maximum context length is {C} tokens; the prompt has {len(ids)} tokens "
                        f"(no room for a completion)", "messages" if p.messages is not None else "prompt",
                        "context_length_exceeded")
        if p.max_tokens is None:
            return min(p.default_max_tokens or C, C - len(ids))
        if len(ids) + p.max_tokens > C:
            raise P.bad(f"this model's maximum context length is {C} tokens; the prompt has {len(ids)} tokens and "
                        f"'{p.max_tokens_param}' is {p.max_tokens} ({len(ids) + p.max_tokens} in all)",
                        p.max_tokens_param, "context_length_exceeded")
        return p.max_tokens

    async def _serve(request: HTTPRequest, endpoint: str):
        try:
            check_key(request)
            body = P.parse_json(await request.body())
            p = P.parse_chat(body) if endpoint == "chat.completions" else P.parse_completion(body)
            if p.model != model:
                raise P.APIError(404, f"the model '{p.model}' does not exist (this server serves '{model}')",
                                 param="model", code="model_not_found")
            ids = tokenize(p)
            max_tokens = check_context(p, ids)
        except P.APIError as e:
            return reject(endpoint, e)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Event] = asyncio.Queue()
        rid = ("chatcmpl-" if endpoint == "chat.completions" else "cmpl-") + uuid.uuid4().hex[:24]

        def on_event(ev: Event) -> None:
            loop.call_soon_threadsafe(q.put_nowait, ev)

        req = Request(ids, max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                      seed=p.seed, stop=p.stop, ignore_eos=p.ignore_eos, endpoint=endpoint, on_event=on_event,
                      request_id=rid)
        try:
            scheduler.submit(req)
        except QueueFull as exc:
            return reject(endpoint, P.APIError(429, f"{exc}; retry later", code="queue_full",
                                               headers={"Retry-After": str(config.retry_after_s)}))
        except Draining as exc:
            return reject(endpoint, P.APIError(503, str(exc), code="unavailable", headers={"Retry-After": "5"}))
        if p.stream:
            return _RequestStream(_stream(req, q, p, rid, endpoint), req, scheduler, media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(request, req, q, p, rid, endpoint)

    def _usage(req: Request) -> dict:
        return P.usage(len(req.prompt), len(req.tokens), req.cached_tokens)

    async def _whole(request: HTTPRequest, req: Request, q, p: P.Parsed, rid: str, endpoint: str):
        parts: list[str] = []
        reason = None
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        req.cancel()
                        scheduler.wake()
                        return Response(status_code=499)
                    continue
                if ev.kind == "delta":
                    parts.append(ev.text)
                elif ev.kind == "error":
                    return _err(P.APIError(500, f"the engine failed: {ev.text}", code="engine_error"))
                else:
                    reason = ev.finish_reason
                    break
        except asyncio.CancelledError:
            req.cancel()
            scheduler.wake()
            raise
        text = "".join(parts)
        if endpoint == "chat.completions":
            return P.chat_body(rid, model, text, reason, _usage(req))
        return P.completion_body(rid, model, text, reason, _usage(req))

    def _sse(obj: Any) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    async def _stream(req: Request, q, p: P.Parsed, rid: str, endpoint: str):
        created = int(time.time())
        chat_ = endpoint == "chat.completions"
        done = False
        try:
            if chat_:
                yield _sse(P.chat_chunk(rid, model, {"role": "assistant", "content": ""}, None, created))
            while True:
                ev = await q.get()
                if ev.kind == "delta":
                    if not ev.text:
                        continue
                    yield _sse(P.chat_chunk(rid, model, {"content": ev.text}, None, created) if chat_
                               else P.completion_chunk(rid, model, ev.text, None, created))
                elif ev.kind == "error":
                    yield _sse(P.APIError(500, f"the engine failed: {ev.text}", code="engine_error").body())
                    break
                else:
                    done = True
                    yield _sse(P.chat_chunk(rid, model, {}, ev.finish_reason, created) if chat_
                               else P.completion_chunk(rid, model, "", ev.finish_reason, created))
                    if p.include_usage:
                        yield _sse(P.usage_chunk(rid, model, "chat.completion.chunk" if chat_ else "text_completion",
                                                 _usage(req), created))
                    break
            yield b"data: [DONE]\n\n"
        finally:
            if not done:  # the client went away (generator closed / cancelled) or the engine failed
                req.cancel()
                scheduler.wake()

    return app
