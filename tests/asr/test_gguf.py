"""GGUF loading: both public layouts, every supported tensor type, tokenizer metadata, errors, logits.

The files are written here with gguf-py's ``GGUFWriter`` from the tiny random checkpoint, the way the
two converters write them:

* single file (CrispASR, ``general.architecture = "qwen3asr"``): ``audio.*`` names and ``qwen3asr.*``
  hyper-parameters as CrispASR's ``convert-qwen3-asr-to-gguf.py`` writes them, no token types;
* llama.cpp pair: the text model (``qwen3vl``) and the ``mmproj`` (``clip``, projector ``qwen3a``) named
  with gguf-py's own tensor-name map (the table llama.cpp's converter uses), conv biases stored as
  ``[C, 1, 1]`` and the sinusoid table ``a.position_embd.weight`` added, as ``Qwen3ASRMmprojModel`` does.

K-quants: gguf-py cannot quantize to Q3_K/Q4_K/Q5_K/Q6_K, so those tensors are random valid blocks; they
are checked against ``gguf.quants.dequantize`` of the same bytes, on the three tiny-model weights whose rows
are a multiple of 256 (audio conv_out, audio fc2, decoder o_proj). Q4_0/Q4_1/Q5_0/Q5_1 (CrispASR's fallback
for rows that are not a multiple of 256) are quantized with gguf-py.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import gguf  # the test extra installs it
import numpy as np
import pytest
import torch

from dictation.asr.checkpoints.gguf.build import read_gguf, resolve_files
from dictation.asr.checkpoints.gguf.dequant import dequantize_blocks
from dictation.asr.checkpoints.gguf.reader import is_gguf, read_gguf_file
from dictation.asr.checkpoints.gguf.vocab import GgufVocab
from dictation.asr.checkpoints.locate import our_name
from dictation.asr.checkpoints.safetensors import load_model
from dictation.asr.config import AsrConfig
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.nn.features import LogMel
from dictation.asr.text.prompt import PromptBuilder
from dictation.asr.text.tokenizer import load_tokenizer
from tests.oracle import synth_audio
from tests.oracle.checkpoints import cached_checkpoint, load_tensors

QT = gguf.GGMLQuantizationType
TokenType = gguf.TokenType

# --- names as the converters write them -----------------------------------------------------------------

_CRISP_AUDIO_LAYER = {
    "self_attn_layer_norm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "final_layer_norm": "ffn_norm",
    "fc1": "ffn_up",
    "fc2": "ffn_down",
}


def _text_map():
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3VL, 4)


def _mmproj_map():
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 4)


def llama_text_name(ours: str) -> str:
    hf = ours if ours == "lm_head.weight" else "model." + ours.removeprefix("decoder.")
    name = _text_map().get_name(hf, try_suffixes=(".weight", ".bias"))
    assert name, ours
    return name


def llama_mmproj_name(ours: str) -> str:
    name = _mmproj_map().get_name(ours, try_suffixes=(".weight", ".bias"))  # "audio_tower.*" after "thinker."
    assert name, ours
    return name


def crispasr_name(ours: str) -> str:
    if ours.startswith("audio_tower.layers."):
        layer, rest = ours.removeprefix("audio_tower.layers.").split(".", 1)
        module, param = rest.rsplit(".", 1)
        return f"audio.blk.{layer}.{_CRISP_AUDIO_LAYER[module]}.{param}"
    conv = re.fullmatch(r"audio_tower\.conv2d(\d)\.(weight|bias)", ours)
    if conv:
        return f"audio.conv.{conv[1]}.{conv[2]}"
    if ours.startswith("audio_tower."):
        return "audio." + ours.removeprefix("audio_tower.")
    return llama_text_name(ours)


def test_name_tables_match_the_converters():
    assert crispasr_name("audio_tower.layers.1.fc2.bias") == "audio.blk.1.ffn_down.bias"
    assert crispasr_name("audio_tower.conv2d3.weight") == "audio.conv.3.weight"
    assert llama_mmproj_name("audio_tower.proj2.weight") == "mm.a.mlp.2.weight"
    assert llama_mmproj_name("audio_tower.layers.0.self_attn_layer_norm.bias") == "a.blk.0.ln1.bias"
    assert llama_text_name("decoder.layers.1.self_attn.o_proj.weight") == "blk.1.attn_output.weight"
    assert llama_text_name("lm_head.weight") == "output.weight"


# --- writing GGUF files -----------------------------------------------------------------------------------


def our_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {our_name(n, "thinker"): t for n, t in load_tensors(folder).items()}


def encode(array: np.ndarray, kind: str) -> tuple[np.ndarray, QT | None, np.ndarray]:
    """(data to write, raw type, the float32 values a reader must get back)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if kind == "F32":
        return array, None, array
    if kind == "F16":
        half = array.astype(np.float16)
        return half, None, half.astype(np.float32)
    qtype = QT[kind]
    raw = gguf.quants.quantize(array, qtype)
    return raw, qtype, gguf.quants.dequantize(raw, qtype).reshape(array.shape)


