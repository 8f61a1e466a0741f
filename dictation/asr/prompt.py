"""Tokenizer, chat template, context, forced language and output parsing (spec §6).

The tokenizer is the checkpoint's own byte-level BPE, read with the ``tokenizers`` library. Free
text (the context) is split with the original Qwen regex, not the "fixed Mistral" regex that
transformers 4.57.6 swaps in for some local folders (spec §2.4): the model was trained on the
former.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from dictation.asr.errors import LanguageError, ModelError
from dictation.asr.files import is_regular, read_json

log = logging.getLogger(__name__)

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (name, ISO code) of the 30 languages a transcription can be forced to (spec §6.5).
LANGUAGES: tuple[tuple[str, str], ...] = (
    ("Chinese", "zh"),
    ("English", "en"),
    ("Cantonese", "yue"),
    ("Arabic", "ar"),
    ("German", "de"),
    ("French", "fr"),
    ("Spanish", "es"),
    ("Portuguese", "pt"),
    ("Indonesian", "id"),
    ("Italian", "it"),
    ("Korean", "ko"),
    ("Russian", "ru"),
    ("Thai", "th"),
    ("Vietnamese", "vi"),
    ("Japanese", "ja"),
    ("Turkish", "tr"),
    ("Hindi", "hi"),
    ("Malay", "ms"),
    ("Dutch", "nl"),
    ("Swedish", "sv"),
    ("Danish", "da"),
    ("Finnish", "fi"),
    ("Polish", "pl"),
    ("Czech", "cs"),
    ("Filipino", "fil"),
    ("Persian", "fa"),
    ("Greek", "el"),
    ("Romanian", "ro"),
    ("Hungarian", "hu"),
    ("Macedonian", "mk"),
)
_BY_KEY = {key.lower(): name for name, code in LANGUAGES for key in (name, code)}

AUDIO_START, AUDIO_PAD, AUDIO_END = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"
IM_START, IM_END, END_OF_TEXT, ASR_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<asr_text>"


def normalize_language(language: str | None) -> str | None:
    """A language name or ISO code, any case → canonical name; None, "" or "auto" → None."""
    if language is None or not language.strip() or language.strip().lower() == "auto":
        return None
    name = _BY_KEY.get(language.strip().lower())
    if name is None:
        choices = ", ".join(f"{n} ({c})" for n, c in LANGUAGES)
        raise LanguageError(f"unsupported language {language!r}; choose auto or one of: {choices}")
    return name


@dataclass(frozen=True)
class SpecialIds:
    im_start: int
    im_end: int
    end_of_text: int
    audio_start: int
    audio_pad: int
    audio_end: int
    asr_text: int
    eos: frozenset[int]


class PromptBuilder:
    """Builds prompt ids and decodes generated ids with a checkpoint's tokenizer."""

    def __init__(self, tokenizer: Tokenizer, special: SpecialIds, added_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self._added_strings = added_strings

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        *,
        audio_token_id: int | None = None,
        eos_ids: tuple[int, ...] = (),
        vocab_size: int | None = None,
    ) -> PromptBuilder:
        tokenizer, added = load_tokenizer(folder, vocab_size)
        return cls.from_tokenizer(tokenizer, added, source=str(folder), audio_token_id=audio_token_id, eos_ids=eos_ids)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Tokenizer,
        added_strings: list[str] | tuple[str, ...],
        *,
        source: str,
        audio_token_id: int | None = None,
        eos_ids: tuple[int, ...] = (),
    ) -> PromptBuilder:
        """A builder on an already built tokenizer (e.g. one read from a GGUF file's vocabulary).

        ``added_strings`` are the added-token contents that :meth:`clean_context` removes from user
        text; ``source`` names the file or folder in error messages.
        """

        def need(text: str) -> int:
            tid = tokenizer.token_to_id(text)
            if tid is None:
                raise ModelError(f"{source}: tokenizer has no {text} token (not a Qwen3-ASR tokenizer)")
            return tid

        im_end, eot = need(IM_END), need(END_OF_TEXT)
        special = SpecialIds(
            im_start=need(IM_START),
            im_end=im_end,
            end_of_text=eot,
            audio_start=need(AUDIO_START),
            audio_pad=need(AUDIO_PAD),
            audio_end=need(AUDIO_END),
            asr_text=need(ASR_TEXT),
            eos=frozenset(eos_ids) | {im_end, eot},
        )
        if audio_token_id is not None and audio_token_id != special.audio_pad:
            raise ModelError(
                f"{source}: config audio_token_id {audio_token_id} but the tokenizer's "
                f"{AUDIO_PAD} is {special.audio_pad}"
            )
        return cls(tokenizer, special, tuple(added_strings))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def clean_context(self, context: str) -> str:
        """Remove control-token strings a user may paste (they would corrupt the prompt structure)."""
        for token in self._added_strings:
            if token in context:
                log.warning("removed %s from the context text", token)
                context = context.replace(token, "")
        return context

    def prompt_ids(self, n_audio_tokens: int, *, context: str = "", language: str | None = None) -> list[int]:
        """The official chat template (spec §6.1) with ``n_audio_tokens`` audio pads.

        The system turn carries the context and is always present, even when empty; the user
        turn holds only the audio; a forced language prefills ``language X<asr_text>``.
        """
        text = (
            f"{IM_START}system\n{self.clean_context(context or '')}{IM_END}\n"
            f"{IM_START}user\n{AUDIO_START}{AUDIO_PAD}{AUDIO_END}{IM_END}\n{IM_START}assistant\n"
        )
        forced = normalize_language(language)
        if forced:
            text += f"language {forced}{ASR_TEXT}"
        ids = self.encode(text)
        at = ids.index(self.special.audio_pad)
        return ids[:at] + [self.special.audio_pad] * n_audio_tokens + ids[at + 1 :]

    def decode(self, ids: list[int]) -> str:
        """Generated ids → raw text, special tokens skipped (``<asr_text>`` is not special and stays)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)


MAX_TOKENIZER_CONFIG_BYTES = 64 << 20  # tokenizer_config.json (Qwen's: 10 kB; some embed a chat template)
MAX_ADDED_ID = 1 << 22  # an added token's id; Qwen's highest is 151704 (a 4M-entry vocabulary would be absurd)


def load_tokenizer(folder: Path, vocab_size: int | None = None) -> tuple[Tokenizer, list[str]]:
    """Read ``tokenizer.json`` if present, else build the BPE from ``vocab.json`` + ``merges.txt``.

    Added tokens are taken from ``tokenizer_config.json`` at their listed ids; ids missing from the
    list get placeholders so that every later id stays where the checkpoint expects it. An id at or
    beyond ``vocab_size`` (the model's embedding rows), or absurdly large without it, is refused.
    Every problem is a ModelError naming the file.
    """
    folder = Path(folder)
    config_path = folder / "tokenizer_config.json"
    added_decoder = _added_tokens(config_path, MAX_ADDED_ID if vocab_size is None else min(vocab_size, MAX_ADDED_ID))

    json_path = folder / "tokenizer.json"
    if json_path.exists():
        _need_regular(json_path)
        try:
            tok = Tokenizer.from_file(str(json_path))
        except Exception as exc:  # the tokenizers library raises plain Exception subclasses
            raise ModelError(f"{json_path}: unreadable ({_first_line(exc)})") from None
        # Use the original Qwen split even if a saved file carries another regex (spec §2.4).
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
    vocabulary and merges in their metadata (``dictation.asr.gguf_file``).
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


# --- output parsing (spec §6.4) -------------------------------------------------------------

REPEAT_THRESHOLD = 20
_MAX_PATTERN = 20


def _collapse_char_runs(s: str, threshold: int) -> str:
    """A character repeated more than ``threshold`` times in a row becomes one copy."""
    out: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(s[i] if j - i > threshold else s[i:j])
        i = j
    return "".join(out)


def _collapse_pattern_run(s: str, threshold: int) -> str:
    """The first substring (1-20 chars) repeated at least ``threshold`` times becomes one copy.

    Scanning starts left to right at positions that leave room for ``2 * threshold`` characters,
    as the reference does; after the first collapse the rest is processed again.
    """
    n = len(s)
    for i in range(0, n - 2 * threshold + 1):
        for k in range(1, _MAX_PATTERN + 1):
            if i + k * threshold > n:
                break
            pattern = s[i : i + k]
            if all(s[i + r * k : i + (r + 1) * k] == pattern for r in range(1, threshold)):
                end = i + threshold * k
                while s[end : end + k] == pattern and end + k <= n:
                    end += k
                return s[:i] + pattern + _collapse_pattern_run(s[end:], threshold)
    return s


def fix_repetitions(text: str, threshold: int = REPEAT_THRESHOLD) -> str:
    """Undo the decoding loops a model can fall into on long or noisy audio."""
    return _collapse_pattern_run(_collapse_char_runs(text, threshold), threshold)


def parse_output(raw: str, forced_language: str | None = None) -> tuple[str, str]:
    """Raw decoded text → ``(language, text)``; ``("", "")`` for no speech (``language None``)."""
    s = (raw or "").strip()
    if not s:
        return "", ""
    s = fix_repetitions(s)
    if forced_language:
        return forced_language, s
    if ASR_TEXT not in s:
        return "", s.strip()
    meta, text = s.split(ASR_TEXT, 1)
    text = text.strip()
    if "language none" in meta.lower():
        return "", text
    language = ""
    for line in meta.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.lower().startswith("language "):
            value = line[len("language ") :].strip()
            if value:
                language = value[:1].upper() + value[1:].lower()
            break
    return language, text
