"""The artifact's frontend resources: tokenizer, chat template, stop ids.

- `frontend/tokenizer.json` (tokenizers), `frontend/tokenizer_config.json` (bos/eos strings for the
  template), `frontend/chat_template.jinja` (jinja2, sandboxed), `frontend/generation_config.json`
  (`eos_token_id`: int or list -> stop ids). Every piece is optional: without a tokenizer the
  runtime works on token ids only.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from .errors import NinferRuntimeError

TOKENIZER = "frontend/tokenizer.json"
TOKENIZER_CONFIG = "frontend/tokenizer_config.json"
CHAT_TEMPLATE = "frontend/chat_template.jinja"
GENERATION_CONFIG = "frontend/generation_config.json"


class FrontendError(NinferRuntimeError):
    pass


def _json(art, name: str) -> dict | None:
    if not art.has_resource(name):
        return None
    try:
        v = json.loads(art.resource_bytes(name).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrontendError(f"artifact resource {name}: invalid JSON: {exc}") from None
    return v if isinstance(v, dict) else None


def stop_ids_from(gen_config: dict | None) -> tuple[int, ...]:
    if not gen_config:
        return ()
    eos = gen_config.get("eos_token_id")
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    if isinstance(eos, list) and all(isinstance(e, int) for e in eos):
        return tuple(eos)
    raise FrontendError(f"{GENERATION_CONFIG}: eos_token_id must be an int or a list of ints, got {eos!r}")


class Frontend:
    def __init__(self, tokenizer=None, chat_template: str | None = None, tokenizer_config: dict | None = None,
                 stop_ids: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.tokenizer_config = tokenizer_config or {}
        self.stop_ids = tuple(stop_ids)
        self._template = None

    @classmethod
    def from_artifact(cls, art) -> "Frontend":
        tok = None
        if art.has_resource(TOKENIZER):
            from tokenizers import Tokenizer

            try:
                tok = Tokenizer.from_str(art.resource_bytes(TOKENIZER).decode("utf-8"))
            except Exception as exc:
                # token ids still work; text in or out fails later with this reason
                import warnings

                warnings.warn(f"artifact resource {TOKENIZER}: cannot load tokenizer ({exc}); "
                              "only token ids can be used", stacklevel=2)
                tok = None
        tmpl = art.resource_bytes(CHAT_TEMPLATE).decode("utf-8") if art.has_resource(CHAT_TEMPLATE) else None
        return cls(tok, tmpl, _json(art, TOKENIZER_CONFIG), stop_ids_from(_json(art, GENERATION_CONFIG)))

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer is not None

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise FrontendError("the artifact has no tokenizer (frontend/tokenizer.json): pass token ids instead of text")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self._need_tokenizer()
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        self._need_tokenizer()
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _special(self, key: str) -> str:
        v = self.tokenizer_config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else ""

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **extra) -> str:
        if self.chat_template is None:
            raise FrontendError("the artifact has no chat template (frontend/chat_template.jinja)")
        if self._template is None:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(msg):
                raise FrontendError(f"chat template: {msg}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda v, indent=None, ensure_ascii=False: json.dumps(
                v, indent=indent, ensure_ascii=ensure_ascii)
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as exc:
                raise FrontendError(f"chat template: {exc}") from None
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self._special("bos_token"), eos_token=self._special("eos_token"),
                                         **extra)
        except TemplateError as exc:
            raise FrontendError(f"chat template: {exc}") from None

    def encode_chat(self, prompt: str | list[dict[str, Any]]) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.encode(self.render_chat(messages), add_special_tokens=False)


class StreamDecoder:
    """Incremental detokenisation: `push(id) -> new text` (holds back incomplete UTF-8)."""

    def __init__(self, frontend: Frontend, *, skip_special_tokens: bool = False):
        self.f = frontend
        self.ids: list[int] = []
        self.sent = ""
        self.skip = skip_special_tokens

    def push(self, token: int) -> str:
        if self.f.tokenizer is None:
            return ""
        self.ids.append(int(token))
        text = self.f.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return ""
        new = text[len(self.sent):] if text.startswith(self.sent) else text
        self.sent = text
        return new

    def flush(self) -> str:
        """The text still held back (end of the sequence): everything not yet returned."""
        if self.f.tokenizer is None:
            return ""
        text = self.f.decode(self.ids, skip_special_tokens=self.skip)
        new = text[len(self.sent):] if text.startswith(self.sent) else text
        self.sent = text
        return new