def random_blocks(shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    """Random valid blocks of ``kind`` for a float tensor of ``shape``: bytes ``[rows, bytes_per_row]``."""
    block, size = gguf.GGML_QUANT_SIZES[QT[kind]]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    assert cols % block == 0
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    scale = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 2e-5, "Q3_K": 1e-3, "Q2_K": 1e-3, "IQ4_NL": 1e-3}.get(kind, 1e-2)
    fp16_at = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q2_K": (80, 82), "IQ4_NL": (0,)}
    fp16_at |= {"Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2)}
    for at in fp16_at[kind]:
        # the fp16 (super-)block scales (and Q4_1/Q5_1 mins, either sign): finite, moderate
        d = rng.uniform(0.5, 1.5, size=(len(blocks), 1)) * scale
        if kind in ("Q4_1", "Q5_1") and at == 2:
            d *= rng.choice([-1.0, 1.0], size=d.shape)
        d = d.astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8)
    return blocks.reshape(rows, -1)


def vocab_metadata(folder: Path, style: str) -> dict:
    """Tokenizer metadata for the checkpoint's tokenizer: "llama.cpp" (with token types, as
    ``get_vocab_base`` writes them) or "crispasr" (tokens + merges only)."""
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    added = {
        int(i): d for i, d in json.loads((folder / "tokenizer_config.json").read_text())["added_tokens_decoder"].items()
    }
    n = AsrConfig.from_file(folder / "config.json").text.vocab_size
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [int(TokenType.UNUSED)] * n
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, int(TokenType.NORMAL)
    for i, entry in added.items():
        content = entry["content"]
        looks_special = content.startswith("<|") and content.endswith("|>")
        tokens[i] = content
        types[i] = int(TokenType.CONTROL if entry["special"] or looks_special else TokenType.USER_DEFINED)
    merges = [
        line
        for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    meta = {"model": "gpt2", "tokens": tokens, "merges": merges}
    if style == "llama.cpp":
        meta |= {"types": types, "pre": "qwen2", "eos": 151645}
    return meta


def add_vocab(writer, meta: dict) -> None:
    writer.add_tokenizer_model(meta["model"])
    if "pre" in meta:
        writer.add_tokenizer_pre(meta["pre"])
    writer.add_token_list(meta["tokens"])
    if "types" in meta:
        writer.add_token_types(meta["types"])
    writer.add_token_merges(meta["merges"])
    if "eos" in meta:
        writer.add_eos_token_id(meta["eos"])


def write_file(path: Path, arch: str, kv, tensors: list[tuple[str, np.ndarray, QT | None]]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch=arch)
    kv(writer)
    for name, data, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def single_kv(cfg: AsrConfig, vocab: dict):
    a, t, s = cfg.audio, cfg.text, cfg.special

    def kv(w) -> None:
        u = w.add_uint32
        u("qwen3asr.sample_rate", 16000)
        u("qwen3asr.n_mels", a.num_mel_bins)
        u("qwen3asr.audio.n_layers", a.encoder_layers)
        u("qwen3asr.audio.d_model", a.d_model)
        u("qwen3asr.audio.n_heads", a.encoder_attention_heads)
        u("qwen3asr.audio.head_dim", a.head_dim)
        u("qwen3asr.audio.ff_dim", a.encoder_ffn_dim)
        u("qwen3asr.audio.conv_channels", a.downsample_hidden_size)
        u("qwen3asr.audio.proj_dim", a.output_dim)
        u("qwen3asr.audio.max_source_pos", a.max_source_positions)
        u("qwen3asr.llm.n_layers", t.num_hidden_layers)
        u("qwen3asr.llm.d_model", t.hidden_size)
        u("qwen3asr.llm.n_heads", t.num_attention_heads)
        u("qwen3asr.llm.n_kv_heads", t.num_key_value_heads)
        u("qwen3asr.llm.head_dim", t.head_dim)
        u("qwen3asr.llm.ff_dim", t.intermediate_size)
        w.add_float32("qwen3asr.llm.rope_theta", t.rope_theta)
        w.add_float32("qwen3asr.llm.rms_norm_eps", t.rms_norm_eps)
        u("qwen3asr.llm.vocab_size", t.vocab_size)
        u("qwen3asr.llm.max_pos", t.max_position_embeddings)
        u("qwen3asr.audio_start_token_id", s.audio_start_token_id)
        u("qwen3asr.audio_end_token_id", s.audio_end_token_id)
        u("qwen3asr.audio_pad_token_id", s.audio_token_id)
        u("qwen3asr.eos_token_id", 151645)
        add_vocab(w, vocab)

    return kv


def text_kv(cfg: AsrConfig, vocab: dict):
    t = cfg.text

    def kv(w) -> None:
        w.add_block_count(t.num_hidden_layers)
        w.add_context_length(t.max_position_embeddings)
        w.add_embedding_length(t.hidden_size)
        w.add_feed_forward_length(t.intermediate_size)
        w.add_head_count(t.num_attention_heads)
        w.add_head_count_kv(t.num_key_value_heads)
        w.add_key_length(t.head_dim)
        w.add_value_length(t.head_dim)
        w.add_rope_freq_base(t.rope_theta)
        w.add_layer_norm_rms_eps(t.rms_norm_eps)
        add_vocab(w, vocab)

    return kv


def mmproj_kv(cfg: AsrConfig):
    a = cfg.audio

    def kv(w) -> None:
        w.add_clip_has_audio_encoder(True)
        w.add_clip_audio_projector_type("qwen3a")
        w.add_audio_projection_dim(cfg.text.hidden_size)
        w.add_audio_embedding_length(a.d_model)
        w.add_audio_feed_forward_length(a.encoder_ffn_dim)
        w.add_audio_block_count(a.encoder_layers)
        w.add_audio_head_count(a.encoder_attention_heads)
        w.add_audio_attention_layernorm_eps(1e-5)
        w.add_audio_num_mel_bins(a.num_mel_bins)

    return kv


def encode_all(
    ours: dict[str, torch.Tensor], kinds, raw: dict[str, np.ndarray] | None = None
) -> tuple[dict[str, tuple[np.ndarray, QT | None]], dict[str, np.ndarray]]:
    """Every tensor encoded as ``kinds(name, shape)`` says; ``raw`` gives pre-built K-quant blocks."""
    encoded, expected = {}, {}
    for name, tensor in ours.items():
        if raw and name in raw:
            kind = QT[raw[name][1]]
            encoded[name] = (raw[name][0], kind)
            expected[name] = gguf.quants.dequantize(raw[name][0], kind).reshape(tuple(tensor.shape))
            continue
        data, qtype, back = encode(tensor.numpy(), kinds(name, tuple(tensor.shape)))
        encoded[name] = (data, qtype)
        expected[name] = back
    return encoded, expected


def write_single(path: Path, folder: Path, encoded, *, vocab_style="crispasr", extra=(), drop=()) -> Path:
    cfg = AsrConfig.from_file(folder / "config.json")
    tensors = [(crispasr_name(n), d, q) for n, (d, q) in encoded.items() if n not in drop]
    mel = np.zeros((201, 128), dtype=np.float32)  # CrispASR's own frontend constants (ignored)
    tensors += [("audio.mel_filters", mel, None), ("audio.mel_window", np.hanning(400).astype(np.float32), None)]
    return write_file(path, "qwen3asr", single_kv(cfg, vocab_metadata(folder, vocab_style)), tensors + list(extra))


def write_pair(folder_out: Path, folder: Path, encoded, *, drop=()) -> tuple[Path, Path]:
    cfg = AsrConfig.from_file(folder / "config.json")
    folder_out.mkdir(parents=True, exist_ok=True)
    text, audio = [], []
    for name, (data, qtype) in encoded.items():
        if name in drop:
            continue
        if name.startswith("audio_tower."):
            if re.fullmatch(r"audio_tower\.conv2d\d\.bias", name):
                data = data.reshape(-1, 1, 1)  # the converter's [C] -> [C, 1, 1]
            audio.append((llama_mmproj_name(name), data, qtype))
        else:
            text.append((llama_text_name(name), data, qtype))
    d = cfg.audio.d_model
    inv = np.exp(-np.log(10000.0) / (d // 2 - 1) * np.arange(d // 2))
    pos = np.arange(1500)[:, None] * inv[None, :]
    audio.append(("a.position_embd.weight", np.concatenate([np.sin(pos), np.cos(pos)], 1).astype(np.float32), None))
    vocab = vocab_metadata(folder, "llama.cpp")
    text_path = write_file(folder_out / "Qwen3-ASR-Tiny-Q8_0.gguf", "qwen3vl", text_kv(cfg, vocab), text)
    proj_path = write_file(folder_out / "mmproj-Qwen3-ASR-Tiny-F16.gguf", "clip", mmproj_kv(cfg), audio)
    return text_path, proj_path


def mixed_kinds(name: str, shape: tuple[int, ...]) -> str:
    """F32 norms/biases/1-D, F16 convs, BF16 q/k/v, Q8_0 for the other matrices whose rows allow it."""
    if len(shape) == 1:
        return "F32"
    if len(shape) == 4:
        return "F16"
    if re.search(r"\.(q|k|v)_proj\.weight$", name):
        return "BF16"
    return "Q8_0" if shape[-1] % 32 == 0 else "F16"


K_QUANT_TENSORS = {  # the tiny model's weights whose row length is a multiple of 256
    "audio_tower.conv_out.weight": "Q4_K",  # [128, 512]
    "audio_tower.layers.0.fc2.weight": "Q5_K",  # [128, 256]
    "decoder.layers.0.self_attn.o_proj.weight": "Q6_K",  # [64, 2048]
    "decoder.layers.1.self_attn.o_proj.weight": "Q4_K",
}


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def untied(ckpt_untied):
    return ckpt_untied, our_tensors(ckpt_untied)


@pytest.fixture(scope="module")
def f32_single(untied, tmp_path_factory):
    folder, ours = untied
    encoded, expected = encode_all(ours, lambda n, s: "F32")
    path = write_single(tmp_path_factory.mktemp("f32") / "qwen3-asr-tiny-f32.gguf", folder, encoded)
    return path, expected


@pytest.fixture(scope="module")
def mixed_pair(untied, tmp_path_factory):
    folder, ours = untied
    raw = {n: (random_blocks(tuple(ours[n].shape), k, seed=i), k) for i, (n, k) in enumerate(K_QUANT_TENSORS.items())}
    encoded, expected = encode_all(ours, mixed_kinds, raw)
    out = tmp_path_factory.mktemp("pair")
    return write_pair(out, folder, encoded), expected


@pytest.fixture(scope="module")
def reference(untied):
    folder, _ = untied
    cfg = AsrConfig.from_file(folder / "config.json")
    return load_model(folder, cfg, torch.device("cpu"), torch.float32), PromptBuilder.from_folder(folder)


def prefill_logits(model, prompt: PromptBuilder, seed: int = 0) -> torch.Tensor:
    features = LogMel(model.cfg.audio.num_mel_bins)(synth_audio(1.3, seed))
    with torch.inference_mode():
        audio = model.audio_tower(features)
        ids = prompt.prompt_ids(audio.shape[0], context="Qwen3-ASR GGUF", language="English")
        logits = model.prefill(model.embed_prompt(torch.tensor(ids), audio), max_new_tokens=4)
    model.release_cache()
    return logits


# --- tensors and types ------------------------------------------------------------------------------------


def test_f32_single_file_is_exact(f32_single, untied):
    path, expected = f32_single
    g = read_gguf(path, "cpu")
    ref_cfg = AsrConfig.from_file(untied[0] / "config.json")
    assert (g.cfg.audio, g.cfg.text, g.cfg.special) == (ref_cfg.audio, ref_cfg.text, ref_cfg.special)
    assert g.layout == "qwen3asr" and g.file_paths == (path,)
    assert set(g.tensors) == set(expected)
    for name, value in expected.items():
        assert g.tensors[name].dtype == torch.float32
        assert torch.equal(g.tensors[name], torch.from_numpy(value)), name
    assert set(g.source_types.values()) == {"F32"}


def test_f32_logits_equal_the_safetensors_model(f32_single, reference):
    g = read_gguf(f32_single[0], "cpu")
    model, prompt = g.build_model(), g.prompt_builder()
    ref_model, ref_prompt = reference
    assert prompt.prompt_ids(5, context="ctx", language="German") == ref_prompt.prompt_ids(
        5, context="ctx", language="German"
    )
    assert torch.equal(prefill_logits(model, prompt), prefill_logits(ref_model, ref_prompt))


def test_pair_with_every_type_matches_gguf_py_dequantization(mixed_pair, untied):
    (text_path, proj_path), expected = mixed_pair
    g = read_gguf(text_path, "cpu")  # the mmproj is found next to the text model
    assert g.layout == "llama.cpp" and g.file_paths == (text_path, proj_path)
    ref_cfg = AsrConfig.from_file(untied[0] / "config.json")
    assert (g.cfg.audio, g.cfg.text, g.cfg.special) == (ref_cfg.audio, ref_cfg.text, ref_cfg.special)
    assert g.eos_ids == (151645,)
    assert set(g.tensors) == set(expected)
    for name, value in expected.items():
        assert torch.equal(g.tensors[name], torch.from_numpy(value)), (name, g.source_types[name])
    types = g.source_types
    assert types["audio_tower.conv2d1.weight"] == "F16" and types["audio_tower.conv2d1.bias"] == "F32"
    assert types["decoder.layers.0.self_attn.q_proj.weight"] == "BF16"
    assert types["decoder.embed_tokens.weight"] == "Q8_0" and types["lm_head.weight"] == "Q8_0"
    assert {types[n] for n in K_QUANT_TENSORS} == {"Q4_K", "Q5_K", "Q6_K"}
    assert not g.cfg.text.tie_word_embeddings


def test_pair_logits_match_the_model_with_the_same_dequantized_weights(mixed_pair, reference):
    (text_path, _), expected = mixed_pair
    g = read_gguf(text_path.parent, "cpu")  # the folder form
    _, ref_prompt = reference
    want = prefill_logits(_model_from({n: torch.from_numpy(v) for n, v in expected.items()}, g.cfg), ref_prompt)
    got = prefill_logits(g.build_model(), g.prompt_builder())
    assert torch.isfinite(got).all() and torch.equal(got, want)


def _model_from(tensors: dict[str, torch.Tensor], cfg: AsrConfig):
    from dictation.asr.nn.model import AsrModel

    with torch.device("meta"):
        model = AsrModel(cfg)
    model.load_state_dict(tensors, strict=True, assign=True)
    model.eval().requires_grad_(False)
    model.audio_tower.reset_buffers()
    return model


def test_q8_0_logits_are_close_to_the_safetensors_model(untied, reference, tmp_path):
    folder, ours = untied
    encoded, _ = encode_all(ours, lambda n, s: "Q8_0" if len(s) == 2 and s[-1] % 32 == 0 else "F32")
    path = write_single(tmp_path / "q8.gguf", folder, encoded)
    g = read_gguf(path, "cpu")
    assert g.source_types["decoder.layers.0.mlp.down_proj.weight"] == "Q8_0"
    got, want = prefill_logits(g.build_model(), g.prompt_builder()), prefill_logits(*reference)
    assert not torch.equal(got, want)
    top = want.topk(5).indices
    assert torch.allclose(got[top], want[top], rtol=0.02, atol=0.3)
    assert got.argmax() == want.argmax()


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_dequantizers_match_gguf_py(kind):
    raw = random_blocks((3, 1024), kind, seed=7)
    want = gguf.quants.dequantize(raw, QT[kind]).reshape(-1)
    _, size = gguf.GGML_QUANT_SIZES[QT[kind]]
    got = dequantize_blocks(torch.from_numpy(raw.reshape(-1, size)), kind)
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))
    assert got.abs().max() > 0


LEGACY_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1"]


@pytest.mark.parametrize("kind", LEGACY_TYPES)
def test_legacy_quant_dequantizers_match_gguf_py(kind):
    _, size = gguf.GGML_QUANT_SIZES[QT[kind]]
    data = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    data[0, :32] = 0.0  # an all-zero block (d = 0)
    data[1] *= 1e3
    for raw in (gguf.quants.quantize(data, QT[kind]), random_blocks((8, 256), kind, seed=11)):
        want = gguf.quants.dequantize(raw, QT[kind]).reshape(-1)
        got = dequantize_blocks(torch.from_numpy(raw.reshape(-1, size)), kind)
        assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))
        assert got.abs().max() > 0


