"""Training a LoRA adapter on a loaded model: LoRA on a float or NF4 base, then a PEFT folder.

The recipe is QLoRA's: the base model is frozen, either in its floating dtype (``bits=16``) or with
the adapted decoder layers' linear layers in NF4 with double quantization (``bits=4``, ``nf4.py``); LoRA matrices
``A [r, in]`` (Kaiming-uniform, as PEFT initialises them) and ``B [out, r]`` (zeros) beside the chosen
decoder layers (by default every attention and MLP projection of the top ``layers`` = 8 decoder
layers; the encoder stays frozen) are the only trained parameters, in float32, with AdamW: a linear
warm-up over the first tenth of the steps, then a cosine decay to a tenth of the peak rate
(:meth:`TrainOptions.lr_at`); by default 8 passes over the clips, two a step, within 40 to 160 steps.
On a GPU the base runs in bfloat16 (QLoRA's compute dtype) and the LoRA branch in float32 beside it
(:func:`training_dtype`); on the CPU all is float32 (bf16 matmuls measured 2.8 times slower on an
AVX2 CPU: benchmarks/results/train-2026-12-02.md).

One example is the official fine-tuning format: the prompt of a transcription without a forced
language (system turn, the audio, ``<|im_start|>assistant\\n``) followed by the target
``language X<asr_text>text<|im_end|>``. The loss is the cross-entropy of the target tokens only (the
prompt is masked), teacher-forced. The encoder, the embeddings and the decoder layers below the
adapted ones are frozen, so each example's input to the first adapted layer is computed once, before
the first step (:func:`prepare`), on the weights as loaded and before any NF4 (the layers below then
never run again, so they are not quantized), and every step runs the adapted layers alone. The NF4 weights of
the adapted layers are dequantized once where they fit in half the memory still available
(:func:`keep_dequantized`), not at every forward and backward. Each step averages the loss over
``batch_size`` examples (gradient accumulation: the forward runs one sequence at a time, as
inference does), taken in a seeded shuffled order, epoch after epoch. With the same seed, data and
machine, training gives the same adapter.

A run with a work folder (:func:`train_adapter`: ``.<out name>.training`` beside the output) saves a
checkpoint every ``save_every`` steps and when cancelled: the LoRA matrices, AdamW's state, the
data order and random state, and a fingerprint of the data and settings; resuming from it gives
the very adapter an uninterrupted run gives. Running out of memory is one TrainingError.

The parts: ``train_options.py`` (TrainOptions, Progress), ``lora_forward.py`` (the LoRA layers, the
frozen part of each example, the forward and loss of a step), ``train_checkpoint.py`` (the resumable
checkpoint), ``peft_export.py`` (the adapter folder); this module runs the loop and the whole
run from a model folder to an adapter folder.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dictation.asr.errors import ModelError
from dictation.asr.nn.features import LogMel
from dictation.asr.nn.model import AsrModel
from dictation.asr.text.prompt import PromptBuilder
from dictation.asr.tune.data import Example, TrainingCancelled, TrainingError
from dictation.asr.tune.lora_forward import LoraTrainLinear, add_lora, example_loss, first_adapted, prepare
from dictation.asr.tune.nf4 import NF4Linear, nf4_decoder
from dictation.asr.tune.peft_export import write_adapter
from dictation.asr.tune.train_checkpoint import CHECKPOINT, fingerprint, load_checkpoint, save_checkpoint
from dictation.asr.tune.train_options import DEFAULT_TARGETS, Progress, TrainOptions

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    losses: list[float]  # every step's (a resumed run's too)
    seconds: float  # this run (since the start or the resume)
    tokens: int  # decoder positions processed in this run (prompt and target, every step)
    target_tokens: int  # the positions the loss covered, every step of the whole run
    base_bytes_per_parameter: float | None = None  # the NF4 base's decoder linears (bits=4)
    lora: dict[str, LoraTrainLinear] = field(default_factory=dict)
    resumed_at: int = 0  # the step a resumed run went on from (0: from the start)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@contextmanager
def _memory_errors(message: Callable[[], str]) -> Iterator[None]:
    """Running out of memory (a GPU's, or the CPU allocator's) inside becomes one TrainingError
    saying ``message()``; every other error passes through."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if isinstance(exc, torch.OutOfMemoryError) or (
            isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
        ):
            raise TrainingError(message()) from None
        raise


