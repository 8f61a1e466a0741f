"""Fixtures for the Qt window tests: offscreen Qt, a private app home and HF cache, a FakeController."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import gc  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.app.fakes import FakeController  # noqa: E402
from tests.conftest import frozen_for_module  # noqa: E402


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    """Settings, logs and the Hugging Face cache of this test only (never the user's)."""
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.fixture(autouse=True)
def qt_garbage_freed_here(request, qapp):
    """Qt objects in cycles are freed on this (the GUI) thread only, during the test as in the app
    (dictation/app/gui_gc.py), and at its end: the tests' own threads (an IPC client, a page's
    probe) would otherwise trigger the collector and free a Qt object there, which crashes the
    process (a worker died so in test_cold_start's IPC tests). Tests of gui_gc itself opt out.

    What was alive before the module's first Qt test is frozen (tests/conftest.py, `frozen_for_module`):
    this collection walks what the module made, not the whole process again."""
    from dictation.app import gui_gc

    frozen_for_module(request.node)
    held = request.node.get_closest_marker("own_gc") is None
    if held:
        gui_gc.hold()
    yield
    if held:
        gui_gc.release()
    gc.collect()


@pytest.fixture
def controller(tmp_path):
    fake = FakeController(tmp_path / "app")
    yield fake
    fake.close()


@pytest.fixture
def make_controller(tmp_path):
    """FakeController factory for tests that start from particular settings."""
    made = []

    def make(settings=None):
        made.append(FakeController(tmp_path / f"app{len(made)}", settings))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


@pytest.fixture
def model_folder(ckpt_untied, tmp_path):
    """A real (tiny) Qwen3-ASR model folder the checks accept."""
    folder = tmp_path / "models" / "my-asr-model"
    shutil.copytree(ckpt_untied, folder)
    return folder


@pytest.fixture
def put_in_hf_cache(ckpt_untied):
    """Place a model into the test's Hugging Face cache as huggingface_hub lays it out."""

    def put(repo_id: str, source: Path = ckpt_untied) -> Path:
        cache = Path(os.environ["HF_HUB_CACHE"])
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        commit = "0123456789abcdef0123456789abcdef01234567"
        snapshot = repo / "snapshots" / commit
        shutil.copytree(source, snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        return snapshot

    return put


@pytest.fixture
def make_adapter(ckpt_untied, tmp_path):
    """Write a PEFT LoRA adapter folder for the tiny checkpoint's first decoder q_proj.

    ``fits=False`` makes it for a model twice as wide, as an adapter trained on another base would be.
    """
    import json

    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    module = "thinker.model.layers.0.self_attn.q_proj"
    with safe_open(str(ckpt_untied / "model.safetensors"), "np") as f:
        out_features, in_features = f.get_slice(f"{module}.weight").get_shape()

    def make(name: str, *, fits: bool = True) -> Path:
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
        (folder / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
        width = in_features if fits else 2 * in_features
        rng = np.random.default_rng(0)
        tensors = {
            f"base_model.model.{module}.lora_A.weight": rng.standard_normal((2, width), dtype=np.float32),
            f"base_model.model.{module}.lora_B.weight": rng.standard_normal((out_features, 2), dtype=np.float32),
        }
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        return folder

    return make


from tests.app.rig import rig  # noqa: E402, F401  (the started-controller fixture)