def test_q3_k_dequantizer_matches_gguf_py():
    raw = random_blocks((4, 1024), "Q3_K", seed=9)
    want = gguf.quants.dequantize(raw, QT.Q3_K).reshape(-1)
    got = dequantize_blocks(torch.from_numpy(raw.reshape(-1, 110)), "Q3_K")
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))
    assert got.abs().max() > 0 and (got < 0).any() and (got > 0).any()


Q3_K_TENSORS = {  # CrispASR's low-bit file: Q3_K where the rows allow it
    "audio_tower.conv_out.weight": "Q3_K",
    "audio_tower.layers.0.fc2.weight": "Q3_K",
    "audio_tower.layers.1.fc2.weight": "Q3_K",
    "decoder.layers.0.self_attn.o_proj.weight": "Q3_K",
}


def legacy_kinds(name: str, shape: tuple[int, ...]) -> str:
    """F32 1-D, F16 convs, the embedding Q4_0 and head Q5_1 (several dequantization chunks each), the other
    matrices cycling through Q4_0/Q4_1/Q5_0/Q5_1 (all rows here are multiples of 32, not all of 256)."""
    if len(shape) == 1:
        return "F32"
    if len(shape) == 4:
        return "F16"
    if name == "decoder.embed_tokens.weight":
        return "Q4_0"
    if name == "lm_head.weight":
        return "Q5_1"
    return LEGACY_TYPES[sum(map(ord, name)) % 4]


