"""LoRA adapters: reading PEFT folders and checking them against the tiny checkpoints.

The adapters are written here as PEFT's save_pretrained writes them (adapter_config.json plus
adapter_model.safetensors with base_model.model.<module>.lora_A/B.weight) for the tiny model:
decoder hidden size 64, q_proj 2048x64, v_proj 1024x64; audio encoder width 128.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dictation.asr.errors import AdapterError
from dictation.asr.tune import patterns
from dictation.asr.tune.adapter_files import AdapterInfo, check_adapter, parse_adapter_spec, read_adapter
from tests.oracle.checkpoints import cached_checkpoint

# (PEFT module name in the official thinker layout, out_features, in_features) in the tiny model
THINKER_LAYERS = (
    ("thinker.model.layers.0.self_attn.q_proj", 2048, 64),
    ("thinker.model.layers.0.self_attn.v_proj", 1024, 64),
    ("thinker.model.layers.1.self_attn.q_proj", 2048, 64),
    ("thinker.model.layers.1.self_attn.v_proj", 1024, 64),
    ("thinker.audio_tower.layers.0.self_attn.q_proj", 128, 128),
)
HF_LAYERS = (
    ("model.language_model.layers.1.self_attn.q_proj", 2048, 64),
    ("model.language_model.layers.1.mlp.down_proj", 64, 128),
    ("model.multi_modal_projector.linear_1", 128, 128),
    ("model.audio_tower.layers.0.fc1", 256, 128),
)


def write_adapter(
    folder: Path,
    layers=THINKER_LAYERS,
    *,
    r: int = 4,
    alpha: float = 16,
    ranks: dict[str, int] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    adapter_name: str = "",
    **config,
) -> Path:
    folder.mkdir(parents=True)
    settings = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": sorted({name.rsplit(".", 1)[-1] for name, _, _ in layers}),
        "base_model_name_or_path": "Qwen/Qwen3-ASR-0.6B",
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_rslora": False,
        "use_dora": False,
        "bias": "none",
        "task_type": None,
        **config,
    }
    (folder / "adapter_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    generator = torch.Generator().manual_seed(0)
    suffix = f".{adapter_name}" if adapter_name else ""
    tensors = {}
    for name, out_features, in_features in layers:
        rank = (ranks or {}).get(name, r)
        tensors[f"base_model.model.{name}.lora_A{suffix}.weight"] = torch.randn(rank, in_features, generator=generator)
        tensors[f"base_model.model.{name}.lora_B{suffix}.weight"] = torch.randn(out_features, rank, generator=generator)
    tensors.update(extra_tensors or {})
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def ckpt_hf(ckpt_root):
    return cached_checkpoint(ckpt_root, layout="hf")


@pytest.fixture(scope="module")
def ckpt_hf_tied(ckpt_root):
    return cached_checkpoint(ckpt_root, layout="hf", tie_word_embeddings=True)


# --- adapters that fit ------------------------------------------------------------------------------


def test_reads_rank_alpha_targets_and_layers(tmp_path):
    info = read_adapter(write_adapter(tmp_path / "a"))
    assert isinstance(info, AdapterInfo)
    assert (info.rank, info.alpha, info.base_model_name_or_path) == (4, 16.0, "Qwen/Qwen3-ASR-0.6B")
    assert info.target_modules == ("q_proj", "v_proj")
    assert info.weights_file == tmp_path / "a" / "adapter_model.safetensors"
    assert [layer.module for layer in info.layers] == [
        "audio_tower.layers.0.self_attn.q_proj",
        "decoder.layers.0.self_attn.q_proj",
        "decoder.layers.0.self_attn.v_proj",
        "decoder.layers.1.self_attn.q_proj",
        "decoder.layers.1.self_attn.v_proj",
    ]
    v = info.layers[2]
    assert (v.rank, v.in_features, v.out_features, v.scaling) == (4, 64, 1024, 4.0)
    assert v.lora_a == "base_model.model.thinker.model.layers.0.self_attn.v_proj.lora_A.weight"
    assert v.lora_b == "base_model.model.thinker.model.layers.0.self_attn.v_proj.lora_B.weight"


@pytest.mark.parametrize("model", ["ckpt_untied", "ckpt_hf"])
@pytest.mark.parametrize("layers", [THINKER_LAYERS, HF_LAYERS], ids=["thinker-names", "hf-names"])
def test_an_adapter_of_either_layout_fits_a_model_of_either_layout(model, layers, request, tmp_path):
    adapter = write_adapter(tmp_path / "a", layers)
    assert check_adapter(adapter, request.getfixturevalue(model)) is None
    assert check_adapter(adapter) is None


def test_the_thinker_wrapped_alone_and_named_adapters_are_understood(ckpt_untied, tmp_path):
    layers = (("model.layers.0.self_attn.o_proj", 64, 2048), ("audio_tower.proj2", 64, 128))
    adapter = write_adapter(tmp_path / "a", layers, adapter_name="default")
    assert check_adapter(adapter, ckpt_untied) is None
    assert [layer.module for layer in read_adapter(adapter).layers] == [
        "audio_tower.proj2",
        "decoder.layers.0.self_attn.o_proj",
    ]


def test_rank_and_alpha_patterns_and_rslora_set_each_layers_scaling(ckpt_untied, tmp_path):
    v_layers = {name: 2 for name, _, _ in THINKER_LAYERS if name.endswith("v_proj")}
    adapter = write_adapter(
        tmp_path / "a",
        r=4,
        alpha=16,
        ranks=v_layers,
        rank_pattern={"v_proj": 2},
        alpha_pattern={r"audio_tower\.layers\.\d+\.self_attn\.q_proj": 4},
    )
    assert check_adapter(adapter, ckpt_untied) is None
    by_module = {layer.module: layer for layer in read_adapter(adapter).layers}
    assert by_module["decoder.layers.1.self_attn.v_proj"].rank == 2
    assert by_module["decoder.layers.1.self_attn.v_proj"].scaling == 8.0  # 16 / 2
    assert by_module["decoder.layers.1.self_attn.q_proj"].scaling == 4.0  # 16 / 4
    assert by_module["audio_tower.layers.0.self_attn.q_proj"].scaling == 1.0  # 4 / 4

    rs = read_adapter(write_adapter(tmp_path / "rs", r=4, alpha=16, use_rslora=True))
    assert rs.use_rslora and all(layer.scaling == 16 / math.sqrt(4) for layer in rs.layers)


def test_a_head_adapter_fits_a_tied_model_that_stores_no_head(ckpt_hf_tied, tmp_path):
    adapter = write_adapter(tmp_path / "a", (("lm_head", 151936, 64),))
    assert check_adapter(adapter, ckpt_hf_tied) is None


def test_checking_loads_neither_torch_nor_tensor_data(ckpt_untied, tmp_path):
    adapter = write_adapter(tmp_path / "a")
    script = textwrap.dedent(f"""
        import sys
        from dictation.asr.tune.adapter_files import check_adapter
        print(check_adapter({str(adapter)!r}, {str(ckpt_untied)!r}), "torch" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "False"]


