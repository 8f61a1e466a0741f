"""Which local models a menu offers: every Qwen3-ASR model in the Hugging Face
cache, known or not, and the folders the user chose, without the network and without other models."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from dictation.asr.checkpoints.hub import LocalModel, cached_asr_models, is_asr_model, local_models
from tests.asr.test_models import add_to_cache


@pytest.fixture
def no_network(monkeypatch):
    """A scan that reached for the network would fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def asr_config(ckpt_untied) -> str:
    return (Path(ckpt_untied) / "config.json").read_text()


def test_the_cache_scan_finds_every_qwen3_asr_model_and_nothing_else(hub_cache, no_network, asr_config):
    assert cached_asr_models() == []
    own = add_to_cache(hub_cache, "me/qwen3-asr-medical", files={"config.json": asr_config})
    small = add_to_cache(hub_cache, "Qwen/Qwen3-ASR-0.6B", files={"config.json": asr_config})
    add_to_cache(hub_cache, "Qwen/Qwen3-4B", files={"config.json": '{"model_type": "qwen3", "vocab_size": 5}'})
    add_to_cache(hub_cache, "Qwen/Qwen3-ASR-1.7B", files={})  # interrupted: no config.json yet
    add_to_cache(hub_cache, "someone/broken", files={"config.json": "{not json"})
    (hub_cache / "datasets--someone--speech").mkdir()
    (hub_cache / "models--no-owner").mkdir()
    assert cached_asr_models() == [("Qwen/Qwen3-ASR-0.6B", small), ("me/qwen3-asr-medical", own)]  # known first


def test_a_missing_cache_is_an_empty_list(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "nowhere"))
    assert cached_asr_models() == [] and local_models(["/nowhere/model"]) == []


def test_local_models_lists_the_cache_then_the_folders_used(hub_cache, no_network, asr_config, tmp_path, ckpt_untied):
    snapshot = add_to_cache(hub_cache, "Qwen/Qwen3-ASR-1.7B", files={"config.json": asr_config})
    work = tmp_path / "work" / "qwen3-asr-int8"
    home = tmp_path / "home" / "qwen3-asr-int8"  # the same folder name elsewhere
    for folder in (work, home):
        shutil.copytree(ckpt_untied, folder)
    gguf = tmp_path / "models" / "asr-q8.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))
    gone = tmp_path / "deleted-model"
    not_a_model = tmp_path / "photos"
    not_a_model.mkdir()
    recent = [str(work), str(snapshot), str(gone), str(not_a_model), str(gguf), str(home), "relative/folder"]
    assert local_models(recent) == [
        LocalModel("Qwen/Qwen3-ASR-1.7B", "Qwen3-ASR-1.7B", snapshot, True),
        LocalModel(str(work), "qwen3-asr-int8 (work)", work, False),
        LocalModel(str(gguf), "asr-q8.gguf", gguf, False),
        LocalModel(str(home), "qwen3-asr-int8 (home)", home, False),
    ]
    assert is_asr_model(work) and is_asr_model(gguf) and not is_asr_model(gone) and not is_asr_model(not_a_model)
