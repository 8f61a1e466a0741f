"""The chat template, the context and the forced language: prompt ids for one pass (docs/model.md §7), and
generated ids back to text. The tokenizer itself: ``tokenizer.py``; parsing the text: ``parse.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from dictation.asr.errors import LanguageError, ModelError
from dictation.asr.text.tokenizer import (
    ASR_TEXT,
    AUDIO_END,
    AUDIO_PAD,
    AUDIO_START,
    END_OF_TEXT,
    IM_END,
    IM_START,
    load_tokenizer,
)

log = logging.getLogger(__name__)


# (name, ISO code) of the 30 languages a transcription can be forced to (docs/model.md §7.4).
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
        """The official chat template (docs/model.md §7.1) with ``n_audio_tokens`` audio pads.

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