# --- adapters for another model ----------------------------------------------------------------------


def test_an_adapter_for_a_wider_model_says_it_was_trained_for_a_different_model(ckpt_untied, tmp_path):
    wide = (("thinker.model.layers.0.self_attn.q_proj", 2048, 128),)  # hidden size 128, not 64
    adapter = write_adapter(tmp_path / "a", wide)
    assert check_adapter(adapter) is None  # a valid adapter in itself
    assert check_adapter(adapter, ckpt_untied) == (
        f"{adapter}: trained for a different model (it was made for Qwen/Qwen3-ASR-0.6B): "
        f"decoder.layers.0.self_attn.q_proj is 2048x64 (out x in) in the model in {ckpt_untied}, "
        "but 2048x128 in the adapter"
    )


def test_an_adapter_for_a_deeper_model_names_the_missing_layer(ckpt_untied, tmp_path):
    adapter = write_adapter(tmp_path / "a", (("thinker.model.layers.27.mlp.up_proj", 128, 64),))
    assert check_adapter(adapter, ckpt_untied) == (
        f"{adapter}: trained for a different model (it was made for Qwen/Qwen3-ASR-0.6B): it adapts "
        f"decoder.layers.27.mlp.up_proj, which the model in {ckpt_untied} does not have"
    )


