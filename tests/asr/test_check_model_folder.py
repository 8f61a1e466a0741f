"""check_model_folder: the settings window's quick verdict on a model folder, in one sentence.

Each broken folder is a copy of a tiny checkpoint (files linked, so the 80 MB of weights are not
copied) with one thing wrong, as a user's folder would be after a bad download or a wrong pick.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dictation.asr import AsrEngine, EngineOptions, ModelError
from dictation.asr.checkpoints.hub import check_model_folder
from tests.oracle.checkpoints import cached_checkpoint

SHA = "0123456789abcdef0123456789abcdef01234567"


def linked_copy(src: Path, dst: Path) -> Path:
    """``dst`` with a symlink to each file of ``src``; replace a link to change that file only."""
    dst.mkdir(parents=True)
    for item in src.iterdir():
        (dst / item.name).symlink_to(item)
    return dst


def replace_file(path: Path, content: str | bytes) -> None:
    path.unlink()
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    change(config)
    replace_file(folder / "config.json", json.dumps(config))


def rewrite_weights(folder: Path, change) -> Path:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    path.unlink()
    save_file(tensors, str(path))
    return path


def engine_loads(folder: Path) -> bool:
    try:
        AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype="fp32")).prepare()
    except ModelError:
        return False
    return True


@pytest.fixture(scope="module")
def ckpt_hf(ckpt_root):
    return cached_checkpoint(ckpt_root, layout="hf")


@pytest.fixture(scope="module")
def ckpt_sharded(ckpt_root):
    return cached_checkpoint(ckpt_root, shards=3)


# --- folders that load ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ckpt_untied", "ckpt_tied", "ckpt_hf", "ckpt_sharded"])
def test_loadable_checkpoints_pass(name, request):
    assert check_model_folder(request.getfixturevalue(name)) is None


def test_a_folder_with_only_tokenizer_json_passes_and_the_engine_agrees(ckpt_hf, tmp_path):
    """transformers 5 saves the control tokens in tokenizer.json only: found there, not just in
    tokenizer_config.json."""
    folder = linked_copy(ckpt_hf, tmp_path / "m")
    (folder / "tokenizer_config.json").unlink()
    (folder / "vocab.json").unlink(missing_ok=True)
    (folder / "merges.txt").unlink(missing_ok=True)
    assert check_model_folder(folder) is None
    assert engine_loads(folder)


def test_a_cached_repo_id_is_checked_in_the_cache(ckpt_untied, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny-asr"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    (repo / "snapshots").mkdir()
    snapshot = linked_copy(ckpt_untied, repo / "snapshots" / SHA)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local folder named someone/tiny-asr
    assert check_model_folder("someone/tiny-asr") is None

    (snapshot / "vocab.json").unlink()
    assert check_model_folder("someone/tiny-asr") == (
        f"{snapshot}: only merges.txt; the tokenizer needs tokenizer.json, or vocab.json and merges.txt"
    )
    message = check_model_folder("someone/other-model")
    assert message is not None and message.startswith("someone/other-model is not in the local Hugging Face cache")
    assert "dictation download someone/other-model" in message


def test_checking_is_fast_and_loads_neither_torch_nor_weights(ckpt_sharded):
    """The settings window checks while the user picks: no torch import (seconds on a laptop)."""
    script = textwrap.dedent(f"""
        import sys, time
        t = time.perf_counter()
        from dictation.asr.checkpoints.hub import check_model_folder
        print(check_model_folder({str(ckpt_sharded)!r}))
        print("torch" in sys.modules, time.perf_counter() - t < 2.0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "False", "True"]


# --- folders that do not load: one sentence naming the folder and the problem ----------------------