def available_memory(device: torch.device) -> int:
    """Bytes that could still be allocated on ``device``: a GPU's free memory, or the system's
    available memory (``MemAvailable``; the free pages where there is no /proc/meminfo)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def keep_dequantized(model: AsrModel, layers: Sequence[NF4Linear]) -> bool:
    """The frozen NF4 weights of ``layers`` (the adapted ones, which every step runs forward and
    backward) dequantized once, in the model's dtype, where that takes at most half the memory still
    available; otherwise each forward dequantizes again. True if kept."""
    need = sum(m.in_features * m.out_features for m in layers) * model.dtype.itemsize
    if not layers or need > available_memory(model.device) // 2:
        log.info("NF4 base dequantized at every step: %.2f GB would not fit", need / 1e9)
        return False
    for m in layers:
        m.keep_dequantized(model.dtype)
    return True


def train_lora(
    model: AsrModel,
    prompt: PromptBuilder,
    examples: Sequence[Example],
    options: TrainOptions,
    *,
    progress: Callable[[Progress], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    work: str | os.PathLike | None = None,
    resume: bool = False,
) -> TrainResult:
    """Train LoRA matrices on ``model`` (changed in place: its decoder layers are wrapped, and with
    ``bits=4`` quantized to NF4) for ``options.total_steps(len(examples))`` steps.

    ``work``: a folder for resumable checkpoints (every ``options.save_every`` steps, and when
    cancelled); ``resume``: continue from its checkpoint, which gives the very adapter an
    uninterrupted run gives. ``cancel()`` is asked before every step: True saves a checkpoint (with
    ``work``) and raises TrainingCancelled. Running out of memory raises one TrainingError."""
    options.check()
    if not examples:
        raise TrainingError("no training examples")
    work = Path(work) if work is not None else None
    if resume and work is None:
        raise TrainingError("resuming needs the folder of the interrupted run")
    steps = options.total_steps(len(examples))
    torch.manual_seed(options.seed)
    bytes_per_param = None
    start = first_adapted(model, options)
    checkpointing = options.checkpointing if options.checkpointing is not None else model.device.type == "cuda"
    with _memory_errors(lambda: _oom_message(model, "preparing the model and the clips")):
        # The frozen part of every clip first, on the weights as loaded (the ones the adapter meets in
        # use): NF4 below the adapted layers would dequantize every weight again for every clip, the
        # larger part of preparing, and those layers never run again. Only the adapted layers go to NF4.
        mel = LogMel(model.cfg.audio.num_mel_bins, model.device)
        items = [prepare(model, prompt, mel, e, start) for e in examples]
        if options.bits == 4:
            layers = [model.get_submodule(n) for n in nf4_decoder(model, options.double_quant, first=start)]
            bytes_per_param = sum(m.nbytes for m in layers) / sum(m.in_features * m.out_features for m in layers)
            keep_dequantized(model, layers)
        lora = add_lora(model, options)
    params = [p for m in lora.values() for p in (m.lora_A, m.lora_B)]
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    made_from = fingerprint(examples, options)
    order: list[int] = []
    rng = random.Random(options.seed)
    losses: list[float] = []
    tokens = target_tokens = 0
    done = 0
    if resume:
        meta = load_checkpoint(work, lora, optimizer, made_from)
        done, order, losses = meta["step"], meta["order"], meta["losses"]
        tokens, target_tokens = meta["tokens"], meta["target_tokens"]
        version, internal, gauss = meta["rng"]
        rng.setstate((version, tuple(internal), gauss))
        log.info("resuming at step %d of %d", done, steps)

    def checkpoint_now(step: int) -> None:
        if work is not None:
            state = {"fingerprint": made_from, "step": step, "order": order, "losses": losses, "rng": rng.getstate()}
            save_checkpoint(work, lora, optimizer, state | {"tokens": tokens, "target_tokens": target_tokens})

    start, tokens_before = time.perf_counter(), tokens
    for step in range(done + 1, steps + 1):
        if cancel is not None and cancel():
            checkpoint_now(step - 1)
            kept = "; its checkpoint is kept for resuming" if work is not None else "; nothing was written"
            raise TrainingCancelled(f"training cancelled at step {step} of {steps}{kept}")
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        with _memory_errors(lambda step=step: _oom_message(model, f"training step {step}")):
            for _ in range(options.batch_size):
                if not order:
                    order = list(range(len(items)))
                    rng.shuffle(order)
                item = items[order.pop()]
                loss = example_loss(model, item, checkpointing) / options.batch_size
                loss.backward()
                total += float(loss.detach())
                tokens += item.embeds.shape[1]
                target_tokens += item.labels.shape[0]
        if not math.isfinite(total):
            raise TrainingError(f"training diverged at step {step} (loss {total}); try a lower learning rate")
        if options.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, options.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = options.lr_at(step, steps)
        optimizer.step()
        losses.append(total)
        if step % options.save_every == 0 and step < steps:
            checkpoint_now(step)
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress(Progress(step, steps, total, elapsed / (step - done) * (steps - step)))
    seconds = time.perf_counter() - start
    return TrainResult(losses, seconds, tokens - tokens_before, target_tokens, bytes_per_param, lora, resumed_at=done)


def _oom_message(model: AsrModel, what: str) -> str:
    where = "GPU" if model.device.type == "cuda" else "memory"
    hint = "use --bits 4, fewer --targets, or shorter clips" if model.device.type == "cuda" else "close other programs"
    return f"out of {where} while {what} on {model.device}; {hint}, or train on another device (--device)"


# --- from files to a folder ---------------------------------------------------------------------------


def work_folder(out: str | os.PathLike) -> Path:
    """Where a run on its way to ``out`` keeps its checkpoint: ``.<name>.training`` beside it (0700)."""
    out = Path(out).expanduser().absolute()
    return out.parent / f".{out.name}.training"


def training_dtype(device: torch.device) -> torch.dtype:
    """The frozen base's dtype for training on ``device``: bfloat16 on a GPU (QLoRA's compute dtype:
    half the memory, tensor cores), float32 on the CPU (bf16 matmuls there are slow and imprecise).
    The LoRA matrices, their gradients and AdamW's moments are float32 on either."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def base_model_folder(model: str | os.PathLike):
    """``(folder, AsrConfig)`` of the model to train on: ModelError naming it unless it is a loadable
    floating-point model (checked without loading its weights)."""
    from dictation.asr.checkpoints.hub import check_model_folder, resolve_model
    from dictation.asr.config import AsrConfig

    problem = check_model_folder(model)
    if problem:
        raise ModelError(problem)
    folder = resolve_model(model)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{model}: not a model folder (no config.json); train on a model folder")
    cfg = AsrConfig.from_file(folder / "config.json")
    if cfg.quantization:
        raise ModelError(f"{folder}: a pre-quantized model; train on the floating-point model it was made from")
    return folder, cfg


