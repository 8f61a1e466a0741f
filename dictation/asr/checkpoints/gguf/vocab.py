"""The tokenizer a GGUF file carries under ``tokenizer.ggml.*``, rebuilt as our byte-level BPE."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, models

from dictation.asr.checkpoints.gguf.reader import GgufFile
from dictation.asr.errors import ModelError
from dictation.asr.text.tokenizer import END_OF_TEXT, byte_level_bpe

log = logging.getLogger(__name__)

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Ids the app needs, patched in where a file without token types left "[PAD<id>]" (older CrispASR
# files did, their runtime patches the same ids): id -> (content, special).
_FALLBACK_ADDED = {
    151643: ("<|endoftext|>", True),
    151644: ("<|im_start|>", True),
    151645: ("<|im_end|>", True),
    151669: ("<|audio_start|>", True),
    151670: ("<|audio_end|>", True),
    151676: ("<|audio_pad|>", True),
    151704: ("<asr_text>", False),
    151705: ("<timestamp>", True),
}
_SPECIAL_WITHOUT_BARS = frozenset({"<timestamp>"})


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``)."""

    source: Path
    model: str  # "gpt2" = byte-level BPE
    tokens: list[str]
    token_types: list[int] | None  # llama.cpp's token types; None if the file has none
    merges: list[str]  # "left right", rank order
    eos_id: int | None

    @classmethod
    def from_metadata(cls, gguf: GgufFile) -> GgufVocab:
        meta = gguf.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ModelError(f"{gguf.path}: no tokenizer in the file (tokenizer.ggml.tokens is missing)")
        types = meta.get("tokenizer.ggml.token_type")
        merges = meta.get("tokenizer.ggml.merges") or []
        if not all(isinstance(t, str) for t in tokens) or not isinstance(merges, list):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.tokens / merges are not lists of strings")
        if types is not None and (not isinstance(types, list) or not all(type(t) is int for t in types)):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.token_type is not a list of integers")
        if types is not None and len(types) != len(tokens):
            raise ModelError(f"{gguf.path}: {len(types)} token types for {len(tokens)} tokens")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        if eos is not None and (type(eos) is not int or not 0 <= eos < len(tokens)):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.eos_token_id {eos!r} is not a token id")
        return cls(
            source=gguf.path,
            model=str(meta.get("tokenizer.ggml.model", "")),
            tokens=tokens,
            token_types=types,
            merges=list(merges),
            eos_id=eos,
        )

    def token_id(self, content: str) -> int | None:
        try:
            return self.tokens.index(content)
        except ValueError:
            return None

    def build(self) -> tuple[Tokenizer, list[str]]:
        """The byte-level BPE tokenizer with every added token at its id, and the added strings.

        Regular tokens (type NORMAL/BYTE) must come first and be contiguous (as in every Qwen file);
        CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens (``<asr_text>``
        survives decoding), UNUSED ``[PAD<id>]`` slots placeholders (dropped after the last real one).
        Without token types, the regular tokens are those before ``<|endoftext|>`` / the first
        ``[PAD<id>]``, and an added token is special if it reads ``<|...|>``.
        """
        src = self.source
        if self.model != "gpt2":
            raise ModelError(
                f"{src}: tokenizer.ggml.model is {self.model!r}; only Qwen's byte-level BPE ('gpt2') is supported"
            )
        tokens, types = self.tokens, self.token_types
        regular = (TOKEN_NORMAL, TOKEN_BYTE)

        def placeholder(i: int) -> bool:
            return tokens[i] == f"[PAD{i}]"

        if types is None:
            n_regular = next((i for i in range(len(tokens)) if placeholder(i) or tokens[i] == END_OF_TEXT), len(tokens))
        else:
            n_regular = next((i for i, t in enumerate(types) if t not in regular), len(tokens))
            stray = next((i for i in range(n_regular, len(tokens)) if types[i] in regular), None)
            if stray is not None:
                raise ModelError(
                    f"{src}: regular token {tokens[stray]!r} (id {stray}) after the added tokens; "
                    "this vocabulary layout is not supported"
                )
        vocab = {tokens[i]: i for i in range(n_regular)}
        if len(vocab) != n_regular:
            raise ModelError(f"{src}: the vocabulary lists a token twice")
        merges = []
        for line in self.merges:
            left, sep, right = line.partition(" ") if isinstance(line, str) else ("", "", "")
            if not sep or not left or not right:
                raise ModelError(f"{src}: malformed BPE merge {line!r}")
            merges.append((left, right))
        tok = byte_level_bpe(models.BPE(vocab=vocab, merges=merges))

        entries: list[tuple[int, str, bool, bool]] = []  # (id, content, special, is_placeholder)
        for i in range(n_regular, len(tokens)):
            content = tokens[i]
            if placeholder(i) and i in _FALLBACK_ADDED:
                content, special = _FALLBACK_ADDED[i]
                log.warning("%s: token %d is a placeholder; using %s", src, i, content)
                entries.append((i, content, special, False))
            elif placeholder(i) or (types is not None and types[i] == TOKEN_UNUSED):
                entries.append((i, content, True, True))
            elif types is None:
                special = (content.startswith("<|") and content.endswith("|>")) or content in _SPECIAL_WITHOUT_BARS
                entries.append((i, content, special, False))
            else:
                entries.append((i, content, types[i] != TOKEN_USER_DEFINED, False))
        while entries and entries[-1][3]:
            entries.pop()
        for i, content, special, _ in entries:
            token = AddedToken(content, special=special, normalized=False)
            if special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            if tok.token_to_id(content) != i:
                raise ModelError(f"{src}: could not place added token {content!r} at id {i}")
        return tok, [content for _, content, _, _ in entries]