def test_single_file_with_legacy_quants_and_q3_k_matches_gguf_py(untied, tmp_path):
    folder, ours = untied
    raw = {n: (random_blocks(tuple(ours[n].shape), k, seed=20 + i), k) for i, (n, k) in enumerate(Q3_K_TENSORS.items())}
    encoded, expected = encode_all(ours, legacy_kinds, raw)
    path = write_single(tmp_path / "qwen3-asr-tiny-q4_0.gguf", folder, encoded)
    g = read_gguf(path, "cpu")
    assert g.layout == "qwen3asr" and set(g.tensors) == set(expected)
    for name, value in expected.items():
        assert g.tensors[name].dtype == torch.float32
        assert torch.equal(g.tensors[name], torch.from_numpy(value)), (name, g.source_types[name])
    types = g.source_types
    assert set(types.values()) == {"F32", "F16", "Q3_K", *LEGACY_TYPES}
    assert types["decoder.embed_tokens.weight"] == "Q4_0" and types["lm_head.weight"] == "Q5_1"
    assert {types[n] for n in Q3_K_TENSORS} == {"Q3_K"}


def test_bf16_output_dtype(f32_single):
    path, expected = f32_single
    g = read_gguf(path, "cpu", torch.bfloat16)
    name = "decoder.layers.1.mlp.up_proj.weight"
    assert g.tensors[name].dtype == torch.bfloat16
    assert torch.equal(g.tensors[name], torch.from_numpy(expected[name]).to(torch.bfloat16))
    assert g.build_model().dtype == torch.bfloat16


