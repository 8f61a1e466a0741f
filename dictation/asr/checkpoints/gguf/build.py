"""A GGUF file (or llama.cpp pair) read into our model: resolving the files, mapping names, config."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from dictation.asr.checkpoints.gguf.dequant import dequantize
from dictation.asr.checkpoints.gguf.names import (
    AUDIO_HEAD_DIM,
    DECODER_NAMES,
    MMPROJ_AUDIO_NAMES,
    MMPROJ_IGNORED,
    MMPROJ_KEYS,
    SINGLE_AUDIO_NAMES,
    SINGLE_IGNORED,
    SINGLE_KEYS,
    TEXT_KEYS,
)
from dictation.asr.checkpoints.gguf.reader import (
    MMPROJ_ARCH,
    MMPROJ_PROJECTOR,
    SINGLE_ARCH,
    SUPPORTED_TYPES,
    TEXT_ARCHS,
    GgufFile,
    GgufTensor,
    TensorType,
    read_gguf_file,
)
from dictation.asr.checkpoints.gguf.vocab import GgufVocab
from dictation.asr.checkpoints.safetensors import check_finite, finite_flag
from dictation.asr.config import AsrConfig, AudioEncoderConfig, SpecialTokens, TextDecoderConfig, checked
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.nn.model import AsrModel
from dictation.asr.text.prompt import PromptBuilder

log = logging.getLogger(__name__)


@dataclass
class GgufModel:
    """A Qwen3-ASR model read from GGUF: config, our tensors (dequantized), vocabulary, provenance."""

    cfg: AsrConfig
    tensors: dict[str, torch.Tensor]  # our parameter names (AsrModel.state_dict()) -> values
    vocab: GgufVocab
    source_types: dict[str, str]  # our parameter name -> GGUF type name ("Q4_K", "F16", ...)
    file_paths: tuple[Path, ...]
    layout: str  # "qwen3asr" (single file) or "llama.cpp" (text model + mmproj)
    eos_ids: tuple[int, ...] = ()  # EOS ids the files declare (the prompt builder adds <|im_end|>, <|endoftext|>)

    def build_model(self) -> AsrModel:
        """An ``AsrModel`` whose parameters ARE ``self.tensors`` (assigned, not copied), in eval mode."""
        with torch.device("meta"):
            model = AsrModel(self.cfg)
        model.load_state_dict(self.tensors, strict=True, assign=True)
        model.eval().requires_grad_(False)
        model.audio_tower.reset_buffers()
        return model

    def tokenizer(self) -> tuple[Tokenizer, list[str]]:
        return self.vocab.build()

    def prompt_builder(self) -> PromptBuilder:
        tokenizer, added = self.vocab.build()
        return PromptBuilder.from_tokenizer(
            tokenizer,
            added,
            source=str(self.vocab.source),
            audio_token_id=self.cfg.special.audio_token_id,
            eos_ids=self.eos_ids,
        )


@dataclass(frozen=True)
class _Entry:
    file: GgufFile
    tensor: GgufTensor
    ours: str


def resolve_files(path: str | Path, mmproj: str | Path | None = None) -> tuple[GgufFile, GgufFile | None]:
    """The model file(s) for ``path``: (single file, None) or (text model, mmproj).

    ``path`` is a ``.gguf`` file (a single-file model, a text model whose mmproj file lies next to it,
    or an mmproj whose text model lies next to it) or a folder holding one model; files are told
    apart by ``general.architecture``, not by name. ``mmproj`` names the audio file explicitly.
    """
    main, audio = _resolve(Path(path), mmproj)
    if audio is not None:
        _check_role(main, TEXT_ARCHS)
        _check_role(audio, (MMPROJ_ARCH,))
    return main, audio


def _resolve(path: Path, mmproj: str | Path | None) -> tuple[GgufFile, GgufFile | None]:
    if mmproj is not None:
        return read_gguf_file(path), read_gguf_file(mmproj)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
        if not files:
            raise WeightsError(f"{path}: no .gguf file in the folder")
        archs = {p: read_gguf_file(p, architecture_only=True).architecture for p in files}
        singles = [p for p, a in archs.items() if a == SINGLE_ARCH]
        texts = [p for p, a in archs.items() if a in TEXT_ARCHS]
        projs = [p for p, a in archs.items() if a == MMPROJ_ARCH]
        if len(singles) == 1 and not texts:
            return read_gguf_file(singles[0]), None
        if not singles and len(texts) == 1 and len(projs) == 1:
            return read_gguf_file(texts[0]), read_gguf_file(projs[0])
        listing = ", ".join(f"{p.name} ({a or '?'})" for p, a in archs.items())
        raise WeightsError(
            f"{path}: expected one Qwen3-ASR GGUF model (one qwen3asr file, or one qwen3/qwen3vl text model "
            f"+ one mmproj), found: {listing}; choose the file"
        )
    first = read_gguf_file(path)
    arch = first.architecture
    if arch == SINGLE_ARCH:
        return first, None
    if arch in TEXT_ARCHS:
        return first, read_gguf_file(_sibling(path, MMPROJ_ARCH, "the audio encoder (mmproj)"))
    if arch == MMPROJ_ARCH:
        return read_gguf_file(_sibling(path, TEXT_ARCHS, "the text model")), first
    raise WeightsError(
        f"{path}: general.architecture {arch!r} is not Qwen3-ASR (expected {SINGLE_ARCH!r}, or "
        f"{' / '.join(TEXT_ARCHS)} with an mmproj file)"
    )


def _sibling(path: Path, archs: str | tuple[str, ...], what: str) -> Path:
    archs = (archs,) if isinstance(archs, str) else archs
    found = [
        p
        for p in sorted(path.parent.glob("*.gguf"))
        if p != path and read_gguf_file(p, architecture_only=True).architecture in archs
    ]
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise WeightsError(
            f"{path}: {what} is a separate GGUF file; expected exactly one next to it, found {names} "
            "(pass both files explicitly)"
        )
    return found[0]


def _check_role(gguf: GgufFile, archs: tuple[str, ...]) -> None:
    arch = gguf.architecture
    if arch not in archs:
        raise WeightsError(f"{gguf.path}: general.architecture {arch!r}, expected {' or '.join(archs)}")
    if arch == MMPROJ_ARCH:
        meta = gguf.metadata
        proj = meta.get("clip.audio.projector_type") or meta.get("clip.projector_type")
        if proj != MMPROJ_PROJECTOR or not meta.get("clip.has_audio_encoder", True):
            raise WeightsError(
                f"{gguf.path}: mmproj projector {proj!r} is not a Qwen3 audio tower ({MMPROJ_PROJECTOR!r})"
            )


def _compile(table: tuple[tuple[str, str], ...]) -> list[tuple[re.Pattern[str], str]]:
    out = []
    for theirs, ours in table:
        pattern = re.escape(theirs).replace(re.escape("{i}"), r"(?P<i>\d+)")
        out.append((re.compile(pattern + r"\.(?P<param>weight|bias)"), ours))
    return out


_SINGLE_TABLE = _compile(SINGLE_AUDIO_NAMES + DECODER_NAMES)
_TEXT_TABLE = _compile(DECODER_NAMES)
_MMPROJ_TABLE = _compile(MMPROJ_AUDIO_NAMES)


def _map_names(gguf: GgufFile, table: list[tuple[re.Pattern[str], str]], ignored: frozenset[str]) -> list[_Entry]:
    entries = []
    for name, tensor in gguf.tensors.items():
        if name in ignored:
            continue
        for pattern, ours in table:
            match = pattern.fullmatch(name)
            if match:
                layer = match.group("i") if "i" in pattern.groupindex else None
                module = ours.format(i=int(layer)) if layer is not None else ours
                entries.append(_Entry(gguf, tensor, f"{module}.{match.group('param')}"))
                break
        else:
            raise WeightsError(f"{gguf.path}: unexpected tensor {name}; not a Qwen3-ASR GGUF in this layout?")
    return entries


def _derive_config(
    values: dict[str, Any], shapes: dict[str, tuple[int, ...]], vocab: GgufVocab, source: Path
) -> AsrConfig:
    """The config from metadata ``values`` (our field -> value), shapes where a key is absent."""

    def dim(name: str, axis: int) -> int | None:
        shape = shapes.get(name)
        return shape[axis] if shape and len(shape) > axis else None

    def layer_ids(prefix: str) -> set[int]:
        return {int(m.group(1)) for n in shapes for m in [re.match(re.escape(prefix) + r"(\d+)\.", n)] if m}

    def layers(prefix: str) -> int | None:
        ids = layer_ids(prefix)
        return len(ids) if ids else None

    def pick(key: str, derived: Any = None) -> Any:
        value = values.get(key)
        return derived if value is None else value

    d_model = pick("audio.d_model", dim("audio_tower.conv_out.weight", 0))
    audio_raw = {
        "num_mel_bins": pick("audio.num_mel_bins"),
        "d_model": d_model,
        "encoder_layers": pick("audio.encoder_layers", layers("audio_tower.layers.")),
        "encoder_attention_heads": pick(
            "audio.encoder_attention_heads", d_model // AUDIO_HEAD_DIM if d_model else None
        ),
        "encoder_ffn_dim": pick("audio.encoder_ffn_dim", dim("audio_tower.layers.0.fc1.weight", 0)),
        "output_dim": pick("audio.output_dim", dim("audio_tower.proj2.weight", 0)),
        "downsample_hidden_size": pick("audio.downsample_hidden_size", dim("audio_tower.conv2d1.weight", 0)),
        "max_source_positions": pick("audio.max_source_positions"),
    }
    head_dim = pick("text.head_dim", dim("decoder.layers.0.self_attn.q_norm.weight", 0))
    q_rows, k_rows = (
        dim("decoder.layers.0.self_attn.q_proj.weight", 0),
        dim("decoder.layers.0.self_attn.k_proj.weight", 0),
    )
    text_raw = {
        "vocab_size": pick("text.vocab_size", dim("decoder.embed_tokens.weight", 0)),
        "hidden_size": pick("text.hidden_size", dim("decoder.embed_tokens.weight", 1)),
        "intermediate_size": pick("text.intermediate_size", dim("decoder.layers.0.mlp.gate_proj.weight", 0)),
        "num_hidden_layers": pick("text.num_hidden_layers", layers("decoder.layers.")),
        "num_attention_heads": pick("text.num_attention_heads", q_rows // head_dim if q_rows and head_dim else None),
        "num_key_value_heads": pick("text.num_key_value_heads", k_rows // head_dim if k_rows and head_dim else None),
        "head_dim": head_dim,
        "rms_norm_eps": pick("text.rms_norm_eps"),
        "rope_theta": pick("text.rope_theta"),
        "max_position_embeddings": pick("text.max_position_embeddings"),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
    }
    special_raw = {
        "audio_token_id": pick("special.audio_token_id", vocab.token_id("<|audio_pad|>")),
        "audio_start_token_id": pick("special.audio_start_token_id", vocab.token_id("<|audio_start|>")),
        "audio_end_token_id": pick("special.audio_end_token_id", vocab.token_id("<|audio_end|>")),
    }
    try:
        audio = checked(AudioEncoderConfig, audio_raw, str(source), "audio.")
        text = checked(TextDecoderConfig, text_raw, str(source), "text.")
        special = checked(SpecialTokens, special_raw, str(source), "", minimum=0)
    except ModelError as exc:
        raise WeightsError(f"{exc} (unusable hyper-parameters)") from None
    for part, prefix, n in (
        ("text decoder", "decoder.layers.", text.num_hidden_layers),
        ("audio encoder", "audio_tower.layers.", audio.encoder_layers),
    ):
        ids = layer_ids(prefix)
        # checked before the model is built (its size follows from n), and by count first: a set of the
        # 10 million ids a damaged file may claim is 0.56 GB of memory for nothing
        if len(ids) != n or ids != set(range(n)):
            held = f"layers {min(ids)} to {max(ids)} ({len(ids)} in all)" if ids else "no layers"
            raise WeightsError(f"{source}: the metadata says the {part} has {n} layers, but the tensors hold {held}")
    if audio.output_dim != text.hidden_size:
        raise WeightsError(f"{source}: audio output_dim {audio.output_dim} != text hidden_size {text.hidden_size}")
    if audio.d_model % audio.encoder_attention_heads:
        raise WeightsError(f"{source}: audio d_model not divisible by the audio head count")
    if text.num_attention_heads % text.num_key_value_heads:
        raise WeightsError(f"{source}: num_attention_heads not a multiple of num_key_value_heads")
    return AsrConfig(audio=audio, text=text, special=special, layout="thinker")


def _metadata_values(gguf: GgufFile, keys: dict[str, str]) -> dict[str, Any]:
    arch = gguf.architecture
    out = {}
    for ours, key in keys.items():
        value = gguf.metadata.get(key.format(arch=arch))
        if value is not None:
            out[ours] = value
    return out


def _same_bytes(a: np.ndarray, b: np.ndarray, step: int = 1 << 26) -> bool:
    if a.shape != b.shape:
        return False
    return all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, a.shape[0], step))


def read_gguf(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    mmproj: str | Path | None = None,
) -> GgufModel:
    """Read a Qwen3-ASR GGUF model and dequantize every tensor to ``dtype`` on ``device``.

    ``path``: a single-file model, a llama.cpp text model (its ``mmproj`` found next to it, or given
    as ``mmproj``), or a folder holding one model. Errors are WeightsError / ModelError naming the
    file and the tensor: unknown tensor names, unsupported tensor types, missing tensors, shapes
    that do not fit the hyper-parameters. Without an ``output.weight`` (or with one byte-identical
    to ``token_embd.weight``) the head is tied to the embeddings.
    """
    t0 = time.perf_counter()
    device = torch.device(device)
    main, audio_file = resolve_files(path, mmproj)
    if audio_file is None:
        layout = "qwen3asr"
        entries = _map_names(main, _SINGLE_TABLE, SINGLE_IGNORED)
        values = _metadata_values(main, SINGLE_KEYS)
        eos = main.metadata.get("qwen3asr.eos_token_id")
    else:
        layout = "llama.cpp"
        entries = _map_names(main, _TEXT_TABLE, frozenset()) + _map_names(audio_file, _MMPROJ_TABLE, MMPROJ_IGNORED)
        values = _metadata_values(main, TEXT_KEYS) | _metadata_values(audio_file, MMPROJ_KEYS)
        eos = None
    vocab = GgufVocab.from_metadata(main)
    if eos is not None and (type(eos) is not int or not 0 <= eos < len(vocab.tokens)):
        raise WeightsError(f"{main.path}: qwen3asr.eos_token_id {eos!r} is not a token id")
    eos_ids = tuple(sorted({e for e in (eos, vocab.eos_id) if e is not None}))
    by_ours = {e.ours: e for e in entries}
    embed, head = by_ours.get("decoder.embed_tokens.weight"), by_ours.get("lm_head.weight")
    if embed is not None and head is not None and _tied_copy(embed, head):
        log.info("%s: output.weight is a copy of token_embd.weight; tying the head", head.file.path)
        del by_ours["lm_head.weight"]
    shapes = {name: e.tensor.shape for name, e in by_ours.items()}
    cfg = _derive_config(values, shapes, vocab, main.path)

    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in AsrModel(cfg).state_dict().items()}
    unexpected = [name for name in by_ours if name not in expected]
    if unexpected:
        e = by_ours[unexpected[0]]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise WeightsError(
            f"{e.file.path}: unexpected tensor {e.tensor.name} ({e.ours}){more}; it does not fit the "
            f"model the metadata describes ({cfg.text.num_hidden_layers} decoder / {cfg.audio.encoder_layers} "
            "encoder layers)"
        )
    missing = [name for name in expected if name not in by_ours]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        where = main.path if missing[0].startswith(("decoder.", "lm_head.")) or audio_file is None else audio_file.path
        raise WeightsError(
            f"{where}: missing tensor {_gguf_name(missing[0], layout)} ({missing[0]}, expected shape "
            f"{expected[missing[0]]}){more}"
        )
    plan: list[tuple[str, _Entry, TensorType]] = []
    for name, shape in expected.items():
        e = by_ours[name]
        kind = SUPPORTED_TYPES.get(e.tensor.ggml_type)
        if kind is None:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES.values())
            raise WeightsError(
                f"{e.file.path}: tensor {e.tensor.name} has type {e.tensor.type_name}, which is not supported "
                f"(supported: {supported})"
            )
        if e.tensor.shape != shape and _squeezed(e.tensor.shape) != _squeezed(shape):
            raise WeightsError(f"{e.file.path}: tensor {e.tensor.name} has shape {e.tensor.shape}, expected {shape}")
        plan.append((name, e, kind))

    tensors: dict[str, torch.Tensor] = {}
    source_types: dict[str, str] = {}
    finite = []
    for name, e, kind in plan:
        raw = e.file.raw(e.tensor, kind)
        tensors[name] = dequantize(raw, kind, device, dtype).view(expected[name])
        source_types[name] = kind.name
        finite.append((e.file.path, e.tensor.name, finite_flag(tensors[name])))
    check_finite(finite)  # NaN or infinity in the file (or a scale that overflows the dtype): named
    paths = (main.path,) if audio_file is None else (main.path, audio_file.path)
    counts: dict[str, int] = {}
    for kind_name in source_types.values():
        counts[kind_name] = counts.get(kind_name, 0) + 1
    log.info(
        "read %s (%s layout, %s) to %s %s in %.2f s",
        " + ".join(p.name for p in paths),
        layout,
        ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
        device,
        str(dtype).removeprefix("torch."),
        time.perf_counter() - t0,
    )
    return GgufModel(cfg, tensors, vocab, source_types, paths, layout, eos_ids)


def _tied_copy(embed: _Entry, head: _Entry) -> bool:
    a, b = embed.tensor, head.tensor
    kind = SUPPORTED_TYPES.get(a.ggml_type)
    if kind is None or a.ggml_type != b.ggml_type or a.shape != b.shape:
        return False
    return _same_bytes(embed.file.raw(a, kind), head.file.raw(b, kind))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _gguf_name(ours: str, layout: str) -> str:
    """The GGUF name of our parameter ``ours`` in ``layout`` (for messages)."""
    table = DECODER_NAMES + (SINGLE_AUDIO_NAMES if layout == "qwen3asr" else MMPROJ_AUDIO_NAMES)
    module, _, param = ours.rpartition(".")
    for theirs, mine in table:
        pattern = re.escape(mine).replace(re.escape("{i}"), r"(?P<i>\d+)")
        match = re.fullmatch(pattern, module)
        if match:
            return (theirs.format(i=match.group("i")) if "{i}" in theirs else theirs) + "." + param
    return ours
