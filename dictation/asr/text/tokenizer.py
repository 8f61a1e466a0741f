"""The checkpoint's own tokenizer: byte-level BPE read with the ``tokenizers`` library (docs/model.md §2, §7).

Free text (the context) is split with the original Qwen regex, not the "fixed Mistral" regex that
transformers 4.57.6 swaps in for some local folders (docs/model.md §2): the model was trained on the
former.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from dictation.asr.errors import ModelError
from dictation.files import is_regular, read_json

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


AUDIO_START, AUDIO_PAD, AUDIO_END = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"


IM_START, IM_END, END_OF_TEXT, ASR_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<asr_text>"


MAX_TOKENIZER_CONFIG_BYTES = 64 << 20  # tokenizer_config.json (Qwen's: 10 kB; some embed a chat template)


MAX_ADDED_ID = 1 << 22  # an added token's id; Qwen's highest is 151704 (a 4M-entry vocabulary would be absurd)


# Tokenizers read, kept for the next load of the same files (an engine loaded again for another variant,
# adapter or device reads the same tokenizer, often from another folder: a quantized variant, a merged
# adapter or a converted copy carries the same files; reading Qwen's 151k-token vocabulary takes 0.3-1 s of
# CPU). Keyed by the vocabulary size asked for and each file's name, size and contents (a BLAKE2 digest:
# about 10 ms for Qwen's 4.5 MB), so a changed, added or removed file is read again, even one edited in
# place with its size and time kept; a failed read is never kept. Nothing changes a tokenizer after it
# is built (encode and decode only), so loads can share one. Each holds about 62 MiB: two are kept (the
# loaded model's, which it holds anyway, and the one before it).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")
TOKENIZERS_KEPT = 2
_kept: OrderedDict[tuple, tuple[Tokenizer, tuple[str, ...]]] = OrderedDict()
_kept_lock = threading.Lock()


def load_tokenizer(folder: Path, vocab_size: int | None = None) -> tuple[Tokenizer, list[str]]:
    """Read ``tokenizer.json`` if present, else build the BPE from ``vocab.json`` + ``merges.txt``.

    Added tokens are taken from ``tokenizer_config.json`` at their listed ids; ids missing from the
    list get placeholders so that every later id stays where the checkpoint expects it. An id at or
    beyond ``vocab_size`` (the model's embedding rows), or absurdly large without it, is refused.
    Every problem is a ModelError naming the file. The same files, in this folder or another, give
    the tokenizer read before (``TOKENIZERS_KEPT`` of them are kept).
    """
    folder = Path(folder)
    key = _files_key(folder, vocab_size)
    with _kept_lock:
        hit = _kept.get(key) if key is not None else None
        if hit is not None:
            _kept.move_to_end(key)
            return hit[0], list(hit[1])
    tok, strings = _read_tokenizer(folder, vocab_size)
    if key is None:
        return tok, strings
    with _kept_lock:
        _kept[key] = (tok, tuple(strings))
        while len(_kept) > TOKENIZERS_KEPT:
            _kept.popitem(last=False)
    return tok, strings


MAX_KEYED_BYTES = 256 << 20  # a tokenizer file larger than this is read without the cache (no digest)


def _files_key(folder: Path, vocab_size: int | None) -> tuple | None:
    """The cache key of ``folder``'s tokenizer files; None where one is not a regular file of at most
    MAX_KEYED_BYTES (a FIFO is never opened here: reading the tokenizer names the problem)."""
    files = []
    for name in TOKENIZER_FILES:
        path = folder / name
        try:
            st = os.stat(path)
        except OSError:
            files.append((name, None))
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_KEYED_BYTES:
            return None
        digest = hashlib.blake2b(digest_size=16)
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            return None
        files.append((name, st.st_size, digest.digest()))
    return vocab_size, tuple(files)


def _read_tokenizer(folder: Path, vocab_size: int | None) -> tuple[Tokenizer, list[str]]:
    config_path = folder / "tokenizer_config.json"
    added_decoder = _added_tokens(config_path, MAX_ADDED_ID if vocab_size is None else min(vocab_size, MAX_ADDED_ID))

    json_path = folder / "tokenizer.json"
    if json_path.exists():
        _need_regular(json_path)
        try:
            tok = Tokenizer.from_file(str(json_path))
        except Exception as exc:  # the tokenizers library raises plain Exception subclasses
            raise ModelError(f"{json_path}: unreadable ({_first_line(exc)})") from None
        # Use the original Qwen split even if a saved file carries another regex (docs/model.md §2).
        tok.pre_tokenizer = _qwen_pre_tokenizer()
    else:
        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        for path in (vocab, merges):
            if not path.exists():
                raise ModelError(f"{path}: missing (the model folder needs tokenizer.json or vocab.json + merges.txt)")
            _need_regular(path)
        try:
            bpe = models.BPE.from_file(str(vocab), str(merges))
        except Exception as exc:  # garbage in either file: the library says which line, not which file
            raise ModelError(f"{vocab} / {merges}: not a BPE vocabulary and merge list ({_first_line(exc)})") from None
        tok = byte_level_bpe(bpe)

    strings: list[str] = []
    if added_decoder:
        next_id = tok.get_vocab_size(with_added_tokens=True)
        for tid in sorted(added_decoder):
            entry = added_decoder[tid]
            content = entry["content"]
            strings.append(content)
            existing = tok.token_to_id(content)
            if existing is not None:
                if existing != tid:
                    raise ModelError(f"{config_path}: {content} is id {existing} in the vocabulary, {tid} here")
                continue
            if next_id < tid:  # keep later ids aligned
                tok.add_special_tokens(
                    [AddedToken(f"<|unused_{i}|>", special=True, normalized=False) for i in range(next_id, tid)]
                )
                next_id = tid
            token = AddedToken(
                content,
                special=bool(entry.get("special", False)),
                normalized=bool(entry.get("normalized", False)),
                lstrip=bool(entry.get("lstrip", False)),
                rstrip=bool(entry.get("rstrip", False)),
                single_word=bool(entry.get("single_word", False)),
            )
            if token.special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            if tok.token_to_id(content) != tid:
                raise ModelError(f"{config_path}: could not place {content} at id {tid}")
            next_id = tid + 1
    return tok, strings


def _added_tokens(config_path: Path, limit: int) -> dict[int, dict]:
    """``added_tokens_decoder`` of tokenizer_config.json (id -> entry with a string ``content``), checked."""
    if not config_path.exists():
        return {}
    try:
        raw = read_json(config_path, MAX_TOKENIZER_CONFIG_BYTES)
    except ValueError as exc:
        raise ModelError(f"{config_path}: {exc}") from None
    except OSError as exc:
        raise ModelError(f"{config_path}: unreadable ({exc.strerror or exc})") from None
    table = raw.get("added_tokens_decoder") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(table or {}, dict):
        raise ModelError(f"{config_path}: not a tokenizer config (expected an object with added_tokens_decoder)")
    added = {}
    for key, entry in (table or {}).items():
        if not key.isdigit() or not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise ModelError(f"{config_path}: added_tokens_decoder entry {key[:40]!r} is not an id with a content")
        if int(key) >= limit:
            raise ModelError(f"{config_path}: added token id {key} is beyond the model's vocabulary of {limit}")
        added[int(key)] = entry
    return added


def _need_regular(path: Path) -> None:
    if not is_regular(path):
        raise ModelError(f"{path}: not a regular file (a FIFO, socket, device or folder)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def byte_level_bpe(model: models.BPE) -> Tokenizer:
    """A Qwen byte-level BPE tokenizer around ``model``: NFC, the original Qwen split, byte-level decoding.

    What ``load_tokenizer`` builds from ``vocab.json`` + ``merges.txt``; GGUF files carry the same
    vocabulary and merges in their metadata (``dictation.asr.checkpoints.gguf.build``).
    """
    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return tok


def _qwen_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
