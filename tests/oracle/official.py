"""The official Qwen3-ASR implementation (qwen-asr 0.0.6 on transformers 4.57.6) as a numerical oracle.

``OfficialOracle(folder)`` loads a thinker-layout checkpoint folder (for an hf-layout checkpoint use its
thinker twin: same seed and flags) exactly as ``qwen_asr.Qwen3ASRModel.from_pretrained`` does, in fp32 on the
CPU, and answers with the official code paths: the official processor (feature extractor, chat template,
audio-pad expansion), ``thinker.get_audio_features``, the thinker forward, ``model.generate``, the official
``batch_decode`` and ``parse_asr_output``.

One deliberate change: the audio encoder attends within its 104-token (8 s) windows (docs/model.md §5.5). qwen-asr
0.0.6 only honours the windows with FlashAttention-2; with sdpa/eager it attends over the whole clip. We
register ``WINDOWED_ATTENTION`` with transformers' ``AttentionInterface`` (split q/k/v at ``cu_seq_lens_q``,
bidirectional sdpa per window) and point the audio tower's ``_attn_implementation`` at it. Clips of at most
8 s give identical results either way; ``encoder_output(..., windowed=False)`` gives the stock behaviour.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from tests import lanes

WINDOWED_ATTENTION = "qwen3_asr_windowed_sdpa"
EOS_TOKEN_IDS = (151645, 151643)
SAMPLE_RATE = 16000


def windowed_sdpa_attention(module, query, key, value, attention_mask=None, **kwargs):
    """transformers attention function: bidirectional sdpa inside each ``cu_seq_lens_q`` window.

    query/key/value: [1, heads, N, head_dim] (the audio encoder's packed sequence). Without ``cu_seq_lens_q``
    (or with an explicit mask) it is the stock ``sdpa`` function.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or attention_mask is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = [int(b) for b in cu.tolist()]
    if bounds[0] != 0 or bounds[-1] != query.shape[2]:
        raise ValueError(f"cu_seq_lens_q {bounds} does not cover the {query.shape[2]} positions")
    outputs = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            None,
            dropout=kwargs.get("dropout", 0.0),
            scaling=kwargs.get("scaling"),
            is_causal=False,
        )
        outputs.append(out)  # [1, window, heads, head_dim]
    return torch.cat(outputs, dim=1), None


@functools.cache
def register_windowed_attention() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(WINDOWED_ATTENTION, windowed_sdpa_attention)
    return WINDOWED_ATTENTION


@contextlib.contextmanager
def cheap_processor_repr() -> Iterator[None]:
    """transformers' processor repr as Python's default while a processor loads.

    ``ProcessorMixin.from_args_and_dict`` logs ``f"Processor {processor}"`` at info level, and the
    f-string is built whatever the level: the repr deep-copies the processor, tokenizer included,
    into a JSON string (0.4 s of each 0.8-s processor load here, 9 s of the suite's CPU). Nothing
    else reads that repr while the processor loads."""
    from transformers.processing_utils import ProcessorMixin

    with mock.patch.object(ProcessorMixin, "__repr__", object.__repr__):
        yield


