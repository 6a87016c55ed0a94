"""Reading a Hugging Face checkpoint directory: `HFCheckpoint` (config.json checked, tensors read
lazily one at a time through safetensors), and the tokenizer-derived inputs of a contract:
`tokenizer_ids` (id count, special ids) and `draft_token_ids_from_ranking` (the draft-head id map).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import ConvertError
from .mapping import _one_line, text_geometry

# ----------------------------------------------------------------------------------------------
# checkpoint reading

FRONTEND_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                  "preprocessor_config.json", "video_preprocessor_config.json")
MODEL_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
ARCHITECTURES = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
                 "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"}


class HFCheckpoint:
    """A Hugging Face checkpoint directory read lazily, one tensor at a time.

    `config` (the raw config.json), `text_config` (the text part; top-level `tie_word_embeddings`
    merged in for multimodal configs), `vision_config` (or None), `names` (all tensor names),
    `shape(name)`, `dtype(name)`, `get(name)`, `resources()` → [(object name, path)] in NInfer order.
    """

    def __init__(self, hf_dir):
        import json
        from pathlib import Path

        self.dir = Path(hf_dir)
        if not self.dir.is_dir():
            raise ConvertError(f"{self.dir}: not a directory")
        cfg_path = self.dir / "config.json"
        if not cfg_path.is_file():
            raise ConvertError(f"{cfg_path}: missing (not a Hugging Face checkpoint directory)")
        try:
            self.config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConvertError(f"{cfg_path}: cannot parse: {_one_line(exc)}") from None
        if not isinstance(self.config, dict):
            raise ConvertError(f"{cfg_path}: not a JSON object")
        self.config_path = cfg_path
        model_type = self.config.get("model_type")
        archs = self.config.get("architectures") or []
        if model_type is None and not archs:
            raise ConvertError(f"{cfg_path}: missing field 'model_type'")
        if model_type is not None and model_type not in MODEL_TYPES:
            raise ConvertError(f"{cfg_path}: model_type {model_type!r} is not a Qwen3.5/3.6 hybrid "
                               f"(expected one of {sorted(MODEL_TYPES)})")
        bad = [a for a in archs if a not in ARCHITECTURES]
        if bad:
            raise ConvertError(f"{cfg_path}: unsupported architecture {bad[0]!r} "
                               f"(expected one of {sorted(ARCHITECTURES)})")
        if "text_config" in self.config:
            tc = self.config["text_config"]
            if not isinstance(tc, dict):
                raise ConvertError(f"{cfg_path}: field 'text_config' is not an object")
            self.text_config = dict(tc)
            if "tie_word_embeddings" in self.config and "tie_word_embeddings" not in tc:
                self.text_config["tie_word_embeddings"] = self.config["tie_word_embeddings"]
            self.config_where = f"{cfg_path}: text_config"
        else:
            self.text_config = dict(self.config)
            self.config_where = str(cfg_path)
        self.vision_config = self.config.get("vision_config")
        self.geometry = text_geometry(self.text_config, where=self.config_where)
        self._index = self._read_index()
        self.names = set(self._index)
        self._handles: dict = {}

    def _read_index(self) -> dict[str, str]:
        import json

        from safetensors import safe_open

        idx_path = self.dir / "model.safetensors.index.json"
        if idx_path.is_file():
            try:
                wm = json.loads(idx_path.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ConvertError(f"{idx_path}: cannot read weight_map: {_one_line(exc)}") from None
            for f in sorted(set(wm.values())):
                if not (self.dir / f).is_file():
                    raise ConvertError(f"{idx_path}: shard '{f}' is missing")
            return dict(wm)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{self.dir}: no model.safetensors(.index.json) found")
        index: dict[str, str] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        index[k] = f.name
            except Exception as exc:  # safetensors raises its own error types
                raise ConvertError(f"{f}: cannot open safetensors: {_one_line(exc)}") from None
        return index

    def _handle(self, fname: str):
        from safetensors import safe_open

        h = self._handles.get(fname)
        if h is None:
            path = self.dir / fname
            try:
                h = safe_open(str(path), framework="pt")
            except Exception as exc:
                raise ConvertError(f"{path}: cannot open safetensors: {_one_line(exc)}") from None
            self._handles[fname] = h
        return h

    def _file_of(self, name: str) -> str:
        try:
            return self._index[name]
        except KeyError:
            raise ConvertError(f"{self.dir}: missing tensor '{name}'") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._file_of(name)).get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        code = self._handle(self._file_of(name)).get_slice(name).get_dtype()
        return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                "I32": torch.int32, "I64": torch.int64}.get(code, torch.float32)

    def get(self, name: str) -> torch.Tensor:
        fname = self._file_of(name)
        try:
            return self._handle(fname).get_tensor(name)
        except ConvertError:
            raise
        except Exception as exc:
            raise ConvertError(f"{self.dir / fname}: cannot read tensor '{name}': {_one_line(exc)}") from None

    def resources(self) -> list[tuple[str, "object"]]:
        """`[("frontend/<file>", path)]` for the frontend files present, in NInfer order."""
        return [(f"frontend/{f}", self.dir / f) for f in FRONTEND_FILES if (self.dir / f).is_file()]

    def has_vision(self) -> bool:
        return any(n.startswith("model.visual.") for n in self.names)

    def has_mtp(self) -> bool:
        return any(n.startswith("mtp.") for n in self.names)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SafetensorsDir(HFCheckpoint):
    """A directory of safetensors files read lazily like a checkpoint, without config checks (e.g.
    a DFlash companion: `names`, `shape`, `dtype`, `get`)."""

    def __init__(self, path):  # noqa: super().__init__ would demand a Qwen3.5 config.json
        from pathlib import Path

        self.dir = Path(path)
        if not self.dir.is_dir():
            raise ConvertError(f"{self.dir}: not a directory")
        self._index = self._read_index()
        self.names = set(self._index)
        self._handles = {}


def _json_file(path) -> dict:
    import json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot parse JSON: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return data


def tokenizer_ids(hf_dir) -> tuple[int | None, list[int]]:
    """(tokenizer-addressable id count or None, ascending special ids) from tokenizer.json's vocab
    and added tokens merged with tokenizer_config.json's added_tokens_decoder."""
    from pathlib import Path
    d = Path(hf_dir)
    top = -1
    special: dict[int, bool] = {}
    tj = d / "tokenizer.json"
    if tj.is_file():
        data = _json_file(tj)
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and vocab:
            top = max(top, max(int(i) for i in vocab.values()))
        elif isinstance(vocab, list) and vocab:
            top = max(top, len(vocab) - 1)
        for tok in data.get("added_tokens") or []:
            i = int(tok["id"])
            top = max(top, i)
            special[i] = bool(tok.get("special", False))
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        for key, tok in (_json_file(tc).get("added_tokens_decoder") or {}).items():
            i = int(key)
            top = max(top, i)
            if isinstance(tok, dict):
                special[i] = bool(tok.get("special", special.get(i, False)))
    return (top + 1 if top >= 0 else None), sorted(i for i, s in special.items() if s)