# --- tying ------------------------------------------------------------------------------------------------


def test_missing_output_ties_the_head(ckpt_root, tmp_path):
    folder = cached_checkpoint(ckpt_root, tie_word_embeddings=True, drop_tied_lm_head=True)
    ours = our_tensors(folder)
    assert "lm_head.weight" not in ours
    encoded, _ = encode_all(ours, lambda n, s: "F32")
    text, _ = write_pair(tmp_path / "m", folder, encoded)
    g = read_gguf(text, "cpu")
    assert g.cfg.text.tie_word_embeddings and "lm_head.weight" not in g.tensors
    cfg = AsrConfig.from_file(folder / "config.json")
    ref = load_model(folder, cfg, torch.device("cpu"), torch.float32), PromptBuilder.from_folder(folder)
    assert torch.equal(prefill_logits(g.build_model(), g.prompt_builder()), prefill_logits(*ref))


def test_output_copied_from_token_embd_is_tied(untied, tmp_path):
    folder, ours = untied
    ours = dict(ours, **{"lm_head.weight": ours["decoder.embed_tokens.weight"]})  # CrispASR's copy for tied models
    encoded, _ = encode_all(ours, lambda n, s: "F16" if len(s) == 2 else "F32")
    g = read_gguf(write_single(tmp_path / "m.gguf", folder, encoded), "cpu")
    assert g.cfg.text.tie_word_embeddings and "lm_head.weight" not in g.tensors
    assert g.build_model().lm_head is None