class OfficialOracle:
    """The official model + processor on one checkpoint folder (thinker layout), fp32, CPU.

    ``fix_mistral_regex=True`` reproduces the official wrapper's processor load
    (``AutoProcessor.from_pretrained(path, fix_mistral_regex=True)``); for a local folder whose config.json says
    4.57.2 < transformers_version < 5 (our tiny checkpoints say 4.57.6) transformers 4.57.6 then swaps the Qwen
    pre-tokenizer regex (docs/model.md §2 "loader quirk"), which changes how free *context* text is tokenised (e.g.
    CamelCase splits). ``fix_mistral_regex=False`` keeps the original Qwen regex (what the model was trained
    with, and what our engine implements). Fixed prompt tokens, the language suffix and decoding are the same.

    Audio arguments are 1-D float32 numpy arrays at 16 kHz.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        fix_mistral_regex: bool = True,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        from qwen_asr import Qwen3ASRModel  # registers the qwen3_asr Auto classes
        from transformers import AutoModel, AutoProcessor

        self.folder = Path(folder)
        if not (self.folder / "config.json").exists():
            raise FileNotFoundError(f"{self.folder} has no config.json")
        self.model = AutoModel.from_pretrained(str(self.folder), dtype=dtype, attn_implementation="sdpa")
        self.model.to(device).eval()
        with cheap_processor_repr():
            processor = AutoProcessor.from_pretrained(str(self.folder), fix_mistral_regex=fix_mistral_regex)
        # the official wrapper, used for its prompt builder and its transcribe() pipeline
        self.asr = Qwen3ASRModel(
            backend="transformers", model=self.model, processor=processor, max_inference_batch_size=-1
        )
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.thinker = self.model.thinker
        register_windowed_attention()
        self._set_audio_attention(WINDOWED_ATTENTION)

    # --- attention switch -----------------------------------------------------------------------------------

    def _audio_configs(self) -> list:
        tower = self.thinker.audio_tower
        configs = {id(tower.config): tower.config}
        for module in tower.modules():
            cfg = getattr(module, "config", None)
            if cfg is not None:
                configs[id(cfg)] = cfg
        return list(configs.values())

    def _set_audio_attention(self, name: str) -> None:
        for cfg in self._audio_configs():
            cfg._attn_implementation = name

    @property
    def audio_attention(self) -> str:
        return self.thinker.audio_tower.config._attn_implementation

    @contextlib.contextmanager
    def audio_attention_as(self, name: str) -> Iterator[None]:
        """Temporarily run the audio encoder with another attention ("sdpa" = stock qwen-asr: global)."""
        previous = self.audio_attention
        self._set_audio_attention(name)
        try:
            yield
        finally:
            self._set_audio_attention(previous)

    # --- prompt / inputs ------------------------------------------------------------------------------------

    def normalize_language(self, language: str | None) -> str | None:
        """The wrapper's treatment of a forced language: None/blank -> None, else canonical name (validated)."""
        from qwen_asr.inference.utils import normalize_language_name, validate_language

        if language is None or str(language).strip() == "":
            return None
        name = normalize_language_name(str(language))
        validate_language(name)
        return name

    def prompt_text(self, context: str = "", language: str | None = None) -> str:
        """The official prompt string (``Qwen3ASRModel._build_text_prompt``), before audio-pad expansion."""
        return self.asr._build_text_prompt(context=context, force_language=self.normalize_language(language))

    def inputs(self, audio: np.ndarray, context: str = "", language: str | None = None):
        """What ``_infer_asr_transformers`` feeds to ``generate`` for one clip (a BatchFeature, fp32)."""
        audio = _as_clip(audio)
        text = self.prompt_text(context, language)
        inputs = self.processor(text=[text], audio=[audio], return_tensors="pt", padding=True)
        return inputs.to(self.model.device).to(self.model.dtype)

    def prompt_ids(self, audio: np.ndarray, context: str = "", language: str | None = None) -> list[int]:
        """Prompt token ids incl. the expanded ``<|audio_pad|>`` run (docs/model.md §7.1)."""
        return self.inputs(audio, context, language)["input_ids"][0].tolist()

    # --- numbers --------------------------------------------------------------------------------------------

    def features(self, audio: np.ndarray) -> torch.Tensor:
        """Log-mel features [128, T] of one clip from the official processor (T = len(audio) // 160)."""
        inputs = self.inputs(audio)
        n = int(inputs["feature_attention_mask"][0].sum())
        return inputs["input_features"][0, :, :n].clone()

    @torch.no_grad()
    def encoder_output(self, audio: np.ndarray, *, windowed: bool = True) -> torch.Tensor:
        """Audio embeddings [N, output_dim] (encoder incl. ln_post, proj1, GELU, proj2).

        ``windowed=False`` runs the stock qwen-asr sdpa path (global attention over the whole clip)."""
        inputs = self.inputs(audio)
        name = WINDOWED_ATTENTION if windowed else "sdpa"
        with self.audio_attention_as(name):
            return self.thinker.get_audio_features(
                inputs["input_features"], feature_attention_mask=inputs["feature_attention_mask"]
            ).clone()

    @torch.no_grad()
    def prompt_logits(self, audio: np.ndarray, context: str = "", language: str | None = None) -> torch.Tensor:
        """Logits [prompt_len, vocab] of one thinker forward over the whole prompt (no cache)."""
        inputs = self.inputs(audio, context, language)
        out = self.thinker(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            input_features=inputs["input_features"],
            feature_attention_mask=inputs["feature_attention_mask"],
            use_cache=False,
        )
        return out.logits[0].clone()

    @torch.no_grad()
    def forced_logits(
        self, audio: np.ndarray, ids: list[int], context: str = "", language: str | None = None
    ) -> torch.Tensor:
        """Teacher forcing: logits [len(ids) + 1, vocab] at the last prompt position and after each of
        ``ids`` (one forward over the prompt followed by ``ids``, no cache): row k is what picks the
        generated id k when the ids before it were ``ids[:k]``."""
        inputs = self.inputs(audio, context, language)
        prompt = inputs["input_ids"]
        tail = torch.tensor([ids], dtype=prompt.dtype, device=prompt.device)
        input_ids = torch.cat([prompt, tail], dim=1)
        out = self.thinker(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            input_features=inputs["input_features"],
            feature_attention_mask=inputs["feature_attention_mask"],
            use_cache=False,
        )
        return out.logits[0, prompt.shape[1] - 1 :].clone()

    def first_step_logits(self, audio: np.ndarray, context: str = "", language: str | None = None) -> torch.Tensor:
        """Logits [vocab] at the last prompt position (what picks the first generated token)."""
        return self.prompt_logits(audio, context, language)[-1]

    @torch.no_grad()
    def generate(self, audio: np.ndarray, context: str = "", language: str | None = None, max_new_tokens: int = 32):
        """The raw official ``model.generate`` output for one clip (``return_dict_in_generate``; ``.sequences``
        holds prompt + generated ids)."""
        inputs = self.inputs(audio, context, language)
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, eos_token_id=list(EOS_TOKEN_IDS))
        return inputs, out

    def greedy_ids(
        self, audio: np.ndarray, context: str = "", language: str | None = None, max_new_tokens: int = 32
    ) -> list[int]:
        """Generated ids only (prompt excluded), greedy, as ``model.generate`` returns them with
        ``eos_token_id=[151645, 151643]``. If the model stops, the EOS id IS included as the last element; a
        list without a trailing EOS id and of length ``max_new_tokens`` means it hit the limit."""
        inputs, out = self.generate(audio, context, language, max_new_tokens)
        return out.sequences[0, inputs["input_ids"].shape[1] :].tolist()

    def greedy_margins(
        self, audio: np.ndarray, context: str = "", language: str | None = None, max_new_tokens: int = 32
    ) -> tuple[list[int], list[float]]:
        """(greedy ids, top-1 minus top-2 logit at every generated step) from one ``generate`` call."""
        inputs = self.inputs(audio, context, language)
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=max_new_tokens, eos_token_id=list(EOS_TOKEN_IDS), output_logits=True
            )
        ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        margins = []
        for step_logits in out.logits:
            top2 = step_logits[0].float().topk(2).values
            margins.append(float(top2[0] - top2[1]))
        return ids, margins

    def decode(self, ids: list[int]) -> str:
        """The official decode of generated ids (special tokens skipped, ``<asr_text>`` kept)."""
        return self.processor.batch_decode([ids], skip_special_tokens=True, clean_up_tokenization_spaces=False)[0]

    def raw_output(
        self, audio: np.ndarray, context: str = "", language: str | None = None, max_new_tokens: int = 32
    ) -> str:
        """The decoded string that the official wrapper hands to ``parse_asr_output``."""
        return self.decode(self.greedy_ids(audio, context, language, max_new_tokens))

    def transcribe(
        self, audio: np.ndarray, context: str = "", language: str | None = None, max_new_tokens: int = 32
    ) -> tuple[str, str]:
        """(language, text) from the official ``Qwen3ASRModel.transcribe`` pipeline (audio normalisation,
        chunking (a no-op below 1200 s), prompt, generate, decode, ``parse_asr_output``)."""
        self.asr.max_new_tokens = max_new_tokens
        result = self.asr.transcribe(audio=(_as_clip(audio), SAMPLE_RATE), context=context, language=language)[0]
        return result.language, result.text

    @staticmethod
    def parse(raw: str, language: str | None = None) -> tuple[str, str]:
        """The official ``parse_asr_output`` (``language`` = forced language, canonical name)."""
        from qwen_asr.inference.utils import parse_asr_output

        return parse_asr_output(raw, user_language=language)