def test_an_adapter_for_another_architecture(tmp_path):
    t5 = (("encoder.block.0.layer.0.SelfAttention.q", 512, 512),)
    adapter = write_adapter(tmp_path / "a", t5, base_model_name_or_path="google-t5/t5-small")
    path = adapter / "adapter_model.safetensors"
    assert check_adapter(adapter) == (
        f"{path}: trained for a different model: encoder.block.0.layer.0.SelfAttention.q is not a layer of a "
        "Qwen3-ASR model"
    )


def test_lora_on_a_layer_that_is_not_linear_in_the_model(ckpt_untied, tmp_path):
    adapter = write_adapter(tmp_path / "a", (("thinker.model.layers.0.input_layernorm", 64, 64),))
    assert check_adapter(adapter, ckpt_untied) == (
        f"{adapter}: adapts decoder.layers.0.input_layernorm, which is not a linear layer in the model in {ckpt_untied}"
    )


def test_a_broken_model_folder_is_reported_as_such(tmp_path):
    adapter = write_adapter(tmp_path / "a")
    assert check_adapter(adapter, tmp_path / "no-model") == f"{tmp_path / 'no-model'}: no such model folder"


# --- folders that are not usable adapters -----------------------------------------------------------


def broken(tmp_path: Path, how: str) -> Path:
    folder = tmp_path / "a"
    if how == "missing":
        return folder
    if how == "file":
        folder.write_text("x")
        return folder
    write_adapter(folder)
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if how == "no config":
        config_path.unlink()
    elif how == "not json":
        config_path.write_text("{'peft_type': 'LORA'}")
    elif how == "not lora":
        config_path.write_text(json.dumps({**config, "peft_type": "PREFIX_TUNING"}))
    elif how == "dora without magnitudes":
        config_path.write_text(json.dumps({**config, "use_dora": True}))
    elif how == "bias":
        config_path.write_text(json.dumps({**config, "bias": "lora_only"}))
    elif how == "lora_bias":
        config_path.write_text(json.dumps({**config, "lora_bias": True}))
    elif how == "fan_in_fan_out":
        config_path.write_text(json.dumps({**config, "fan_in_fan_out": True}))
    elif how == "other targets":
        config_path.write_text(json.dumps({**config, "target_modules": ["k_proj"]}))
    elif how == "regex targets":
        config_path.write_text(json.dumps({**config, "target_modules": r".*\.mlp\..*"}))
    elif how == "bad rank":
        config_path.write_text(json.dumps({**config, "r": 0}))
    elif how == "no weights":
        (folder / "adapter_model.safetensors").unlink()
    elif how == "pickle":
        (folder / "adapter_model.safetensors").unlink()
        torch.save({"w": torch.zeros(1)}, folder / "adapter_model.bin")
    elif how == "truncated":
        data = (folder / "adapter_model.safetensors").read_bytes()
        (folder / "adapter_model.safetensors").write_bytes(data[:-100])
    return folder


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing", "{a}: no such folder"),
        ("file", "{a}: this is a file; choose the adapter folder (the one that holds adapter_config.json)"),
        ("no config", "{a}: no adapter_config.json in this folder, so it is not a PEFT adapter"),
        ("not json", "{a}/adapter_config.json: not valid JSON (Expecting property name enclosed in double quotes"),
        ("not lora", "{a}/adapter_config.json: peft_type is 'PREFIX_TUNING'; only LoRA adapters (LORA) are supported"),
        (
            "dora without magnitudes",
            "{a}/adapter_model.safetensors: thinker.audio_tower.layers.0.self_attn.q_proj has no "
            "lora_magnitude_vector, but adapter_config.json says use_dora",
        ),
        ("bias", "{a}/adapter_config.json: bias is 'lora_only'; adapters that train biases are not supported"),
        ("lora_bias", "{a}/adapter_config.json: lora_bias is true; adapters that train biases are not supported"),
        ("fan_in_fan_out", "{a}/adapter_config.json: fan_in_fan_out is true, which is for Conv1D layers (GPT-2)"),
        (
            "other targets",
            "{a}/adapter_model.safetensors: holds LoRA weights for thinker.audio_tower.layers.0.self_attn.q_proj, "
            "which target_modules does not select",
        ),
        (
            "regex targets",
            "{a}/adapter_model.safetensors: holds LoRA weights for thinker.audio_tower.layers.0.self_attn.q_proj, "
            "which target_modules does not select",
        ),
        ("bad rank", "{a}/adapter_config.json: r is 0; it must be a positive integer"),
        ("no weights", "{a}: no adapter_model.safetensors in this folder"),
        ("pickle", "{a}/adapter_model.bin: pickle adapters are refused because loading one can run arbitrary code"),
        ("truncated", "{a}/adapter_model.safetensors: truncated"),
    ],
)
def test_unusable_folders_get_one_sentence_naming_them(tmp_path, how, message):
    folder = broken(tmp_path, how)
    expected = message.format(a=folder)
    result = check_adapter(folder)
    assert result is not None and result.startswith(expected), result
    with pytest.raises(AdapterError) as info:
        read_adapter(folder)
    assert str(info.value) == result


