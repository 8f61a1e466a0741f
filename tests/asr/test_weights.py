"""Loading: layouts, dtypes, strict tensor checks and clear errors naming file and tensor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from dictation.asr import AsrEngine, AsrError, EngineOptions, ModelError, WeightsError
from dictation.asr.config import AsrConfig
from tests.asr.mapped import mapped_files
from tests.oracle import synth_audio
from tests.oracle.checkpoints import cached_checkpoint


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def load(folder, dtype="fp32"):
    engine = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype=dtype))
    engine.prepare()
    return engine


def rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))
    return path


def test_missing_tensor_names_file_tensor_and_shape(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    path = rewrite(folder, lambda t: t.pop("thinker.model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(WeightsError) as info:
        load(folder)
    msg = str(info.value)
    assert str(path) in msg and "missing tensor thinker.model.layers.1.self_attn.k_norm.weight" in msg
    assert "(128,)" in msg


def test_unexpected_tensor_is_an_error(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    path = rewrite(folder, lambda t: t.__setitem__("thinker.model.layers.0.mlp.extra.weight", torch.zeros(2)))
    with pytest.raises(WeightsError, match="unexpected tensor thinker.model.layers.0.mlp.extra.weight") as info:
        load(folder)
    assert str(path) in str(info.value)


def test_misshaped_tensor_names_expected_and_actual(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    name = "thinker.audio_tower.proj1.weight"

    def shrink(t):
        t[name] = t[name][:, :-1].contiguous()

    path = rewrite(folder, shrink)
    with pytest.raises(WeightsError) as info:
        load(folder)
    msg = str(info.value)
    assert str(path) in msg and name in msg
    d = AsrConfig.from_file(folder / "config.json").audio.d_model
    assert f"has shape ({d}, {d - 1}), expected ({d}, {d})" in msg


def test_missing_shard_is_named(ckpt_root, tmp_path):
    folder = copy_ckpt(cached_checkpoint(ckpt_root, shards=3), tmp_path / "m")
    victim = sorted(folder.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(WeightsError, match=f"{victim}: shard listed in model.safetensors.index.json is missing"):
        load(folder)


@pytest.mark.parametrize("outside", ["../outside/{name}", "{abs}", "sub/../../outside/{name}"])
def test_shard_index_naming_a_file_outside_the_folder_is_refused(ckpt_root, tmp_path, outside):
    # The shard really exists out there with the right tensors: without the check, the model loads from it.
    folder = copy_ckpt(cached_checkpoint(ckpt_root, shards=3), tmp_path / "m")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    (tmp_path / "outside").mkdir()
    moved = shard.rename(tmp_path / "outside" / shard.name)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    escape = outside.format(name=shard.name, abs=moved)
    index["weight_map"] = {k: escape if v == shard.name else v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightsError) as info:
        load(folder)
    assert str(info.value) == (
        f"{index_path}: shard {escape!r} is not a file name in the model folder; refusing the index"
    )


def test_shard_index_with_a_non_string_shard_is_refused(ckpt_root, tmp_path):
    folder = copy_ckpt(cached_checkpoint(ckpt_root, shards=3), tmp_path / "m")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = 7
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=r"shard 7 is not a file name in the model folder"):
        load(folder)


def test_pickle_checkpoint_is_refused(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="pytorch_model.bin: pickle checkpoints are refused because loading"):
        load(folder)


def test_folder_without_weights(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no model.safetensors or model.safetensors.index.json"):
        load(folder)


def test_not_a_qwen3_asr_folder(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ModelError, match="not a Qwen3-ASR config"):
        load(folder)
    (folder / "config.json").unlink()
    with pytest.raises(ModelError, match="config.json: missing"):
        load(folder)


def test_corrupt_safetensors_is_named(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(WeightsError, match="model.safetensors: not a readable safetensors file"):
        load(folder)


def test_missing_folder_and_uncached_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="no such model folder"):
        load(tmp_path / "nowhere")
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        load("Qwen/Qwen3-ASR-1.7B")


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_load(ckpt_untied, tmp_path, stored):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    rewrite(folder, lambda t: t.update({k: v.to(stored) for k, v in t.items()}))
    engine = load(folder)  # stored bf16/fp16, computed in fp32 on CPU
    ref = load(ckpt_untied)
    assert engine.model.dtype == torch.float32
    w, w_ref = engine.model.decoder.layers[0].mlp.up_proj.weight, ref.model.decoder.layers[0].mlp.up_proj.weight
    assert torch.equal(w, w_ref.to(stored).float())


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precision_compute_runs_and_agrees_at_first(ckpt_untied, engine_factory, dtype, torch_dtype):
    audio = synth_audio(3.0, seed=5)
    fp32 = engine_factory(ckpt_untied).transcribe(audio, max_new_tokens=12)
    half = engine_factory(ckpt_untied, dtype)
    assert half.model.dtype == torch_dtype and f" {dtype} " in half.model_label
    out = half.transcribe(audio, max_new_tokens=12)
    assert len(out.token_ids) == 12
    assert out.token_ids[0] == fp32.token_ids[0]


def test_hf_layout_config_is_detected(ckpt_root):
    cfg = AsrConfig.from_file(cached_checkpoint(ckpt_root, layout="hf") / "config.json")
    thinker = AsrConfig.from_file(cached_checkpoint(ckpt_root) / "config.json")
    assert cfg.layout == "hf" and thinker.layout == "thinker"
    assert (cfg.audio, cfg.text, cfg.special) == (thinker.audio, thinker.text, thinker.special)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fused_projections_load_in_place(ckpt_untied, dtype):
    """q/k/v and gate/up are read straight into their fused tensors: planning the fusion copies nothing,
    and the values are the checkpoint's."""
    from dictation.asr.checkpoints.locate import checkpoint_name
    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.device import resolve_dtype

    cfg = AsrConfig.from_dict(json.loads((ckpt_untied / "config.json").read_text()))
    device = torch.device("cpu")
    model = load_model(ckpt_untied, cfg, device, resolve_dtype(dtype, device))
    mlp = model.decoder.layers[1].mlp
    before = mlp.gate_proj.weight.data_ptr()
    assert mlp.up_proj.weight.data_ptr() == before + mlp.gate_proj.weight.nbytes  # adjacent rows
    assert model.sync_weights()  # the fusions are planned now...
    assert mlp.fusion.weight.data_ptr() == before == mlp.gate_proj.weight.data_ptr()  # ...over that storage
    stored = load_file(str(ckpt_untied / "model.safetensors"))
    for name in ("layers.1.mlp.up_proj.weight", "layers.0.self_attn.k_proj.weight"):
        want = stored[checkpoint_name(f"decoder.{name}", cfg.layout)].to(model.dtype)
        assert torch.equal(model.get_parameter(f"decoder.{name}"), want)
    sizes = mlp.fusion.sizes
    assert torch.equal(mlp.fusion.weight[sizes[0] :], model.get_parameter("decoder.layers.1.mlp.up_proj.weight"))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_loading_does_not_import_torch_dynamo_or_sympy(ckpt_untied, variant):
    """Building the model on the meta device and materialising it must not run torch's Python meta
    kernels, whose first use imports torch._dynamo, nor ``empty_like`` on meta tensors, which imports
    sympy (torch.fx's symbolic shapes): each about a second of every app start."""
    import subprocess
    import sys

    code = (
        "import sys; from dictation.asr import AsrEngine, EngineOptions; "
        f"e = AsrEngine(EngineOptions(model={str(ckpt_untied)!r}, device='cpu', dtype='fp32', variant={variant!r})); "
        "e.prepare(); print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False", out.stderr


# --- config sizes, damaged files and special files ----------------------------------------------------


def edit_config(folder, change):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    change(raw["thinker_config"]["text_config"])
    path.write_text(json.dumps(raw))
    return path


def test_a_config_with_ten_million_layers_is_refused_before_anything_is_built(ckpt_untied, tmp_path):
    """num_hidden_layers 1e7: building that model (even on the meta device) grew memory without end. The
    load runs in a process limited to 3 GiB of data so that a regression fails instead of eating the machine."""
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    config = edit_config(folder, lambda text: text.update(num_hidden_layers=1e7))
    script = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))
        from dictation.asr import AsrEngine, EngineOptions, ModelError
        t0 = time.monotonic()
        try:
            AsrEngine(EngineOptions(model={str(folder)!r}, device="cpu")).prepare()
        except ModelError as exc:
            print(round(time.monotonic() - t0, 1), exc)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, message = proc.stdout.strip().split(" ", 1)
    assert float(seconds) < 30
    assert message == (
        f"{folder}: the weights have no tensor for decoder.layers.9999999.self_attn.q_proj.weight "
        "(expected shape (2048, 64))"
    )
    assert config.is_file()


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            {"vocab_size": 10**9},
            "tensor thinker.model.embed_tokens.weight has shape (151936, 64), but config.json implies "
            "(1000000000, 64); the weights and config.json come from different models",
        ),
        ({"vocab_size": 10**12}, "text_config.vocab_size is 1000000000000; expected 1 to 2147483647"),
        ({"hidden_size": "sixty-four"}, 'text_config.hidden_size is "sixty-four"; expected a whole number'),
        ({"num_attention_heads": 0}, "text_config.num_attention_heads is 0; expected 1 to 2147483647"),
        ({"rms_norm_eps": -1}, "text_config.rms_norm_eps is -1; expected a positive number"),
        ({"tie_word_embeddings": "false"}, "text_config.tie_word_embeddings is 'false'; expected true or false"),
        ({"intermediate_size": 2.5}, "text_config.intermediate_size is 2.5; expected a whole number"),
    ],
)
def test_config_sizes_of_the_wrong_kind_or_size_are_one_error(ckpt_untied, tmp_path, change, fragment):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    edit_config(folder, lambda text: text.update(change))
    t0 = time.monotonic()
    with pytest.raises(ModelError) as info:
        load(folder)
    assert time.monotonic() - t0 < 30
    message = str(info.value)
    assert fragment in message and "\n" not in message
    assert str(folder) in message


