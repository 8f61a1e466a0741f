"""``dictation convert``: the layouts (hf / original), GGUF (single file and llama.cpp pair), adapters merged
first, and the outputs that appear whole or not at all. On the tiny random checkpoints (tests/conftest.py)."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gguf  # the test extra installs it
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dictation.asr.checkpoints import output as output_module
from dictation.asr.checkpoints.gguf.build import read_gguf
from dictation.asr.checkpoints.gguf.dequant import dequantize_blocks
from dictation.asr.checkpoints.gguf.export import gguf_name, tensor_type
from dictation.asr.checkpoints.gguf.quantize import encode
from dictation.asr.checkpoints.gguf.reader import SUPPORTED_TYPES, read_gguf_file
from dictation.asr.checkpoints.locate import our_name
from dictation.asr.checkpoints.output import ST_DTYPES, write_safetensors
from dictation.asr.config import AsrConfig
from dictation.asr.errors import AdapterError, ModelError
from dictation.asr.tune import convert as convert_module
from dictation.asr.tune.convert import convert
from dictation.asr.tune.writers import write_merged_folder
from tests.oracle import synth_audio
from tests.oracle.checkpoints import cached_checkpoint

QT = gguf.GGMLQuantizationType
AUDIO = synth_audio(2.5, seed=21)
MAX_NEW = 12
QUANTS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def run_cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "dictation", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


def tensors_by_our_name(folder: Path, layout: str) -> dict[str, torch.Tensor]:
    return {our_name(n, layout) or n: t for n, t in load_file(str(folder / "model.safetensors")).items()}


def first_logits_and_ids(engine):
    result = engine.pipeline.run(AUDIO, None, "", MAX_NEW, keep_first_logits=True)
    return result.first_logits, result.ids


def lora_adapter(folder: Path, in_f: int, out_f: int, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    module = "base_model.model.thinker.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{module}.lora_A.weight": torch.randn(4, in_f, generator=g) * 0.3,
        f"{module}.lora_B.weight": torch.randn(out_f, 4, generator=g) * 0.3,
    }
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


# --- the encoders and writers, against the reference implementations ------------------------------------------


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", *QUANTS])
def test_block_encoders_give_gguf_py_bytes(kind):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 256)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block (d = 0)
    x[1, :32] = 0.75  # a constant block
    x[2] *= 1e-4
    x[3, 5] = -40.0  # one outlier, negative (Q4_0 / Q5_0 keep its sign in d)
    x[4, :32] = np.linspace(-1, 1, 32)  # halves where rounding decides
    ours = encode(torch.from_numpy(x), kind).reshape(-1)
    theirs = gguf.quants.quantize(x, QT[kind]).view(np.uint8).reshape(-1)
    assert np.array_equal(ours, theirs)


# sha256 of what ggml's quantize_row_q{4,5,6}_K_ref (llama.cpp ggml/src/ggml-quants.c, commit 01243c5) write for
# k_quant_input(), built with gcc -O2 -ffp-contract=off (C's own float rounding, no fused multiply-adds);
# a -march=native build fuses some, and then differs in a few percent of the blocks either way.
GGML_K_DIGESTS = {
    "Q4_K": "57dcd9e4530dcb585b1000a3dade386bb9fd6f1260a5879d6c86494656631e53",
    "Q5_K": "265fa63499d4353f52a675b58a01441ddf5f5ce96ee0c5167727f82c4dccc01d",
    "Q6_K": "d346f4d536deea0c64a35233508d086eee1798f56f8d285385c6d37126708ee3",
}


def k_quant_input() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    x[0, :256] = 0
    x[1, :256] = 0.25
    x[2, :256] *= 1e-6
    x[3, :256] = np.abs(x[3, :256])
    x[4] = rng.standard_t(3, 512).astype(np.float32) * 0.02
    return x


@pytest.mark.usefixtures("fit_path")  # the numpy fit and the numba one (tests/asr/conftest.py)
@pytest.mark.parametrize("kind", list(GGML_K_DIGESTS))
def test_k_quants_give_ggml_reference_bytes(kind):
    x = k_quant_input()
    raw = encode(torch.from_numpy(x), kind)
    assert hashlib.sha256(raw.tobytes()).hexdigest() == GGML_K_DIGESTS[kind]
    back = gguf.quants.dequantize(raw, QT[kind]).reshape(x.shape)  # gguf-py decodes them (independently of ours)
    assert np.array_equal(back, dequantize_blocks_np(raw, kind).reshape(x.shape))
    error = np.sqrt(((back[5:] - x[5:]) ** 2).mean() / (x[5:] ** 2).mean())
    legacy = {"Q4_K": "Q4_0", "Q5_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
    base = gguf.quants.dequantize(gguf.quants.quantize(x, QT[legacy]), QT[legacy]).reshape(x.shape)
    assert error < np.sqrt(((base[5:] - x[5:]) ** 2).mean() / (x[5:] ** 2).mean()) or kind == "Q6_K"
    assert error < {"Q4_K": 0.075, "Q5_K": 0.038, "Q6_K": 0.019}[kind]  # ggml's: 0.0715, 0.0362, 0.0178 (Gaussian)
    assert np.array_equal(back[0, :256], np.zeros(256, np.float32))


def dequantize_blocks_np(raw: np.ndarray, kind: str) -> np.ndarray:
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    return dequantize_blocks(torch.from_numpy(np.ascontiguousarray(raw).reshape(-1, size)), kind).numpy()


def test_safetensors_writer_writes_the_library_bytes(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "b.weight": torch.randn(3, 5, generator=g).bfloat16(),
        "a.weight": torch.randn(4, generator=g).half(),
        "z.weight": torch.randn(2, 2, generator=g),
        "c.bias": torch.randn(7, generator=g).double(),
        "n.codes": torch.randint(-5, 5, (6,), dtype=torch.int8),
        "e.scalar": torch.tensor(1.5),
    }
    meta = {"format": "pü"}  # one key: the library writes several in a random order (a Rust HashMap)
    save_file(tensors, str(tmp_path / "lib.safetensors"), meta)
    specs = [(n, ST_DTYPES[t.dtype], tuple(t.shape)) for n, t in tensors.items()]
    write_safetensors(tmp_path / "ours.safetensors", specs, tensors.__getitem__, meta)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "lib.safetensors").read_bytes()


# --- layouts --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_original_to_hf_equals_the_hf_twin_and_back_is_bit_identical(ckpt_root, tmp_path, tie):
    source = cached_checkpoint(ckpt_root, tie_word_embeddings=tie)
    twin = cached_checkpoint(ckpt_root, tie_word_embeddings=tie, layout="hf")
    hf = convert(source, "hf", tmp_path / "hf")[0]
    # the -hf twin is the same model written in that layout by the tests (checked against transformers 5)
    assert (hf / "model.safetensors").read_bytes() == (twin / "model.safetensors").read_bytes()
    for name in ("chat_template.jinja", "generation_config.json", "processor_config.json", "config.json"):
        ours, theirs = (hf / name).read_text(), (twin / name).read_text()
        if name.endswith(".json"):
            ours, theirs = json.loads(ours), json.loads(theirs)
            ours.pop("support_languages", None), theirs.pop("transformers_version", None)
        assert ours == theirs, name
    assert AsrConfig.from_file(hf / "config.json") == replace(AsrConfig.from_file(source / "config.json"), layout="hf")
    back = convert(hf, "original", tmp_path / "back")[0]
    if not tie:  # a tied original stores an unused, different head; -hf drops it (transformers 5 would use it)
        assert (back / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (back / name).read_bytes() == (source / name).read_bytes()
    assert not (back / "processor_config.json").exists() and not (back / "chat_template.jinja").exists()
    again = convert(back, "hf", tmp_path / "again")[0]
    assert (again / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    assert (again / "config.json").read_bytes() == (hf / "config.json").read_bytes()


def test_the_original_config_reads_as_the_source_in_the_official_classes(ckpt_untied, tmp_path):
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRConfig

    hf = convert(ckpt_untied, "hf", tmp_path / "hf")[0]
    back = convert(hf, "original", tmp_path / "back")[0]
    a = Qwen3ASRConfig.from_pretrained(ckpt_untied).thinker_config.to_dict()
    b = Qwen3ASRConfig.from_pretrained(back).thinker_config.to_dict()
    for part in ("audio_config", "text_config"):
        a[part].pop("dtype", None), b[part].pop("dtype", None)
    a.pop("dtype", None), b.pop("dtype", None)
    assert a == b


def test_the_hf_output_runs_in_transformers5_as_the_source(ckpt_untied, tmp_path):
    from tests.oracle.official import hf_native_outputs, oracle_for
    from tests.oracle.test_oracle import transformers5_path

    hf = convert(ckpt_untied, "hf", tmp_path / "hf", type_name="F32")[0]
    native = hf_native_outputs(hf, [AUDIO], transformers5_path=transformers5_path(), max_new_tokens=MAX_NEW)
    oracle = oracle_for(ckpt_untied)
    got = native["results"][0]
    assert native["tied"] is False
    assert got["prompt_ids"] == oracle.prompt_ids(AUDIO)
    torch.testing.assert_close(
        torch.tensor(got["first_step_logits"]), oracle.first_step_logits(AUDIO), rtol=1e-5, atol=1e-4
    )
    assert got["greedy_ids"] == oracle.greedy_ids(AUDIO, max_new_tokens=MAX_NEW)


def test_type_casts_and_adapters_merge_as_merge_lora_does(ckpt_untied, tmp_path):
    adapter = lora_adapter(tmp_path / "lora", 64, 2048)
    merged = write_merged_folder(ckpt_untied, [f"{adapter}:0.5"], tmp_path / "merged")
    out = convert(ckpt_untied, "original", tmp_path / "out", adapters=[f"{adapter}:0.5"])[0]
    ours, theirs = tensors_by_our_name(out, "thinker"), tensors_by_our_name(merged, "thinker")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[n], theirs[n]) for n in ours)
    assert not torch.equal(ours["decoder.layers.0.self_attn.q_proj.weight"], load_file(
        str(ckpt_untied / "model.safetensors"))["thinker.model.layers.0.self_attn.q_proj.weight"])  # fmt: skip
    half = convert(ckpt_untied, "hf", tmp_path / "bf16", type_name="bf16")[0]
    cast = tensors_by_our_name(half, "hf")
    source = tensors_by_our_name(ckpt_untied, "thinker")
    assert all(cast[n].dtype == torch.bfloat16 and torch.equal(cast[n], source[n].bfloat16()) for n in source)
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"


# --- GGUF -----------------------------------------------------------------------------------------------------


def test_f32_gguf_transcribes_to_the_source_ids(ckpt_untied, engine_factory, tmp_path):
    path = convert(ckpt_untied, "gguf", tmp_path / "m.gguf", type_name="F32")[0]
    model = read_gguf(path)
    source = tensors_by_our_name(ckpt_untied, "thinker")
    assert model.layout == "qwen3asr" and model.tensors.keys() == source.keys()
    assert all(torch.equal(model.tensors[n], source[n]) for n in source)
    want_logits, want_ids = first_logits_and_ids(engine_factory(ckpt_untied))
    got_logits, got_ids = first_logits_and_ids(engine_factory(path))
    assert got_ids == want_ids and len(want_ids) == MAX_NEW
    assert torch.equal(got_logits, want_logits)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "qwen3asr"
    assert reader.fields["tokenizer.ggml.tokens"].contents()[151676] == "<|audio_pad|>"


@pytest.mark.parametrize("kind", ["F16", "BF16", *QUANTS, "Q4_K", "Q6_K"])
def test_every_type_holds_gguf_py_bytes_and_reads_back(ckpt_tied, tmp_path, kind):
    """(gguf-py's reader opens our files: test_f32_gguf_transcribes_to_the_source_ids; it takes ~7 s per file to
    index the vocabulary, so the other files are checked with our parser against gguf-py's (de)quantizers.)"""
    path = convert(ckpt_tied, "gguf", tmp_path / f"m-{kind}.gguf", type_name=kind)[0]
    raw = read_gguf_file(path)
    model = read_gguf(path)
    source = tensors_by_our_name(ckpt_tied, "thinker")
    head, embed = raw.tensors["output.weight"], raw.tensors["token_embd.weight"]  # tied: a copy (CrispASR needs it)
    kind_ = SUPPORTED_TYPES[embed.ggml_type]
    assert head.type_name == embed.type_name and np.array_equal(raw.raw(head, kind_), raw.raw(embed, kind_))
    assert "lm_head.weight" not in model.tensors  # read_gguf ties a head that copies the embeddings
    assert model.cfg == replace(AsrConfig.from_file(ckpt_tied / "config.json"), support_languages=())
    for ours, tensor in model.tensors.items():
        t = raw.tensors[gguf_name(ours, "single")]
        stored = tensor_type(ours, tuple(tensor.shape), kind)
        assert t.type_name == stored, ours
        data = np.asarray(raw.raw(t, SUPPORTED_TYPES[t.ggml_type]))
        if stored in GGML_K_DIGESTS:  # gguf-py has no K-quant quantizer: ours (test_k_quants_give_ggml_reference_bytes)
            want = encode(source[ours], stored).reshape(-1)
        else:
            want = gguf.quants.quantize(source[ours].numpy(), QT[stored])
        assert np.array_equal(data, want.view(np.uint8).reshape(-1)), ours
        expected = gguf.quants.dequantize(want, QT[stored]).reshape(tensor.shape)
        assert np.array_equal(tensor.numpy(), expected), ours
    if kind == "Q4_K":  # rows of 256: Q4_K; the other decoder matrices what llama.cpp stores instead
        assert raw.tensors["blk.0.attn_output.weight"].type_name == "Q4_K"
        assert raw.tensors["blk.0.ffn_up.weight"].type_name == "Q5_0"
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # >= 8 bits outside the decoder's layers
        assert raw.tensors["token_embd.weight"].type_name == "Q8_0"
        assert raw.tensors["audio.blk.0.attn_q.weight"].type_name == "Q8_0"
        assert raw.tensors["blk.0.ffn_up.weight"].type_name == kind


def test_quantized_gguf_agrees_with_the_source_within_its_error(ckpt_untied, engine_factory, tmp_path):
    want_logits, _ = first_logits_and_ids(engine_factory(ckpt_untied))
    cosines = {}
    for kind in ("Q8_0", "Q4_0"):
        path = convert(ckpt_untied, "gguf", tmp_path / f"{kind}.gguf", type_name=kind)[0]
        got, _ = first_logits_and_ids(engine_factory(path))
        cosines[kind] = float(torch.nn.functional.cosine_similarity(got, want_logits, dim=0))
    assert cosines["Q8_0"] > 0.995 and cosines["Q4_0"] > 0.85, cosines  # measured: 0.998, 0.93
    assert cosines["Q8_0"] > cosines["Q4_0"]


def test_the_pair_reads_back_as_the_single_file(ckpt_untied, tmp_path):
    text, mmproj = convert(ckpt_untied, "gguf", tmp_path / "pair" / "m.gguf", type_name="Q8_0", gguf_layout="pair")
    assert mmproj.name == "mmproj-m.gguf"
    single = read_gguf(convert(ckpt_untied, "gguf", tmp_path / "one.gguf", type_name="Q8_0")[0])
    pair = read_gguf(text)
    assert pair.layout == "llama.cpp" and pair.cfg == single.cfg
    conv = {n for n in single.tensors if n.startswith("audio_tower.conv") and n.endswith(".weight")}
    assert all(torch.equal(pair.tensors[n], single.tensors[n]) for n in single.tensors.keys() - conv)
    source = tensors_by_our_name(ckpt_untied, "thinker")  # the mmproj's conv kernels: F16, as llama.cpp's
    assert all(pair.source_types[n] == "F16" and torch.equal(pair.tensors[n], source[n].half().float()) for n in conv)
    assert single.source_types["audio_tower.conv_out.weight"] == "Q8_0"
    projector = gguf.GGUFReader(mmproj)
    assert projector.fields["clip.audio.projector_type"].contents() == "qwen3a"
    assert {t.name for t in projector.tensors} >= {"a.conv2d.1.bias", "mm.a.mlp.2.weight", "a.position_embd.weight"}
    assert read_gguf_file(text).architecture == "qwen3vl"


def test_an_adapter_is_merged_into_the_gguf(ckpt_untied, engine_factory, tmp_path):
    adapter = lora_adapter(tmp_path / "lora", 64, 2048, seed=1)
    # convert --to original merges as merge-lora does (test_type_casts_and_adapters_merge_as_merge_lora_does)
    merged = convert(ckpt_untied, "original", tmp_path / "merged", adapters=[str(adapter)])[0]
    path = convert(ckpt_untied, "gguf", tmp_path / "m.gguf", adapters=[str(adapter)], type_name="F32")[0]
    expected = tensors_by_our_name(merged, "thinker")
    got = read_gguf(path).tensors
    assert got.keys() == expected.keys() and all(torch.equal(got[n], t) for n, t in expected.items())
    q = "decoder.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], tensors_by_our_name(ckpt_untied, "thinker")[q])


def test_two_stacked_adapters_are_both_merged_into_the_gguf(ckpt_untied, tmp_path):
    """W + (alpha / r) B1 A1 + (alpha / r) B2 A2 (PEFT's merge), computed here; merging one of them fails."""
    first, second = lora_adapter(tmp_path / "a", 64, 2048, seed=2), lora_adapter(tmp_path / "b", 64, 2048, seed=3)
    path = convert(ckpt_untied, "gguf", tmp_path / "m.gguf", adapters=[str(first), str(second)], type_name="F32")[0]
    q = "decoder.layers.0.self_attn.q_proj.weight"
    module = "base_model.model.thinker.model.layers.0.self_attn.q_proj"
    delta = []
    for folder in (first, second):
        lora = load_file(str(folder / "adapter_model.safetensors"))
        delta.append(2.0 * lora[f"{module}.lora_B.weight"] @ lora[f"{module}.lora_A.weight"])  # alpha 8 / r 4
    base = tensors_by_our_name(ckpt_untied, "thinker")[q]
    got = read_gguf(path).tensors[q]
    torch.testing.assert_close(got, base + delta[0] + delta[1], rtol=0, atol=1e-5)
    assert (got - (base + delta[0])).abs().max() > 0.1 and (got - (base + delta[1])).abs().max() > 0.1


# --- bad input: one clear error, nothing left behind ----------------------------------------------------------


def test_bad_input_is_one_error_and_leaves_nothing(ckpt_untied, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ModelError, match="Q2_K.*choose one of F32, F16, BF16, Q8_0"):
        convert(ckpt_untied, "gguf", out / "m.gguf", type_name="Q2_K")
    with pytest.raises(ModelError, match="Q8_0 is not available for --to hf"):
        convert(ckpt_untied, "hf", out, type_name="Q8_0")
    wrong = lora_adapter(tmp_path / "wrong", 96, 2048)
    with pytest.raises(AdapterError, match="trained for a different model"):
        convert(ckpt_untied, "gguf", out / "m.gguf", adapters=[str(wrong)])
    assert not out.exists()
    out.mkdir()
    (out / "m.gguf").write_bytes(b"mine")
    with pytest.raises(ModelError, match="already exists"):
        convert(ckpt_untied, "gguf", out / "m.gguf")
    with pytest.raises(ModelError, match="already exists"):
        convert(ckpt_untied, "hf", out)
    (out / "mmproj-t.gguf").touch()
    with pytest.raises(ModelError, match="mmproj-t.gguf: already exists"):  # the pair's second file exists
        convert(ckpt_untied, "gguf", out / "t.gguf", gguf_layout="pair")
    assert sorted(p.name for p in out.iterdir()) == ["m.gguf", "mmproj-t.gguf"]
    assert (out / "m.gguf").read_bytes() == b"mine"


@pytest.mark.parametrize("to", ["gguf", "hf"])
def test_a_full_disk_is_one_error_and_leaves_nothing(ckpt_untied, tmp_path, monkeypatch, to):
    """The file being written is /dev/full (writes fail with ENOSPC, as on a full disk)."""
    real_open = builtins.open

    def full_open(path, mode="r", *args, **kwargs):
        if "w" in mode and ".partial-" in str(path):
            Path(path).touch()  # the temporary file exists, as it would
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(convert_module, "open", full_open, raising=False)
    monkeypatch.setattr(output_module, "open", full_open, raising=False)
    target = tmp_path / ("m.gguf" if to == "gguf" else "hf")
    with pytest.raises(ModelError, match="the disk is full") as info:
        convert(ckpt_untied, to, target)
    assert str(target) in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_an_interruption_leaves_nothing(ckpt_untied, tmp_path):
    def interrupt(done, total):
        if done == 5:
            raise KeyboardInterrupt

    for to, target in (("gguf", tmp_path / "m.gguf"), ("original", tmp_path / "orig")):
        with pytest.raises(KeyboardInterrupt):
            convert(ckpt_untied, to, target, on_progress=interrupt)
    assert list(tmp_path.iterdir()) == []


def test_the_command_line(ckpt_untied, tmp_path):
    proc = run_cli("convert", "--model", ckpt_untied, "--to", "gguf", "--type", "q8_0", "--out", tmp_path / "m.gguf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "m.gguf")
    proc = run_cli("convert", "--model", ckpt_untied, "--to", "gguf", "--type", "Q8_0", "--out", tmp_path / "m.gguf")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"dictation: error: {tmp_path / 'm.gguf'}: already exists; choose a "
                                                "new output path (nothing is overwritten)"]  # fmt: skip