def _as_clip(audio) -> np.ndarray:
    clip = np.asarray(audio, dtype=np.float32)
    if clip.ndim != 1:
        raise ValueError(f"expected a 1-D 16 kHz clip, got shape {clip.shape}")
    return clip


# Two official models kept loaded: the parity tests alternate between the tied and the untied
# checkpoint; more kept every model of the session in memory (docs/architecture.md, "Tests").
@functools.lru_cache(maxsize=2)
def _cached_oracle(folder: str, fix_mistral_regex: bool) -> OfficialOracle:
    return OfficialOracle(folder, fix_mistral_regex=fix_mistral_regex)


def oracle_for(folder: str | os.PathLike, *, fix_mistral_regex: bool = True) -> OfficialOracle:
    """A process-wide cached ``OfficialOracle`` per (folder, flag): loaded once while it is used (the
    suite drops the kept ones between modules that use no model: tests/conftest.py, `release_models`)."""
    return _cached_oracle(str(Path(folder).resolve()), fix_mistral_regex)


def oracles_kept() -> int:
    """How many official models `oracle_for` keeps loaded now."""
    return _cached_oracle.cache_info().currsize


def drop_oracles() -> None:
    """The official models `oracle_for` keeps, dropped (loaded again when next asked for)."""
    _cached_oracle.cache_clear()