def test_nan_and_infinite_weights_are_named(ckpt_untied, tmp_path):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    name = "thinker.model.layers.1.mlp.down_proj.weight"

    def poison(value):
        def change(t):
            t[name] = t[name].clone()
            t[name][3, 5] = value

        return change

    for value in (float("nan"), float("inf"), -float("inf")):
        path = rewrite(folder, poison(value))
        with pytest.raises(WeightsError) as info:
            load(folder, "bf16")
        assert str(info.value) == f"{path}: tensor {name} holds NaN or infinite values (a damaged download?)"


def test_deeply_nested_json_is_one_error(ckpt_untied, tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    folder = copy_ckpt(ckpt_untied, tmp_path / "config")
    (folder / "config.json").write_text(deep)
    with pytest.raises(ModelError, match=r"config.json: not valid JSON \(nested too deeply\)$"):
        load(folder)

    folder = copy_ckpt(ckpt_untied, tmp_path / "header")
    header = deep.encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(WeightsError, match=r"not a readable safetensors file \(header JSON nested too deeply\)$"):
        load(folder)

    folder = copy_ckpt(ckpt_untied, tmp_path / "tokenizer")
    (folder / "tokenizer_config.json").write_text(deep)
    with pytest.raises(ModelError, match=r"tokenizer_config.json: not valid JSON \(nested too deeply\)$"):
        load(folder)


@pytest.mark.parametrize(
    "damage, fragment",
    [
        ({"vocab.json": "{not json"}, "not a BPE vocabulary and merge list"),
        ({"merges.txt": "\x00\x01 garbage\nonly-one-token-on-this-line\n"}, "not a BPE vocabulary and merge list"),
        (
            {"tokenizer_config.json": json.dumps({"added_tokens_decoder": {"10000000000": {"content": "x"}}})},
            "added token id 10000000000 is beyond the model's vocabulary of 151936",
        ),
        (
            {"tokenizer_config.json": json.dumps({"added_tokens_decoder": {"x": 5}})},
            "added_tokens_decoder entry 'x' is not an id with a content",
        ),
        ({"tokenizer_config.json": json.dumps([1, 2])}, "not a tokenizer config"),
    ],
)
def test_garbage_tokenizer_files_are_one_error_naming_them(ckpt_untied, tmp_path, damage, fragment):
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "tokenizer.json").unlink(missing_ok=True)  # vocab.json + merges.txt are read
    for name, text in damage.items():
        (folder / name).write_text(text)
    with pytest.raises(ModelError) as info:
        load(folder)
    message = str(info.value)
    assert fragment in message and "\n" not in message
    assert any(str(folder / name) in message for name in damage)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer_config.json", "vocab.json"])