def test_a_missing_half_of_a_pair(tmp_path):
    adapter = write_adapter(
        tmp_path / "a",
        (("thinker.model.layers.0.self_attn.q_proj", 2048, 64),),
        extra_tensors={"base_model.model.thinker.model.layers.1.self_attn.k_proj.lora_A.weight": torch.zeros(4, 64)},
    )
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_model.safetensors'}: thinker.model.layers.1.self_attn.k_proj has lora_A but no lora_B"
    )


def test_a_rank_that_disagrees_with_the_config(tmp_path):
    name = "thinker.model.layers.0.self_attn.q_proj"
    adapter = write_adapter(tmp_path / "a", ((name, 2048, 64),), r=8, ranks={name: 16})
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_model.safetensors'}: {name} has rank 16, but adapter_config.json says r=8"
    )


@pytest.mark.parametrize(
    "extra",
    [
        "base_model.model.thinker.model.embed_tokens.lora_embedding_A",  # embedding LoRA
        "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_B.bias",  # trained bias
        "base_model.model.thinker.lm_head.weight",  # a whole module, but modules_to_save does not name it
    ],
)
def test_tensors_other_than_lora_matrices_are_refused(tmp_path, extra):
    adapter = write_adapter(tmp_path / "a", extra_tensors={extra: torch.zeros(4, 4)})
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_model.safetensors'}: holds {extra}, which is not a LoRA tensor; only LoRA (with "
        "optional DoRA) on linear layers and modules_to_save are supported (no embedding or convolution LoRA, "
        "no bias training)"
    )


def test_a_dora_magnitude_without_use_dora_is_refused(tmp_path):
    extra = "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
    adapter = write_adapter(tmp_path / "a", extra_tensors={extra: torch.ones(2048)})
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_model.safetensors'}: holds {extra}, a DoRA magnitude, but adapter_config.json "
        "has no use_dora"
    )