def draft_token_ids_from_ranking(path, *, vocab_rows: int, token_ids: int, draft_rows: int,
                                 special_ids: Iterable[int]) -> torch.Tensor:
    """The optimized draft-head id map (artifact doc §11.4) from a little-endian I64 count file
    (row width `vocab_rows`, row 0 used)."""
    import numpy as np
    from pathlib import Path
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConvertError(f"{p}: cannot read draft ranking: {exc.strerror or exc}") from None
    if len(raw) == 0 or len(raw) % (8 * vocab_rows):
        raise ConvertError(f"{p}: draft ranking is {len(raw)} bytes, not a whole number of I64 rows "
                           f"of width {vocab_rows}")
    counts = np.frombuffer(raw, dtype="<i8", count=vocab_rows).astype(np.int64)[:token_ids]
    forced = sorted({int(i) for i in special_ids if 0 <= int(i) < token_ids})
    if draft_rows > token_ids or len(forced) > draft_rows:
        raise ConvertError(f"{p}: cannot select {draft_rows} draft ids from {token_ids} tokens "
                           f"({len(forced)} forced special ids)")
    ids = np.arange(token_ids, dtype=np.int64)
    order = np.lexsort((ids, -counts))  # descending count, ascending id on ties
    forced_mask = np.zeros(token_ids, dtype=bool)
    forced_mask[forced] = True
    chosen = order[~forced_mask[order]][: draft_rows - len(forced)]
    merged = np.concatenate([chosen, np.asarray(forced, dtype=np.int64)])
    merged = merged[np.argsort(-counts[merged], kind="stable")]
    if len(merged) != draft_rows or len(np.unique(merged)) != draft_rows:
        raise ConvertError(f"{p}: draft selection gave {len(np.unique(merged))} unique ids, "
                           f"need {draft_rows}")
    return torch.from_numpy(merged.astype(np.int32))