# --- errors -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_encoded(untied):
    """F16 everywhere, tied (no output): small files for the error tests."""
    _, ours = untied
    ours = {n: t for n, t in ours.items() if n != "lm_head.weight"}
    return encode_all(ours, lambda n, s: "F16" if len(s) >= 2 else "F32")[0]


@pytest.mark.parametrize("kind", ["Q2_K", "IQ4_NL"])
def test_unsupported_tensor_type_names_file_tensor_and_type(untied, small_encoded, tmp_path, kind):
    folder, ours = untied
    name = "decoder.layers.1.self_attn.o_proj.weight"
    encoded = dict(small_encoded, **{name: (random_blocks(tuple(ours[name].shape), kind, seed=3), QT[kind])})
    path = write_single(tmp_path / "m.gguf", folder, encoded)
    with pytest.raises(WeightsError) as info:
        read_gguf(path, "cpu")
    msg = str(info.value)
    assert str(path) in msg and "blk.1.attn_output.weight" in msg and kind in msg


def test_unknown_tensor_name_is_an_error(untied, small_encoded, tmp_path):
    folder, _ = untied
    extra = [("blk.0.attn_qkv.weight", np.zeros((4, 64), dtype=np.float32), None)]
    path = write_single(tmp_path / "m.gguf", folder, small_encoded, extra=extra)
    with pytest.raises(WeightsError, match=r"unexpected tensor blk\.0\.attn_qkv\.weight") as info:
        read_gguf(path, "cpu")
    assert str(path) in str(info.value)


def test_missing_tensor_is_named(untied, small_encoded, tmp_path):
    folder, _ = untied
    name = "audio_tower.layers.1.self_attn.k_proj.bias"
    text, proj = write_pair(tmp_path / "m", folder, small_encoded, drop={name})
    with pytest.raises(WeightsError) as info:
        read_gguf(text, "cpu")
    msg = str(info.value)
    assert str(proj) in msg and "missing tensor a.blk.1.attn_k.bias" in msg and name in msg and "(128,)" in msg


def test_shape_that_does_not_fit_the_metadata(untied, small_encoded, tmp_path):
    folder, _ = untied
    name = "audio_tower.proj1.weight"
    data, q = small_encoded[name]
    encoded = dict(small_encoded, **{name: (np.ascontiguousarray(data[:, :-1]), q)})
    path = write_single(tmp_path / "m.gguf", folder, encoded)
    with pytest.raises(WeightsError, match=r"audio\.proj1\.weight has shape \(128, 127\), expected \(128, 128\)"):
        read_gguf(path, "cpu")