def test_dora_magnitudes_and_modules_to_save_are_read(ckpt_untied, tmp_path):
    magnitudes = {f"base_model.model.{name}.lora_magnitude_vector": torch.ones(out) for name, out, _ in THINKER_LAYERS}
    saved = {"base_model.model.thinker.lm_head.weight": torch.zeros(151936, 64)}
    adapter = write_adapter(
        tmp_path / "a", use_dora=True, modules_to_save=["lm_head"], extra_tensors={**magnitudes, **saved}
    )
    info = read_adapter(adapter)
    assert info.use_dora and all(layer.magnitude for layer in info.layers)
    assert [(t.param, t.shape) for t in info.saved] == [("lm_head.weight", (151936, 64))]
    assert "lm_head" in info.modules
    assert check_adapter(adapter, ckpt_untied) is None

    wrong = write_adapter(
        tmp_path / "b",
        use_dora=True,
        modules_to_save=["lm_head"],
        extra_tensors={**magnitudes, "base_model.model.thinker.lm_head.weight": torch.zeros(1000, 64)},
    )
    assert check_adapter(wrong, ckpt_untied) == (
        f"{wrong}: trained for a different model (it was made for Qwen/Qwen3-ASR-0.6B): lm_head.weight has shape "
        f"(151936, 64) in the model in {ckpt_untied}, but (1000, 64) in the adapter"
    )


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("/a/b", ("/a/b", 1.0)),
        ("/a/b:0.5", ("/a/b", 0.5)),
        ("/a/b:-1", ("/a/b", -1.0)),
        (r"C:\adapters\x", (r"C:\adapters\x", 1.0)),
        (r"C:\adapters\x:2", (r"C:\adapters\x", 2.0)),
        ("/a/b:c", ("/a/b:c", 1.0)),
    ],
)
def test_adapter_specs_take_an_optional_weight(spec, expected):
    assert parse_adapter_spec(spec) == expected


def test_lora_on_a_convolution_is_refused(tmp_path):
    adapter = write_adapter(tmp_path / "a", ())
    save_file(
        {
            "base_model.model.thinker.audio_tower.conv2d1.lora_A.weight": torch.zeros(4, 1, 3, 3),
            "base_model.model.thinker.audio_tower.conv2d1.lora_B.weight": torch.zeros(32, 4, 1, 1),
        },
        str(adapter / "adapter_model.safetensors"),
    )
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_model.safetensors'}: thinker.audio_tower.conv2d1 has 4-D LoRA matrices; only LoRA "
        "on linear layers is supported"
    )


def test_an_adapter_without_lora_weights(tmp_path):
    adapter = write_adapter(tmp_path / "a", ())
    save_file({}, str(adapter / "adapter_model.safetensors"))
    assert check_adapter(adapter) == f"{adapter / 'adapter_model.safetensors'}: holds no LoRA weights"


# --- regular expressions that never finish ----------------------------------------------------------

BACKTRACKS = "(.*)*X"  # exponential in re against a 40-character module name: it would never finish


@pytest.mark.parametrize(
    "key, value",
    [
        ("target_modules", BACKTRACKS),
        ("rank_pattern", {"q_proj": 4, BACKTRACKS: 2}),
        ("alpha_pattern", {BACKTRACKS: 2}),
    ],
)
def test_a_pattern_that_backtracks_for_ever_is_refused_within_seconds(tmp_path, key, value, short_pattern_deadline):
    adapter = write_adapter(tmp_path / "a", **{key: value})
    t0 = time.monotonic()
    with pytest.raises(AdapterError) as info:
        read_adapter(adapter)
    elapsed = time.monotonic() - t0
    assert elapsed < patterns.TIMEOUT_S + 10  # the deadline, plus start-up on a busy machine
    message = str(info.value)
    assert message.startswith(f"{adapter / 'adapter_config.json'}: its regular expressions did not finish matching")
    assert f"{key} {BACKTRACKS!r}" in message and "\n" not in message
    assert "'q_proj'" not in message  # only the patterns that can backtrack are named


