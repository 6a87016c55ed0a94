"""OpenAI request validation and response / error bodies.

Bodies are parsed by hand (not by pydantic models) so every rejection is one OpenAI-style error
naming the parameter: `{"error": {"message", "type", "param", "code"}}` with status 400, never
FastAPI's 422. Fields clients commonly send with neutral values (presence_penalty 0, user, ...)
are accepted; features this server does not have (logprobs, tools, n > 1, ...) are refused.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

SEED_MAX = 2**63 - 1


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                              429: "rate_limit_error", 503: "server_error"}.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class Parsed:
    endpoint: str  # "completions" | "chat.completions"
    model: str
    prompt_ids: list[int] | None = None
    prompt_text: str | None = None
    messages: list[dict] | None = None
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    default_max_tokens: int | None = None  # when max_tokens is absent (None: the rest of the context)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8") if raw else "")
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    return body


def _num(body, key, lo, hi, default, *, lo_open=False):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{key}' must be a number, got {json.dumps(v)[:60]}", key)
    if v < lo or (lo_open and v == lo) or v > hi:
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad(f"'{key}' must be in {rng}, got {v}", key)
    return float(v)


def _int(body, key, lo, hi, default):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise bad(f"'{key}' must be an integer, got {json.dumps(v)[:60]}", key)
    if not lo <= v <= hi:
        raise bad(f"'{key}' must be in [{lo}, {hi}], got {v}", key)
    return v


def _bool(body, key, default=False):
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be a boolean, got {json.dumps(v)[:60]}", key)
    return v


def _refuse_unsupported(body: dict, chat: bool) -> None:
    zero_ok = ("presence_penalty", "frequency_penalty")
    for k in zero_ok:
        v = body.get(k)
        if v not in (None, 0, 0.0):
            raise bad(f"'{k}' is not supported by this server (only 0)", k, "unsupported_parameter")
    off = ["logit_bias", "tools", "functions", "tool_choice", "function_call", "response_format", "suffix"] if chat \
        else ["logit_bias", "suffix"]
    for k in off:
        v = body.get(k)
        if v not in (None, [], {}, "none", ""):
            raise bad(f"'{k}' is not supported by this server", k, "unsupported_parameter")
    lp = body.get("logprobs")
    if lp not in (None, False, 0):
        raise bad("'logprobs' is not supported by this server", "logprobs", "unsupported_parameter")
    if body.get("top_logprobs") not in (None, 0):
        raise bad("'top_logprobs' is not supported by this server", "top_logprobs", "unsupported_parameter")
    if not chat and body.get("echo") not in (None, False):
        raise bad("'echo' is not supported by this server", "echo", "unsupported_parameter")
    if not chat and body.get("best_of") not in (None, 1):
        raise bad("'best_of' must be 1", "best_of")


def _common(body: dict, p: Parsed) -> None:
    n = _int(body, "n", 1, 1 << 30, 1)
    if n != 1:
        raise bad(f"'n' must be 1 (one choice per request), got {n}", "n")
    p.temperature = _num(body, "temperature", 0.0, 2.0, 1.0)
    p.top_p = _num(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
    tk = _int(body, "top_k", -1, 1 << 30, 0)
    p.top_k = 0 if tk == -1 else tk
    p.seed = _int(body, "seed", -(2**63), 2**64 - 1, None)
    if p.seed is not None:
        p.seed %= 2**63
    stop = body.get("stop")
    if stop is None:
        p.stop = []
    elif isinstance(stop, str):
        p.stop = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 16:
            raise bad(f"'stop' takes at most 16 strings, got {len(stop)}", "stop")
        p.stop = [s for s in stop if s]
    else:
        raise bad("'stop' must be a string or a list of strings", "stop")
    p.stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        if not p.stream:
            raise bad("'stream_options' needs 'stream': true", "stream_options")
        iu = so.get("include_usage")
        if iu is not None and not isinstance(iu, bool):
            raise bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
        p.include_usage = bool(iu)
    p.ignore_eos = _bool(body, "ignore_eos")


def _model(body: dict) -> str:
    m = body.get("model")
    if m is None:
        raise bad("'model' is required", "model", "missing_required_parameter")
    if not isinstance(m, str):
        raise bad("'model' must be a string", "model")
    return m


def parse_completion(body: dict) -> Parsed:
    p = Parsed("completions", _model(body))
    _refuse_unsupported(body, chat=False)
    if "prompt" not in body:
        raise bad("'prompt' is required", "prompt", "missing_required_parameter")
    pr = body["prompt"]
    if isinstance(pr, list) and len(pr) == 1 and isinstance(pr[0], (str, list)):
        pr = pr[0]  # a batch of one
    if isinstance(pr, str):
        if not pr:
            raise bad("'prompt' is empty", "prompt")
        p.prompt_text = pr
    elif isinstance(pr, list) and pr and all(isinstance(v, int) and not isinstance(v, bool) for v in pr):
        p.prompt_ids = [int(v) for v in pr]
    elif isinstance(pr, list) and len(pr) > 1 and all(isinstance(v, (str, list)) for v in pr):
        raise bad(f"'prompt' holds {len(pr)} prompts; this server takes one per request", "prompt")
    else:
        raise bad("'prompt' must be a non-empty string or a non-empty list of token ids", "prompt")
    p.max_tokens = _int(body, "max_tokens", 1, 1 << 30, None)
    p.default_max_tokens = 16  # OpenAI's default for completions
    _common(body, p)
    return p


def _content(v, i: int) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    if isinstance(v, list):
        out = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"'messages[{i}].content' parts must be {{\"type\": \"text\", \"text\": ...}} "
                          f"(text only)", f"messages[{i}].content")
            out.append(part["text"])
        return "".join(out)
    raise bad(f"'messages[{i}].content' must be a string or a list of text parts", f"messages[{i}].content")


def parse_chat(body: dict) -> Parsed:
    p = Parsed("chat.completions", _model(body))
    _refuse_unsupported(body, chat=True)
    msgs = body.get("messages")
    if msgs is None:
        raise bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"'messages[{i}]' must be an object", f"messages[{i}]")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise bad(f"'messages[{i}].role' must be system, developer, user, assistant or tool, got "
                      f"{json.dumps(role)[:40]}", f"messages[{i}].role")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m.get("content"), i)})
    p.messages = out
    mt = _int(body, "max_completion_tokens", 1, 1 << 30, None)
    if mt is not None:
        p.max_tokens, p.max_tokens_param = mt, "max_completion_tokens"
    else:
        p.max_tokens = _int(body, "max_tokens", 1, 1 << 30, None)
    _common(body, p)
    return p


# ---------------------------------------------------------------------- responses
def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion_body(rid: str, model: str, text: str, reason: str | None, u: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}], "usage": u}


def completion_chunk(rid: str, model: str, text: str, reason: str | None, created: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}


def chat_body(rid: str, model: str, text: str, reason: str | None, u: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": reason}], "usage": u}


def chat_chunk(rid: str, model: str, delta: dict, reason: str | None, created: int) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}


def usage_chunk(rid: str, model: str, obj: str, u: dict, created: int) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": u}
