"""One pass through the model, written once: mel → encoder → prompt → greedy → the text.

:class:`Pipeline` holds what a pass needs (the loaded model, its mel frontend and prompt builder,
and the lock that serialises their use) and runs the stages. The engine builds one per loaded
state of the weights (a new one after adapters change or a reload), transcribes through
:meth:`Pipeline.run`, and hands the current one out (``AsrEngine.pipeline``); streaming
(``streaming.py``) and the bench run the same stages on it, so the three cannot drift apart.

The KV cache belongs to the model; :attr:`Pipeline.cache_owner` says whose prompt it holds
(a stream's, see ``streaming.py``). Every pass that overwrites the cache clears it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dictation.asr.config import SAMPLE_RATE
from dictation.asr.decode.greedy import Generation, greedy, sync_device
from dictation.asr.limits import auto_budget, max_new_tokens_for
from dictation.asr.nn.features import LogMel, n_audio_tokens
from dictation.asr.nn.model import AsrModel
from dictation.asr.text.parse import parse_output
from dictation.asr.text.prompt import PromptBuilder

log = logging.getLogger(__name__)


@dataclass
class Transcript:
    text: str
    language: str
    token_ids: list[int]  # generated ids, prompt and EOS excluded (all chunks, in order)
    audio_seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    raw: str = ""  # decoded model output before parsing (last chunk joined)
    chunks: int = 1
    truncated: bool = False  # the token budget ran out before the model ended the text


@dataclass(frozen=True)
class Progress:
    done_seconds: float
    total_seconds: float
    chunk: int
    n_chunks: int
    text_so_far: str

    @property
    def fraction(self) -> float:
        return self.done_seconds / self.total_seconds if self.total_seconds else 1.0


@dataclass
class PassResult:
    """One pass over at most 20 minutes of audio: the generated ids and what they say."""

    ids: list[int]
    raw: str
    language: str
    text: str
    truncated: bool
    timings: dict[str, float]
    first_logits: torch.Tensor | None = None


@dataclass
class PromptEmbeds:
    """A pass's decoder input: the prompt ids with the audio pads, their embeddings (the audio's in
    place of the pads), and the seconds the mel frontend and the encoder took."""

    ids: list[int]
    embeds: torch.Tensor
    mel_s: float
    encoder_s: float


class Pipeline:
    """The stages of one pass on one loaded model. Use it holding :attr:`lock` (``run`` takes it)."""

    def __init__(
        self,
        model: AsrModel,
        prompt: PromptBuilder,
        mel: LogMel,
        *,
        lock: threading.RLock | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.prompt = prompt
        self.mel = mel
        self.lock = lock if lock is not None else threading.RLock()
        self.max_new_tokens = max_new_tokens  # the default budget (None: scale with the audio)
        self.cache_owner: object | None = None  # whose prompt the model's KV cache holds

    def budget(self, n_samples: int, max_new_tokens: int | None = None) -> int:
        """The token budget of a pass over ``n_samples``: the argument, else the pipeline's default,
        else :func:`auto_budget`; never more than the audio justifies (``limits.max_new_tokens_for``)."""
        budget = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        seconds = n_samples / SAMPLE_RATE
        if budget is None:
            return auto_budget(seconds)
        ceiling = max_new_tokens_for(seconds)
        if budget > ceiling:
            log.info("token budget %d lowered to %d, the most %.1f s of audio can need", budget, ceiling, seconds)
        return max(0, min(budget, ceiling))

    def prompt_embeds(self, audio: np.ndarray, *, context: str = "", language: str | None = None) -> PromptEmbeds:
        """Mel features → audio embeddings → the chat-template prompt with them in place of the pads.
        ``language``: a canonical name or None (``normalize_language`` first)."""
        model = self.model
        t0 = time.perf_counter()
        features = self.mel(audio)
        sync_device(model.device)
        t1 = time.perf_counter()
        audio_embeds = model.audio_tower(features)
        sync_device(model.device)
        t2 = time.perf_counter()
        n_tokens = n_audio_tokens(features.shape[-1], model.cfg.audio.chunk_frames)
        ids = self.prompt.prompt_ids(n_tokens, context=context, language=language)
        embeds = model.embed_prompt(torch.tensor(ids, device=model.device), audio_embeds)
        return PromptEmbeds(ids, embeds, t1 - t0, t2 - t1)

    def run(
        self,
        audio: np.ndarray,
        forced: str | None,
        context: str,
        max_new_tokens: int | None,
        keep_first_logits: bool = False,
        draft_ids: Sequence[int] | None = None,
        quiet: bool = False,
    ) -> PassResult:
        """One model pass over at most 20 minutes of 16-kHz audio (prepared: 1-D float32, peak at
        most 1). ``forced``: a canonical language name or None; ``draft_ids``: a guess at the output,
        verified in batches (the result is the same); ``quiet``: no warning at the budget."""
        with self.lock, torch.inference_mode():
            self.cache_owner = None  # this pass overwrites the cache
            budget = self.budget(len(audio), max_new_tokens)
            t0 = time.perf_counter()
            prompt = self.prompt_embeds(audio, context=context, language=forced)
            gen = greedy(
                self.model,
                prompt.embeds,
                max_new_tokens=budget,
                eos_ids=self.prompt.special.eos,
                keep_first_logits=keep_first_logits,
                draft=draft_ids,
            )
            stages = {"mel_s": prompt.mel_s, "encoder_s": prompt.encoder_s}
            return self.finish(gen, forced, budget, draft_ids, t0, stages, n_prompt=len(prompt.ids), quiet=quiet)

    def finish(
        self,
        gen: Generation,
        forced: str | None,
        budget: int,
        draft_ids: Sequence[int] | None,
        t0: float,
        stage_timings: dict[str, float],
        *,
        n_prompt: int,
        quiet: bool = False,
    ) -> PassResult:
        """Decode and parse a pass's generated ids and gather its timings (``t0``: when the pass began;
        ``stage_timings``: what came before decoding, e.g. mel and encoder seconds)."""
        raw = self.prompt.decode(gen.token_ids)
        language, text = parse_output(raw, forced)
        timings = {
            **stage_timings,
            "prefill_s": gen.prefill_s,
            "decode_s": gen.decode_s,
            "generated_tokens": float(len(gen.token_ids)),
            "prompt_tokens": float(n_prompt),
            "pass_s": time.perf_counter() - t0,
        }
        if draft_ids is not None:
            timings["draft_tokens"] = float(len(draft_ids))
            timings["draft_accepted"] = float(gen.draft_accepted)
            timings["draft_passes"] = float(gen.draft_passes)
        budget = min(budget, self.model.cfg.text.max_position_embeddings - n_prompt)  # greedy's limit too
        truncated = not gen.stopped_on_eos and len(gen.token_ids) >= budget
        if truncated and not quiet:
            log.warning("transcription hit the %d-token budget before the model finished", budget)
        return PassResult(gen.token_ids, raw, language, text, truncated, timings, gen.first_logits)