def test_matching_a_pattern_that_never_finishes_leaves_the_other_threads_running(tmp_path, short_pattern_deadline):
    """re holds the interpreter lock while it matches: the GUI thread, IPC and signal handlers stopped
    with it. The child process leaves this thread free to run while the worker waits."""
    adapter = write_adapter(tmp_path / "a", target_modules=BACKTRACKS)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(check_adapter(adapter)))
    ticks, t0 = 0, time.monotonic()
    worker.start()
    while worker.is_alive():
        time.sleep(0.01)
        ticks += 1
    elapsed = time.monotonic() - t0
    assert errors and "did not finish matching" in errors[0]
    assert elapsed > 1.0 and ticks > 0.3 * elapsed / 0.01  # this thread ran through the wait


def test_regular_expressions_select_as_peft_does(ckpt_untied, tmp_path):
    """Patterns that can backtrack run in the child, plain ones here; both follow PEFT's rules."""
    import re

    layers = THINKER_LAYERS
    target = r".*\.(q_proj|v_proj)"
    rank_pattern = {r"layers\.[01]\.self_attn\.v_proj": 2, "model.layers.1.self_attn.q_proj": 3}
    ranks = {}
    for name, _, _ in layers:  # PEFT's own rule (peft.utils.other.get_pattern_key) decides each rank
        key = next((k for k in rank_pattern if re.match(rf"(.*\.)?({k})$", name)), None)
        ranks[name] = rank_pattern[key] if key else 4
    assert sorted(set(ranks.values())) == [2, 3, 4]  # each kind of key is used
    adapter = write_adapter(tmp_path / "a", layers, ranks=ranks, target_modules=target, rank_pattern=rank_pattern)
    info = read_adapter(adapter)
    assert {
        layer.lora_a.split(".lora_A")[0].removeprefix("base_model.model."): layer.rank for layer in info.layers
    } == ranks
    assert check_adapter(adapter, ckpt_untied) is None


def test_the_frozen_app_is_its_own_pattern_child(monkeypatch):
    """Frozen, the app runs `dictation _match-patterns` as the child; the CLI answers it."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert patterns.child_command() == [sys.executable, patterns.CHILD_ARG]
    monkeypatch.undo()
    job = {
        "tables": [["suffix", ["q_proj", "v_.*"]], ["full", [r".*\.o_proj"]]],
        "names": ["a.q_proj", "a.v_proj", "a.o_proj"],
    }
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", patterns.CHILD_ARG],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[0, 1, None], [None, None, 0]]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"target_modules": "(" * 20_000}, "target_modules is an invalid pattern '(((("),
        ({"rank_pattern": {"q_proj[": 2}}, "rank_pattern has an invalid pattern 'q_proj['"),
        ({"rank_pattern": {f"layer{i}": 2 for i in range(5000)}}, "rank_pattern has 5000 patterns, more than 4096"),
    ],
)
def test_patterns_that_cannot_be_used_are_named(tmp_path, config, message):
    adapter = write_adapter(tmp_path / "a", **config)
    result = check_adapter(adapter)
    assert result.startswith(f"{adapter / 'adapter_config.json'}: {message}"), result
    assert len(result) < 400  # a huge pattern is cut in the message


def test_a_deeply_nested_or_huge_config_is_refused(tmp_path):
    adapter = write_adapter(tmp_path / "a")
    config = adapter / "adapter_config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    assert check_adapter(adapter) == f"{config}: not valid JSON (nested too deeply)"
    config.write_text(json.dumps({"peft_type": "LORA", "pad": "x" * (9 << 20)}))
    assert check_adapter(adapter).startswith(
        f"{config}: {config.stat().st_size} bytes, too large for this file (at most 8388608)"
    )