def test_missing_path_and_file(tmp_path):
    assert check_model_folder(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'}: no such folder"
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    assert check_model_folder(str(file)) == (
        f"{file}: this is a file; choose the model folder (the one that holds config.json)"
    )


def test_folder_without_config(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    (folder / "config.json").unlink()
    assert check_model_folder(folder) == f"{folder}: no config.json in this folder, so it is not a model folder"


def test_config_that_is_not_json(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    replace_file(folder / "config.json", "{ not json")
    message = check_model_folder(folder)
    assert message is not None and message.startswith(f"{folder / 'config.json'}: not valid JSON")


def test_config_of_another_model_type(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    replace_file(folder / "config.json", json.dumps({"model_type": "whisper", "d_model": 384}))
    message = check_model_folder(folder)
    assert message is not None and message.startswith(f"{folder / 'config.json'}: not a Qwen3-ASR config")


def test_no_weights(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    assert check_model_folder(folder) == (
        f"{folder}: no model.safetensors or model.safetensors.index.json in the model folder"
    )


def test_pickle_only_checkpoint_is_refused(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    message = check_model_folder(folder)
    assert message is not None
    assert message.startswith(f"{folder / 'pytorch_model.bin'}: pickle checkpoints are refused")


def test_interrupted_download_is_called_truncated(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    data = (ckpt_untied / "model.safetensors").read_bytes()
    replace_file(folder / "model.safetensors", data[: len(data) // 2])
    message = check_model_folder(folder)
    assert message is not None
    assert message.startswith(f"{folder / 'model.safetensors'}: truncated")
    assert "interrupted download" in message


def test_garbage_weights_file(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    replace_file(folder / "model.safetensors", b"<html>404 Not Found</html>" * 4)
    message = check_model_folder(folder)
    assert message is not None
    assert message.startswith(f"{folder / 'model.safetensors'}: not a readable safetensors file")


def test_missing_shard(ckpt_sharded, tmp_path):
    folder = linked_copy(ckpt_sharded, tmp_path / "m")
    victim = sorted(folder.glob("model-*.safetensors"))[1]
    victim.unlink()
    assert check_model_folder(folder) == f"{victim}: shard listed in model.safetensors.index.json is missing"


def test_shard_outside_the_folder_is_refused_without_reading_it(ckpt_sharded, tmp_path):
    folder = linked_copy(ckpt_sharded, tmp_path / "m")
    replace_file(folder / "model.safetensors.index.json", json.dumps({"weight_map": {"x": "../../etc/passwd"}}))
    assert check_model_folder(folder) == (
        f"{folder / 'model.safetensors.index.json'}: shard '../../etc/passwd' is not a file name in the model"
        " folder; refusing the index"
    )


def test_shards_swapped_with_another_download(ckpt_sharded, tmp_path):
    folder = linked_copy(ckpt_sharded, tmp_path / "m")
    first, second = sorted(folder.glob("model-*.safetensors"))[:2]
    first.unlink()
    first.symlink_to(ckpt_sharded / second.name)
    message = check_model_folder(folder)
    assert message is not None and message.startswith(f"{first}: tensor ")
    assert message.endswith("listed in model.safetensors.index.json is not in this file")


def test_config_with_fewer_layers_than_the_weights(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    edit_config(folder, lambda c: c["thinker_config"]["text_config"].update(num_hidden_layers=1))
    message = check_model_folder(folder)
    assert message is not None and message.startswith(f"{folder / 'model.safetensors'}: tensor thinker.model.layers.1.")
    assert "is in layer 1 of the text decoder, but config.json says it has 1 layer;" in message
    assert message.endswith("the weights and config.json come from different models")
    assert not engine_loads(folder)


def test_config_with_more_layers_than_the_weights(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    edit_config(folder, lambda c: c["thinker_config"]["audio_config"].update(encoder_layers=5))
    assert check_model_folder(folder) == (
        f"{folder}: the weights have no tensor for audio_tower.layers.4.fc1.weight (expected shape (256, 128))"
    )
    assert not engine_loads(folder)


def test_config_of_another_size(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    edit_config(folder, lambda c: c["thinker_config"]["text_config"].update(intermediate_size=96))
    assert check_model_folder(folder) == (
        f"{folder / 'model.safetensors'}: tensor thinker.model.layers.1.mlp.down_proj.weight has shape (64, 128), "
        "but config.json implies (64, 96); the weights and config.json come from different models"
    )
    assert not engine_loads(folder)


def test_quantized_tensor_is_refused(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    name = "thinker.model.layers.0.mlp.up_proj.weight"
    rewrite_weights(folder, lambda t: t.update({name: t[name].to(torch.int8)}))
    assert check_model_folder(folder) == (
        f"{folder / 'model.safetensors'}: tensor {name} is I8; only bf16/fp16/fp32 checkpoints load here"
    )
    assert not engine_loads(folder)


def test_weights_in_the_other_layout_than_the_config(ckpt_untied, ckpt_hf, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(ckpt_hf / "model.safetensors")
    message = check_model_folder(folder)
    assert message is not None and message.startswith(f"{folder / 'model.safetensors'}: tensor ")
    assert "does not belong to a Qwen3-ASR checkpoint in the 'thinker' layout that config.json describes" in message


def test_no_tokenizer_files(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    (folder / "vocab.json").unlink()
    (folder / "merges.txt").unlink()
    assert check_model_folder(folder) == (
        f"{folder}: no tokenizer files; the tokenizer needs tokenizer.json, or vocab.json and merges.txt"
    )
    assert not engine_loads(folder)


def test_tokenizer_without_the_control_tokens(ckpt_untied, tmp_path):
    """A plain Qwen text tokenizer: the BPE files are there, the audio tokens are not."""
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {
        k: v for k, v in config["added_tokens_decoder"].items() if int(k) < 151669
    }  # Qwen3's own added tokens only
    replace_file(folder / "tokenizer_config.json", json.dumps(config))
    assert check_model_folder(folder) == (
        f"{folder}: the tokenizer has no <|audio_start|> token, so it is not a Qwen3-ASR tokenizer"
    )
    assert not engine_loads(folder)


def test_audio_token_id_that_disagrees_with_the_tokenizer(ckpt_untied, tmp_path):
    folder = linked_copy(ckpt_untied, tmp_path / "m")
    edit_config(folder, lambda c: c["thinker_config"].update(audio_token_id=151700))
    assert check_model_folder(folder) == (
        f"{folder}: config.json's audio_token_id is 151700 but the tokenizer's <|audio_pad|> is 151676; "
        "the tokenizer and config.json come from different models"
    )
    assert not engine_loads(folder)
