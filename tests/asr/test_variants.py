"""The engine with quantized variants, GGUF files and adapters together; the quantize and merge-lora
commands. (Quantized layers alone: test_quant.py; adapters against peft: test_adapters.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dictation.asr import AdapterError, AsrEngine, AsrError, EngineOptions, WeightsError
from dictation.asr.nn.quantized import QUANT_MODULES
from dictation.asr.tune.quantize import quantize_model
from dictation.asr.tune.writers import write_quantized_folder
from tests.oracle import synth_audio
from tests.test_cli import assert_one_line_error, run_cli_here

AUDIO = synth_audio(2.5, seed=41)
MAX_NEW = 12
DECODER_Q = "base_model.model.thinker.model.layers.{i}.self_attn.q_proj"
AUDIO_FC1 = "base_model.model.thinker.audio_tower.layers.0.fc1"


def engine(model, **options):
    options.setdefault("device", "cpu")
    options.setdefault("dtype", "fp32")
    e = AsrEngine(EngineOptions(model=str(model), **options))
    e.prepare()
    return e


def run(e):
    result = e.pipeline.run(AUDIO, None, "", MAX_NEW, keep_first_logits=True)
    return result.first_logits, result.ids


def write_adapter(folder, *, seed=0, dora=False, rank=4, q_shape=(2048, 64), layers=(0, 1), encoder=True):
    """A PEFT-format adapter on decoder q_proj layers (and the encoder's fc1), random non-zero B."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    tensors = {}
    modules = [(DECODER_Q.format(i=i), q_shape) for i in layers] + ([(AUDIO_FC1, (256, 128))] if encoder else [])
    for name, (out_f, in_f) in modules:
        tensors[f"{name}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * 0.2
        tensors[f"{name}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * 0.2
        if dora:
            tensors[f"{name}.lora_magnitude_vector"] = 1 + torch.rand(out_f, generator=g)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "use_dora": dora,
        "target_modules": ["q_proj", "fc1"],
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a": write_adapter(root / "a", seed=1),
        "b": write_adapter(root / "b", seed=2, dora=True),
        "c": write_adapter(root / "c", seed=3, layers=(1,), encoder=False),
    }


@pytest.fixture(scope="module")
def prequantized(ckpt_untied, tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    return {v: write_quantized_folder(ckpt_untied, root / v, v) for v in ("int8", "int4")}


# --- variants --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_a_variant_quantizes_at_load_and_equals_the_prequantized_folder(ckpt_untied, prequantized, variant):
    at_load = engine(ckpt_untied, variant=variant)
    folder = engine(prequantized[variant])
    float_engine = engine(ckpt_untied)
    assert at_load.variant == folder.variant == variant
    assert f"· {variant} ·" in at_load.model_label and f"· {variant} ·" in folder.model_label
    assert at_load.weight_bytes == folder.weight_bytes < float_engine.weight_bytes
    assert sum(isinstance(m, QUANT_MODULES) for m in at_load.model.modules()) == 2 * 7
    logits_a, ids_a = run(at_load)
    logits_b, ids_b = run(folder)
    assert torch.equal(logits_a, logits_b) and ids_a == ids_b
    assert at_load.transcribe(AUDIO, max_new_tokens=4).token_ids == ids_a[:4]


def test_the_variant_of_a_prequantized_folder_wins_over_the_request(prequantized):
    e = engine(prequantized["int4"], variant="int8")
    assert e.variant == "int4"


def test_an_unknown_variant_is_refused(ckpt_untied):
    with pytest.raises(AsrError, match="unknown variant 'int3'"):
        engine(ckpt_untied, variant="int3")


# --- adapters with quantized weights ----------------------------------------------------------------


def test_adapters_merge_in_fp32_before_load_time_quantization(ckpt_untied, adapters, tmp_path):
    """base + adapter, quantized at load == the merged model (merge-lora, fp32) quantized at load."""
    merged = tmp_path / "merged"
    proc = run_cli_here("merge-lora", "--model", ckpt_untied, "--adapter", adapters["a"], "--out", merged)
    assert proc.returncode == 0, proc.stderr
    with_adapter = engine(ckpt_untied, variant="int8", adapters=[str(adapters["a"])])
    from_merged = engine(merged, variant="int8")
    assert torch.equal(run(with_adapter)[0], run(from_merged)[0])
    # the decoder layer the adapter touches is quantized from the merged weights, not run unmerged
    layer = with_adapter.model.decoder.layers[0].self_attn.q_proj
    assert isinstance(layer, QUANT_MODULES)


def test_changing_adapters_on_a_quantized_model_equals_a_fresh_load(ckpt_untied, adapters):
    e = engine(ckpt_untied, variant="int4", adapters=[str(adapters["a"])])
    with_a = run(e)[0]
    e.set_adapters([])
    torch.testing.assert_close(run(e)[0], run(engine(ckpt_untied, variant="int4"))[0], atol=0, rtol=0)
    e.set_adapters([str(adapters["a"])])
    assert torch.equal(run(e)[0], with_a)


def test_adapters_run_unmerged_beside_prequantized_layers(ckpt_untied, prequantized, adapters):
    """A pre-quantized base: adapters run next to the integer layers; close to merging first."""
    from dictation.asr.tune.adapters import LoraLinear

    spec = [str(adapters["b"]), f"{adapters['c']}:0.5"]
    e = engine(prequantized["int8"], adapters=spec)
    layer = e.model.decoder.layers[1].self_attn.q_proj
    assert isinstance(layer, LoraLinear) and isinstance(layer.base, LoraLinear)  # two adapters stacked
    unmerged, _ = run(e)
    merged_first, _ = run(engine(ckpt_untied, variant="int8", adapters=spec))
    base, _ = run(engine(prequantized["int8"]))
    scale = float(merged_first.abs().max())
    assert float((unmerged - merged_first).abs().max()) < 0.05 * scale  # quantization noise only
    assert float((unmerged - base).abs().max()) > float((unmerged - merged_first).abs().max())
    e.set_adapters([])
    assert torch.equal(run(e)[0], base)  # the wrappers are gone again


def test_stacked_adapters_equal_sequential_merges(ckpt_untied, adapters, tmp_path):
    """[A, B] on the base == B on (the base with A merged into it), for LoRA then DoRA."""
    first = tmp_path / "first"
    assert (
        run_cli_here("merge-lora", "--model", ckpt_untied, "--adapter", adapters["a"], "--out", first).returncode == 0
    )
    stacked, _ = run(engine(ckpt_untied, adapters=[str(adapters["a"]), str(adapters["b"])]))
    sequential, _ = run(engine(first, adapters=[str(adapters["b"])]))
    torch.testing.assert_close(stacked, sequential, atol=1e-4 * float(stacked.abs().max()), rtol=0)


# --- merge-lora and quantize commands ----------------------------------------------------------------


def test_merge_lora_writes_a_standalone_folder_that_loads_like_the_adapter(ckpt_untied, adapters, tmp_path):
    out = tmp_path / "merged"
    proc = run_cli_here(
        "merge-lora",
        "--model",
        ckpt_untied,
        "--adapter",
        adapters["a"],
        "--adapter",
        f"{adapters['b']}:0.5",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    expected_files = {p.name for p in ckpt_untied.iterdir() if not p.name.startswith("model")} | {"model.safetensors"}
    assert {p.name for p in out.iterdir()} == expected_files
    assert json.loads((out / "config.json").read_text()) == json.loads((ckpt_untied / "config.json").read_text())
    merged, ids = run(engine(out))
    direct, direct_ids = run(engine(ckpt_untied, adapters=[str(adapters["a"]), f"{adapters['b']}:0.5"]))
    torch.testing.assert_close(merged, direct, atol=1e-5 * float(direct.abs().max()), rtol=0)
    assert ids == direct_ids


def test_merge_lora_refuses_an_adapter_for_another_model(ckpt_untied, tmp_path):
    wide = write_adapter(tmp_path / "wide", q_shape=(2048, 128), encoder=False)
    proc = run_cli_here("merge-lora", "--model", ckpt_untied, "--adapter", wide, "--out", tmp_path / "out")
    assert_one_line_error(
        proc,
        str(wide),
        "decoder.layers.0.self_attn.q_proj is 2048x64 (out x in) in the loaded model",
        "but 2048x128 in the adapter",
    )
    assert not (tmp_path / "out").exists()


def test_quantize_command_and_transcribe_with_a_variant(ckpt_untied, tmp_path):
    from dictation.audio.wav import write_wav

    out = tmp_path / "int8"
    proc = run_cli_here("quantize", "--model", ckpt_untied, "--variant", "int8", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["quantization_config"]["variant"] == "int8"
    wav = tmp_path / "a.wav"
    write_wav(wav, AUDIO, 16000)
    # Both in float32: `quantize` quantizes the stored float32 values, a load quantizes them as the model
    # holds them (bfloat16 by default on a CPU with bf16 instructions: other integers from this float32
    # checkpoint, the same ones from a bf16 checkpoint such as Qwen's).
    common = ("--device", "cpu", "--dtype", "fp32", "--json", "--max-new-tokens", "4")
    a = run_cli_here("transcribe", wav, "--model", out, *common)
    b = run_cli_here("transcribe", wav, "--model", ckpt_untied, "--variant", "int8", *common)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["token_ids"] == rb["token_ids"] and "int8" in ra["model"] and "int8" in rb["model"]
    again = run_cli_here("quantize", "--model", ckpt_untied, "--variant", "int8", "--out", out)
    assert_one_line_error(again, str(out))


def test_transcribe_with_a_bad_adapter_is_one_line(ckpt_untied, tmp_path):
    from dictation.audio.wav import write_wav

    wav = tmp_path / "a.wav"
    write_wav(wav, AUDIO, 16000)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"peft_type": "IA3"}')
    proc = run_cli_here("transcribe", wav, "--model", ckpt_untied, "--device", "cpu", "--adapter", bad)
    assert_one_line_error(proc, f"{bad}/adapter_config.json: peft_type is 'IA3'")


# --- GGUF through the engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_file(ckpt_untied, tmp_path_factory):
    from tests.asr.test_gguf import encode_all, our_tensors, write_single

    encoded, _ = encode_all(our_tensors(ckpt_untied), lambda name, shape: "F32")
    return write_single(tmp_path_factory.mktemp("gguf") / "qwen3-asr-tiny-f32.gguf", ckpt_untied, encoded)


def test_a_gguf_file_transcribes_like_its_safetensors_model(ckpt_untied, gguf_file, adapters):
    e = engine(gguf_file)
    assert e.model_label == "qwen3-asr-tiny-f32 · fp32 · cpu"
    logits, ids = run(e)
    ref_logits, ref_ids = run(engine(ckpt_untied))
    torch.testing.assert_close(logits, ref_logits, atol=1e-5 * float(ref_logits.abs().max()), rtol=0)
    assert ids == ref_ids
    # re-quantized to int8 at load, with an adapter: the same as the safetensors model the same way
    q = engine(gguf_file, variant="int8", adapters=[str(adapters["a"])])
    ref_q = engine(ckpt_untied, variant="int8", adapters=[str(adapters["a"])])
    assert torch.equal(run(q)[0], run(ref_q)[0])


def test_an_unknown_gguf_tensor_type_is_named(ckpt_untied, tmp_path):
    import numpy as np

    from tests.asr.test_gguf import QT, encode_all, our_tensors, write_single

    ours = our_tensors(ckpt_untied)
    encoded, _ = encode_all(ours, lambda name, shape: "F32")
    name = "decoder.layers.0.mlp.down_proj.weight"
    rows, cols = ours[name].shape
    # Q2_K blocks: 256 values in 84 bytes; rows of 128 values are not whole blocks, so the raw bytes are
    # laid out as for a 256-wide row (the loader must refuse the type before it looks at the shape)
    encoded[name] = (np.zeros((rows, 84 * cols // 256 if cols >= 256 else 84), dtype=np.uint8), QT.Q2_K)
    path = write_single(tmp_path / "bad.gguf", ckpt_untied, encoded)
    with pytest.raises(WeightsError) as info:
        engine(path)
    assert str(path) in str(info.value) and "Q2_K" in str(info.value)


def test_a_wrong_base_adapter_names_the_first_mismatch_and_leaves_the_model(ckpt_untied, adapters, tmp_path):
    e = engine(ckpt_untied, adapters=[str(adapters["a"])])
    before = run(e)
    wide = write_adapter(tmp_path / "wide", q_shape=(2048, 128), encoder=False)
    with pytest.raises(AdapterError, match=r"decoder\.layers\.0\.self_attn\.q_proj is 2048x64 \(out x in\)"):
        e.set_adapters([str(adapters["c"]), str(wide)])
    after = run(e)
    assert torch.equal(before[0], after[0]) and before[1] == after[1]


def test_quantize_model_is_what_the_engine_runs(ckpt_untied):
    """The engine's int8 model is quantize_model of the float model (nothing else changes)."""
    e = engine(ckpt_untied, variant="int8")
    float_model = engine(ckpt_untied).model
    quantize_model(float_model, "int8")
    for (name, a), (_, b) in zip(e.model.state_dict().items(), float_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("variant", "dtype"), [("int8", "fp32"), ("int4", "fp32"), ("int8", "bf16")])
def test_a_float_folder_loaded_as_a_variant_never_allocates_the_float_decoder(ckpt_untied, monkeypatch, variant, dtype):
    """Quantized as it is read: when the model's storage is allocated (safetensors.allocate) the decoder's linear
    layers are already integer layers, and the result is still quantize_model of the float model."""
    from dictation.asr.checkpoints import safetensors

    allocated = []
    allocate = safetensors.allocate

    def spy(module, device):
        allocated.extend(n for n, m in module.decoder.named_modules() if isinstance(m, torch.nn.Linear))
        return allocate(module, device)

    monkeypatch.setattr(safetensors, "allocate", spy)
    e = engine(ckpt_untied, variant=variant, dtype=dtype)
    assert allocated == []
    monkeypatch.setattr(safetensors, "allocate", allocate)
    float_model = engine(ckpt_untied, dtype=dtype).model
    quantize_model(float_model, variant)
    for (name, a), (_, b) in zip(e.model.state_dict().items(), float_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("source", ["prequantized int8", "prequantized int4", "at load int8", "at load int4"])
def test_fused_quantized_projections_are_loaded_in_place(ckpt_untied, prequantized, source):
    """q/k/v and gate/up load straight into the fused layer's tensors: the fusion adopts them (no
    concatenated second copy of the decoder's integer weights, at the load's peak)."""
    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.config import AsrConfig

    kind, variant = source.rsplit(" ", 1)
    folder = prequantized[variant] if kind == "prequantized" else ckpt_untied
    cfg = AsrConfig.from_file(folder / "config.json")
    with torch.no_grad():
        model = load_model(
            folder, cfg, torch.device("cpu"), torch.float32, quantize=variant if kind == "at load" else None
        )
    tensor = "weight" if variant == "int8" else "qweight"
    loaded = [getattr(model.decoder.layers[i].self_attn.q_proj, tensor).data_ptr() for i in range(2)]
    loaded += [getattr(model.decoder.layers[i].mlp.gate_proj, tensor).data_ptr() for i in range(2)]
    model.sync_weights()
    fused = [getattr(model.decoder.layers[i].self_attn.fusion.layer, tensor).data_ptr() for i in range(2)]
    fused += [getattr(model.decoder.layers[i].mlp.fusion.layer, tensor).data_ptr() for i in range(2)]
    assert fused == loaded


def test_the_settings_check_accepts_adapters_for_prequantized_and_gguf_models(prequantized, gguf_file, adapters):
    from dictation.asr.checkpoints.hub import check_model_folder
    from dictation.asr.tune.adapter_files import check_adapter

    for variant in ("int8", "int4"):
        assert check_model_folder(prequantized[variant]) is None
        assert check_adapter(adapters["a"], prequantized[variant]) is None
    assert check_model_folder(gguf_file) is None and check_model_folder(gguf_file.parent) is None
    assert check_adapter(adapters["a"], gguf_file) is None


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_auto_dtype_of_a_quantized_model_on_cpu_follows_the_bf16_instructions(ckpt_untied, monkeypatch, bf16_cpu):
    from dictation.asr.nn.options import ModelOptions

    options = ModelOptions(cpu_bf16_compute=bf16_cpu)
    quantized = engine(ckpt_untied, variant="int8", dtype="auto", model_options=options)
    assert quantized.model.dtype == (torch.bfloat16 if bf16_cpu else torch.float32)
    assert engine(ckpt_untied, dtype="auto").model.dtype == torch.float32  # a float model stays fp32 on CPU
    assert engine(ckpt_untied, variant="int8", dtype="fp32").model.dtype == torch.float32  # as asked


def test_skip_bad_adapters_loads_the_model_without_them_and_names_each(ckpt_untied, prequantized, adapters, tmp_path):
    """The app's load (skip_bad_adapters): an adapter that cannot be read, one for another base, and one
    that cannot be applied to this variant (it replaces a q_proj, which is int8 in a pre-quantized
    folder) are left out and named in list order; the good one is applied. The CLI's strict load refuses
    the first."""
    from safetensors.torch import save_file

    saves_q = write_adapter(tmp_path / "saves-q", seed=6, layers=(0,), encoder=False)
    config = json.loads((saves_q / "adapter_config.json").read_text())
    config["modules_to_save"] = ["layers.1.self_attn.q_proj"]
    (saves_q / "adapter_config.json").write_text(json.dumps(config))
    tensors = {
        "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
        "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(2048, 4),
        "base_model.model.thinker.model.layers.1.self_attn.q_proj.weight": torch.zeros(2048, 64),
    }
    save_file(tensors, str(saves_q / "adapter_model.safetensors"))
    wide = write_adapter(tmp_path / "wide", q_shape=(2048, 128), encoder=False)
    missing = tmp_path / "missing"
    specs = [str(missing), str(adapters["a"]), str(wide) + ":0.5", str(saves_q)]

    e = AsrEngine(EngineOptions(model=str(prequantized["int8"]), device="cpu", adapters=specs, skip_bad_adapters=True))
    e.prepare()
    assert [spec for spec, _ in e.skipped_adapters] == [str(missing), str(wide) + ":0.5", str(saves_q)]
    reasons = [reason for _, reason in e.skipped_adapters]
    assert reasons[0] == f"{missing}: no such folder"
    assert "trained for a different model" in reasons[1]
    assert reasons[2] == (
        f"{saves_q}: replaces decoder.layers.1.self_attn.q_proj.weight, which is quantized in this model; "
        "use a floating-point variant with this adapter"
    )
    assert e.options.adapters == (str(adapters["a"]),)
    assert e.model_label.endswith(" · a")
    assert len(e.transcribe(synth_audio(1.0, seed=2), max_new_tokens=3).token_ids) == 3

    strict = AsrEngine(EngineOptions(model=str(prequantized["int8"]), device="cpu", adapters=specs))
    with pytest.raises(AdapterError, match=f"^{missing}: no such folder$"):
        strict.prepare()