def test_not_a_gguf_file_and_truncated_file(untied, small_encoded, tmp_path):
    folder, _ = untied
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"GGML" + bytes(100))
    assert not is_gguf(bogus)
    with pytest.raises(WeightsError, match="not a GGUF file"):
        read_gguf(bogus, "cpu")
    path = write_single(tmp_path / "m.gguf", folder, small_encoded)
    data = path.read_bytes()
    cut = tmp_path / "cut" / "m.gguf"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) - 4096])
    with pytest.raises(WeightsError, match="truncated"):
        read_gguf(cut, "cpu")


def test_file_resolution(untied, small_encoded, tmp_path):
    folder, _ = untied
    text, proj = write_pair(tmp_path / "pair", folder, small_encoded)
    assert is_gguf(text) and is_gguf(tmp_path / "pair") and not is_gguf(folder)
    for args in ((text, None), (proj, None), (tmp_path / "pair", None), (text, proj)):
        a, b = resolve_files(*args)
        assert (a.path, b.path) == (text, proj)
    (tmp_path / "one").mkdir()
    single = write_single(tmp_path / "one" / "a.gguf", folder, small_encoded)
    assert resolve_files(tmp_path / "one")[1] is None
    (tmp_path / "one" / "b.gguf").write_bytes(single.read_bytes())
    with pytest.raises(WeightsError, match="choose the file"):
        resolve_files(tmp_path / "one")
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / text.name).write_bytes(text.read_bytes())
    with pytest.raises(WeightsError, match="mmproj"):
        read_gguf(lone / text.name, "cpu")
    with pytest.raises(WeightsError, match="general.architecture 'qwen3vl'"):
        read_gguf(text, "cpu", mmproj=text)


# --- tokenizer --------------------------------------------------------------------------------------------

SAMPLES = [
    "Hello world, it's 2026! Grüße 你好 🎙  tabs\tand\nnewlines",
    "<|im_start|>system\nctx<|im_end|>\n<|audio_start|><|audio_pad|><|audio_end|>language English<asr_text>x",
    "HelloWorld don't <think>maybe</think> <timestamp>",
]


def vocab_file(tmp_path: Path, folder: Path, style: str, patch=None) -> GgufVocab:
    meta = vocab_metadata(folder, style)
    if patch:
        patch(meta)

    def kv(w) -> None:
        add_vocab(w, meta)

    path = write_file(tmp_path / f"vocab-{style}.gguf", "qwen3", kv, [("x", np.zeros(4, np.float32), None)])
    return GgufVocab.from_metadata(read_gguf_file(path))


@pytest.mark.parametrize("style", ["llama.cpp", "crispasr"])
def test_tokenizer_from_metadata_matches_the_checkpoint(ckpt_untied, tmp_path, style):
    vocab = vocab_file(tmp_path, ckpt_untied, style)
    ours, added = vocab.build()
    theirs, their_added = load_tokenizer(ckpt_untied)
    assert set(added) == set(their_added)
    for text in SAMPLES:
        ids = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False).ids == ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for tid in (151643, 151645, 151669, 151676, 151704, 151705, 151671):
        assert ours.id_to_token(tid) == theirs.id_to_token(tid)
    a = PromptBuilder.from_tokenizer(ours, added, source="x", audio_token_id=151676)
    b = PromptBuilder.from_folder(ckpt_untied)
    assert a.special == b.special
    assert a.prompt_ids(4, context="Hotwords: Qwen3-ASR, 通义", language="fr") == b.prompt_ids(
        4, context="Hotwords: Qwen3-ASR, 通义", language="fr"
    )
    assert a.decode([11528, 6364, 151704, 9707, 151645]) == b.decode([11528, 6364, 151704, 9707, 151645])


def test_placeholder_specials_of_old_single_files_are_patched(ckpt_untied, tmp_path):
    def old(meta):  # an older CrispASR file: the added tokens were left as "[PAD<id>]"
        for i in range(151643, len(meta["tokens"])):
            meta["tokens"][i] = f"[PAD{i}]"

    tok, _ = vocab_file(tmp_path, ckpt_untied, "crispasr", old).build()
    ref, _ = load_tokenizer(ckpt_untied)
    for content in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_pad|>", "<asr_text>"):
        assert tok.token_to_id(content) == ref.token_to_id(content)
    assert tok.decode([151644, 9707, 151704], skip_special_tokens=True) == ref.decode(
        [151644, 9707, 151704], skip_special_tokens=True
    )