# --- writing: the vocabulary as llama.cpp's converter stores it ------------------------------------------------
# (ggml-org/llama.cpp ``conversion/base.py`` ``get_vocab_base`` / ``does_token_look_special`` and
# ``gguf-py/gguf/vocab.py`` ``SpecialVocab``; ``conversion/qwen3vl.py`` ``Qwen3ASRTextModel.set_vocab``.)

IM_END = "<|im_end|>"
# The chat template llama.cpp's converter writes for Qwen3-ASR in place of the model's own (plain ChatML:
# llama.cpp's mtmd puts the audio markers into the prompt itself); docs/engine.md, "GGUF".
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def looks_special(content: str) -> bool:
    """An added token llama.cpp's converter stores as CONTROL although the tokenizer does not mark it special
    (``<|fim_prefix|>`` ... ``<|file_sep|>`` in Qwen's vocabulary)."""
    return (
        content in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (content.startswith("<|") and content.endswith("|>"))
        or (content.startswith("<｜") and content.endswith("｜>"))
        or (content.startswith("<unused") and content.endswith(">"))
    )


def vocab_metadata(tokenizer: Tokenizer, vocab_size: int, folder: Path | None = None) -> dict[str, Any]:
    """``tokenizer.ggml.*`` for a byte-level BPE: every id up to ``vocab_size`` (``[PAD<id>]`` where the
    tokenizer has none), llama.cpp's token types, the merges in rank order, ``<|im_end|>`` as EOS and BOS,
    the other special ids and add_*_token flags as llama.cpp's converter reads them from ``folder``."""
    model = json.loads(tokenizer.to_str())["model"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [TOKEN_UNUSED] * vocab_size
    for token, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = token, TOKEN_NORMAL
    for i, added in tokenizer.get_added_tokens_decoder().items():
        if i < vocab_size and not added.content.startswith("<|unused_"):
            tokens[i] = added.content
            special = added.special or looks_special(added.content)
            types[i] = TOKEN_CONTROL if special else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    ids, add = _special_tokens(folder, vocab_size) if folder is not None else ({}, {})
    eos = tokenizer.token_to_id(IM_END)
    if eos is not None and eos < vocab_size:  # Qwen3ASRTextModel.set_vocab: <|im_end|> is BOS and EOS
        ids |= {"bos": eos, "eos": eos}
    for kind in _SPECIAL_KINDS:
        if kind in ids:
            meta[f"tokenizer.ggml.{'padding' if kind == 'pad' else kind}_token_id"] = ids[kind]
    for kind, value in add.items():
        meta[f"tokenizer.ggml.add_{kind}_token"] = value
    return meta


def _special_tokens(folder: Path, vocab_size: int) -> tuple[dict[str, int], dict[str, bool]]:
    """Special ids (``bos``, ``pad``, ...) and add_*_token flags as gguf-py's ``SpecialVocab`` reads them: the
    ``<kind>_token`` strings of tokenizer_config.json resolved through tokenizer.json's added tokens (only where
    that file exists), then ``<kind>_token_id`` integers of config.json (top level or ``text_config``); the
    flags from tokenizer.json's ByteLevel post-processor (both false) and tokenizer_config.json."""

    def load(name: str) -> dict:
        path = folder / name
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: unreadable ({exc})") from None
        return data if isinstance(data, dict) else {}

    tokenizer_json, tokenizer_config = load("tokenizer.json"), load("tokenizer_config.json")
    config = load("config.json")
    ids: dict[str, int] = {}
    add: dict[str, bool] = {}
    processor = tokenizer_json.get("post_processor") or {}
    for part in processor.get("processors", [processor]) if isinstance(processor, dict) else []:
        if isinstance(part, dict) and part.get("type") == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
    added = tokenizer_json.get("added_tokens") or []

    def put(kind: str, tid: Any) -> None:
        if type(tid) is int and 0 <= tid < vocab_size and kind not in ids:
            ids[kind] = tid

    if tokenizer_config:
        for kind in _SPECIAL_KINDS:
            flag = tokenizer_config.get(f"add_{kind}_token")
            if isinstance(flag, bool) and kind not in add:
                add[kind] = flag
            entry = tokenizer_config.get(f"{kind}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                match = [a.get("id") for a in added if isinstance(a, dict) and a.get("content") == content]
                put(kind, match[0] if match else None)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for kind in _SPECIAL_KINDS:
        tid = config.get(f"{kind}_token_id")
        put(kind, tid if tid is not None else text_config.get(f"{kind}_token_id"))
    return ids, add