def test_a_fifo_in_place_of_a_model_file_is_refused_at_once(ckpt_untied, tmp_path, name):
    """open() on a FIFO waits for a writer, for ever (the tokenizers library even holds the interpreter
    lock meanwhile): every file of a model folder is refused instead. Run as the CLI, with a deadline."""
    from dictation.audio.wav import write_wav

    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    (folder / "tokenizer.json").unlink(missing_ok=True)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    wav = tmp_path / "speech.wav"
    write_wav(wav, synth_audio(1.0, seed=3), 16000)
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "transcribe", str(wav), "--model", str(folder), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dictation: error: {folder / name}: "), proc.stderr
    assert "FIFO" in lines[0] or "not a regular file" in lines[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_tensors_held_as_stored_are_the_files_pages_and_writing_them_leaves_the_file(ckpt_untied, tmp_path):
    """A bf16 load of a bf16 checkpoint holds its tensors as stored: each that owns its memory is a
    private mapping of its bytes in the file (no copy), and so are the rows of a fused group stored one
    after the other in its order (gate/up: the safetensors package orders by name), which the fusion
    then adopts; q/k/v, stored k, o, q, v, are copied into their fused tensor. Writing to a mapped
    tensor changes this process's copy, never the file."""
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    path = rewrite(folder, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items() if v.is_floating_point()}))
    engine = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype="bf16", map_weights="all"))
    engine.prepare()
    model = engine.model
    layer = model.decoder.layers[1]
    down = layer.mlp.down_proj.weight
    assert mapped_files(down.data_ptr()) == {str(path)}
    assert mapped_files(model.decoder.embed_tokens.weight.data_ptr()) == {str(path)}
    assert mapped_files(layer.mlp.gate_proj.weight.data_ptr()) == {str(path)}
    assert layer.mlp.fusion.weight.data_ptr() == layer.mlp.gate_proj.weight.data_ptr()  # adopted, not copied
    assert str(path) not in mapped_files(layer.self_attn.q_proj.weight.data_ptr())
    stored = load_file(str(path))
    for name in ("down_proj", "gate_proj", "up_proj"):
        assert torch.equal(getattr(layer.mlp, name).weight, stored[f"thinker.model.layers.1.mlp.{name}.weight"])
    before = path.read_bytes()
    down.data.zero_()
    assert path.read_bytes() == before and not bool(down.any())


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_a_prepared_variant_is_mapped_whole_fused_groups_included(ckpt_untied, tmp_path, variant):
    """``dictation quantize`` writes each fused group's tensors one after the other in the fused order, so
    every integer tensor of the decoder, q/k/v and gate/up included, is the file's pages after a load:
    the load copies none of them."""
    from dictation.asr.tune.writers import write_quantized_folder

    out = write_quantized_folder(ckpt_untied, tmp_path / variant, variant)
    path = out / "model.safetensors"
    engine = AsrEngine(EngineOptions(model=str(out), device="cpu", map_weights="all"))
    engine.prepare()
    model = engine.model
    integer = [
        (name, t)
        for name, t in [*model.decoder.named_buffers(), *model.decoder.named_parameters()]
        if not t.is_floating_point()
    ]
    assert integer
    for name, t in integer:
        assert mapped_files(t.data_ptr()) == {str(path)}, name
    attn = model.decoder.layers[0].self_attn
    fused = attn.fusion.layer
    assert fused is not None and mapped_files(next(iter(fused.buffers())).data_ptr()) == {str(path)}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_by_default_only_the_encoder_is_mapped_and_none_maps_nothing(ckpt_untied, tmp_path):
    """The app's default (map_weights="encoder"): the encoder, read once per clip, is the file's pages;
    what every decode step reads (the decoder, the table) is a copy in the process's own memory.
    "none" copies everything; an unknown choice is one error."""
    folder = copy_ckpt(ckpt_untied, tmp_path / "m")
    path = rewrite(folder, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items() if v.is_floating_point()}))
    for choice, encoder_mapped in (("encoder", True), ("none", False)):
        engine = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype="bf16", map_weights=choice))
        engine.prepare()
        model = engine.model
        fc1 = model.audio_tower.layers[0].fc1.weight
        assert (str(path) in mapped_files(fc1.data_ptr())) is encoder_mapped, choice
        for t in (model.decoder.layers[1].mlp.down_proj.weight, model.decoder.embed_tokens.weight):
            assert str(path) not in mapped_files(t.data_ptr()), choice
    with pytest.raises(AsrError, match="unknown map_weights 'some'"):
        AsrEngine(EngineOptions(model=str(folder), map_weights="some"))
