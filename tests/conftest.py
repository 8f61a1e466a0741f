"""Shared fixtures: tiny random checkpoints (built once per session) and engines on them."""

from __future__ import annotations

import gc

import pytest

from tests.oracle.checkpoints import cached_checkpoint


@pytest.fixture(autouse=True)
def collector_given_back():
    """A test that started the app's worker threads stopped them: Python collects by itself again
    (dictation/app/gui_gc.py turns automatic collection off while they run)."""
    yield
    if not gc.isenabled():
        from dictation.app import gui_gc

        while gui_gc.active():
            gui_gc.release()
        gc.enable()
        pytest.fail("the test left worker threads running: automatic garbage collection stayed off")


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def ckpt_untied(ckpt_root):
    return cached_checkpoint(ckpt_root, tie_word_embeddings=False)


@pytest.fixture(scope="session")
def ckpt_tied(ckpt_root):
    return cached_checkpoint(ckpt_root, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def ckpt_stops(ckpt_root):
    """A checkpoint whose model ends its output after a few tokens."""
    from tests.oracle.checkpoints import EOS_BIAS_EARLY_STOP

    return cached_checkpoint(ckpt_root, tie_word_embeddings=False, eos_bias=EOS_BIAS_EARLY_STOP)


@pytest.fixture(scope="session")
def engine_factory():
    """Cached fp32 CPU engines by (folder, dtype)."""
    from dictation.asr import AsrEngine, EngineOptions

    engines = {}

    def make(folder, dtype="fp32"):
        key = (str(folder), dtype)
        if key not in engines:
            engines[key] = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype=dtype))
            engines[key].prepare()
        return engines[key]

    return make