def train_adapter(
    model: str | os.PathLike,
    examples: Sequence[Example],
    out: str | os.PathLike,
    options: TrainOptions | None = None,
    *,
    device: str = "cpu",
    resume: bool = False,
    progress: Callable[[Progress], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> TrainResult:
    """Load ``model`` (a folder or cached repo id) on ``device`` (float32 on the CPU, bfloat16 on a
    GPU; the LoRA matrices and AdamW's state are float32 everywhere), train on ``examples`` and write
    the adapter to ``out``. TrainingError / ModelError name the problem. The output folder appears
    whole or not at all; meanwhile checkpoints go to :func:`work_folder` (removed after success,
    kept after a cancel or an error for ``resume``)."""
    import shutil

    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.device import resolve_device

    options = options or TrainOptions()
    options.check()
    if os.path.lexists(Path(out).expanduser()):
        raise TrainingError(f"{out}: already exists; choose a new output path (nothing is overwritten)")
    folder, cfg = base_model_folder(model)
    dev = resolve_device(device)
    dtype = training_dtype(dev)
    work = work_folder(out)
    if resume and not (work / CHECKPOINT).is_file():
        raise TrainingError(f"{work}: no checkpoint to resume from; start without --resume")
    if not resume and work.exists():
        shutil.rmtree(work)
    with _memory_errors(lambda: f"out of memory loading {folder} on {dev}; train on another device (--device)"):
        loaded = load_model(folder, cfg, dev, dtype)
    prompt = PromptBuilder.from_folder(
        folder, audio_token_id=cfg.special.audio_token_id, vocab_size=cfg.text.vocab_size
    )
    result = train_lora(loaded, prompt, examples, options, progress=progress, cancel=cancel, work=work, resume=resume)
    write_adapter(out, result.lora, options, layout=cfg.layout, base_model=str(model))
    shutil.rmtree(work, ignore_errors=True)
    return result


__all__ = [
    "DEFAULT_TARGETS",
    "LoraTrainLinear",
    "NF4Linear",
    "Progress",
    "TrainOptions",
    "TrainResult",
    "TrainingCancelled",
    "TrainingError",
    "base_model_folder",
    "train_adapter",
    "train_lora",
    "training_dtype",
    "work_folder",
    "write_adapter",
]