# --- transformers >= 5 native model (optional second reference for the hf layout) -----------------------------

TRANSFORMERS5_PATH_ENV = "DICTATION_TRANSFORMERS5_PATH"

_HF_NATIVE_SCRIPT = r"""
import json, sys
import numpy as np, torch
from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration
from transformers.processing_utils import ProcessorMixin
job = json.loads(sys.stdin.read())
repr_was, ProcessorMixin.__repr__ = ProcessorMixin.__repr__, object.__repr__  # cheap_processor_repr (above)
processor = AutoProcessor.from_pretrained(job["folder"])
ProcessorMixin.__repr__ = repr_was
model = Qwen3ASRForConditionalGeneration.from_pretrained(job["folder"], dtype=torch.float32).eval()
results = []
for clip_path, language in zip(job["clips"], job["languages"]):
    inputs = processor.apply_transcription_request(audio=np.load(clip_path), language=language)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
        out = model.generate(**inputs, max_new_tokens=job["max_new_tokens"], do_sample=False)
    n = inputs["input_ids"].shape[1]
    results.append({"prompt_ids": inputs["input_ids"][0].tolist(), "first_step_logits": logits.tolist(),
                    "greedy_ids": out[0, n:].tolist()})
print(json.dumps({"tied": model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr(),
                  "results": results}))
"""


def hf_native_outputs(
    hf_folder: str | os.PathLike,
    clips: list[np.ndarray],
    languages: list[str | None] | None = None,
    *,
    transformers5_path: str | os.PathLike,
    max_new_tokens: int = 16,
) -> dict:
    """Run transformers>=5's native ``Qwen3ASRForConditionalGeneration`` on an hf-layout folder, in a child
    process whose ``PYTHONPATH`` starts with ``transformers5_path`` (a ``pip install --target`` folder holding
    transformers>=5 and its dependencies; it cannot share an environment with qwen-asr's transformers 4.57.6).

    Returns ``{"tied": bool, "results": [{"prompt_ids", "first_step_logits", "greedy_ids"}, ...]}`` per clip
    (prompt through ``processor.apply_transcription_request``; greedy ids as ``generate`` returns them after the
    prompt, EOS included when emitted).
    """
    import json
    import subprocess
    import sys
    import tempfile

    languages = languages if languages is not None else [None] * len(clips)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, clip in enumerate(clips):
            paths.append(str(Path(tmp) / f"clip{i}.npy"))
            np.save(paths[-1], _as_clip(clip))
        job = {"folder": str(hf_folder), "clips": paths, "languages": languages, "max_new_tokens": max_new_tokens}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(transformers5_path), os.environ.get("PYTHONPATH", "")]))
        with lanes.one_big_child_at_a_time():
            proc = subprocess.run(
                [sys.executable, "-c", _HF_NATIVE_SCRIPT],
                input=json.dumps(job),
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
    if proc.returncode != 0:
        raise RuntimeError(f"transformers 5 reference failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