def test_non_bpe_tokenizer_is_refused(ckpt_untied, tmp_path):
    vocab = vocab_file(tmp_path, ckpt_untied, "llama.cpp", lambda m: m.update(model="llama"))
    with pytest.raises(ModelError, match="byte-level BPE"):
        vocab.build()


# --- malformed headers, absurd hyper-parameters, damaged values -------------------------------------------


def raw_gguf(path: Path, kv: bytes, n_kv: int) -> Path:
    """A GGUF v3 file with no tensors and these metadata bytes, written by hand (gguf-py would not write it)."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv + bytes(64))
    return path


def gguf_key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_arrays_nested_100k_deep_are_one_error(tmp_path):
    nested = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100_000 + struct.pack("<IQ", 4, 0)
    path = raw_gguf(tmp_path / "deep.gguf", gguf_key("general.deep") + nested, 1)
    with pytest.raises(WeightsError) as info:
        read_gguf_file(path)
    assert str(info.value).startswith(f"{path}: not a readable GGUF file (arrays nested more than 16 deep")


@pytest.mark.parametrize("alignment", [b"\x08\x00\x00\x00" + struct.pack("<Q", 3) + b"abc", struct.pack("<II", 4, 0)])
def test_an_unusable_alignment_is_one_error(tmp_path, alignment):
    """general.alignment as a string, or 0 (a division by zero before)."""
    path = raw_gguf(tmp_path / "a.gguf", gguf_key("general.alignment") + alignment, 1)
    with pytest.raises(WeightsError, match=r"general\.alignment .* is not a power of two"):
        read_gguf_file(path)


def write_single_with(path: Path, folder: Path, encoded, **overrides) -> Path:
    """write_single, with some of the uint32 hyper-parameters replaced."""
    cfg = AsrConfig.from_file(folder / "config.json")
    base = single_kv(cfg, vocab_metadata(folder, "crispasr"))

    def kv(w) -> None:
        add = w.add_uint32
        w.add_uint32 = lambda key, value: add(key, overrides.get(key, value))
        base(w)

    tensors = [(crispasr_name(n), d, q) for n, (d, q) in encoded.items()]
    return write_file(path, "qwen3asr", kv, tensors)


def test_ten_million_layers_in_the_metadata_are_refused_before_the_model_is_built(untied, small_encoded, tmp_path):
    """Read in a process limited to 3 GiB of data: building that model grew memory without end."""
    import subprocess
    import sys
    import textwrap

    folder, _ = untied
    path = write_single_with(tmp_path / "m.gguf", folder, small_encoded, **{"qwen3asr.llm.n_layers": 10_000_000})
    script = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))
        from dictation.asr.errors import WeightsError
        from dictation.asr.checkpoints.gguf.build import read_gguf
        t0 = time.monotonic()
        try:
            read_gguf({str(path)!r}, "cpu")
        except WeightsError as exc:
            print(round(time.monotonic() - t0, 1), exc)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, message = proc.stdout.strip().split(" ", 1)
    assert float(seconds) < 30
    assert message == (
        f"{path}: the metadata says the text decoder has 10000000 layers, but the tensors hold layers 0 to 1 (2 in all)"
    )


def test_a_hyper_parameter_out_of_range_is_named(untied, small_encoded, tmp_path):
    folder, _ = untied
    path = write_single_with(tmp_path / "m.gguf", folder, small_encoded, **{"qwen3asr.llm.n_heads": 0})
    with pytest.raises(WeightsError, match=r"text\.num_attention_heads is 0; expected 1 to 2147483647"):
        read_gguf(path, "cpu")


def test_nan_in_a_gguf_tensor_is_named(untied, small_encoded, tmp_path):
    folder, _ = untied
    name = "decoder.layers.0.mlp.up_proj.weight"
    data, qtype = small_encoded[name]
    data = data.copy()
    data[1, 2] = np.nan
    path = write_single(tmp_path / "m.gguf", folder, dict(small_encoded, **{name: (data, qtype)}))
    with pytest.raises(WeightsError) as info:
        read_gguf(path, "cpu")
    assert str(info.value) == f"{path}: tensor blk.0.ffn_up.weight holds NaN or infinite values (a damaged download?)"


def test_a_fifo_named_like_a_gguf_file_is_refused_at_once(tmp_path):
    """Reading a FIFO's magic bytes waited for a writer for ever; on a thread, so a regression fails."""
    import threading

    from dictation.asr.checkpoints.hub import is_gguf_path

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    answers = []
    thread = threading.Thread(target=lambda: answers.append((is_gguf(fifo), is_gguf(tmp_path), is_gguf_path(fifo))))
    thread.daemon = True
    thread.start()
    thread.join(30)
    assert answers == [(False, False, False)]
    with pytest.raises(WeightsError, match="not a regular file"):
        read_gguf_file(fifo)
