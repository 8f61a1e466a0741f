"""The controller end to end with a real engine (tiny checkpoint), real settings, history and
workers on their threads; only the microphone, key injection, hotkey listener and speaker are fakes."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading

import numpy as np
import pytest

from dictation.app import model_lifecycle
from dictation.app.options import engine_options
from dictation.audio.trim import find_speech, trim_silence
from dictation.config import Outcome, Settings
from dictation.config.store import SettingsStore
from dictation.session import Status
from tests.app.controller_fakes import FakeChain
from tests.app.rig import speech


def test_push_to_talk_types_the_engine_text_and_stores_it_first(rig, engine_factory, ckpt_untied):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    audio = speech()
    r.dictate(audio)
    r.qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)

    # Trimming is on by default; the take was streamed (the default), so only its end was trimmed.
    expected = engine_factory(ckpt_untied).transcribe(audio[: find_speech(audio).end]).text
    assert find_speech(audio).start > 0  # the leading silence is kept, so this tells the paths apart
    assert expected.strip()
    typed = r.chain.delivered[0]
    assert typed == expected + " "  # the trailing space setting (on by default)
    entry = r.history.recent(1)[0]
    assert entry.text == typed
    r.qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=5000)
    assert entry.audio_path is not None and entry.audio_path.is_file()
    assert entry.duration_s == pytest.approx(len(audio) / 16000, abs=1e-3)
    assert entry.model_label and "cpu" in entry.model_label
    assert r.sounds.played == ["start", "stop"]
    assert r.statuses[-3:] == [Status.RECORDING, Status.TRANSCRIBING, Status.IDLE]


def test_press_while_loading_records_and_types_once_the_model_is_ready(rig, qtbot):
    from dictation.asr import AsrEngine

    gate = threading.Event()

    def slow_engine(options):
        gate.wait(30)
        return AsrEngine(options)

    r = rig(engine_factory=slow_engine)
    r.start()
    assert r.c.status is Status.LOADING
    r.dictate(speech())
    qtbot.waitUntil(lambda: r.c.status is Status.LOADING, timeout=5000)
    assert any("still loading" in message for _, message in r.notes)
    assert r.chain.delivered == []
    gate.set()
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.history.recent(1)[0].text == r.chain.delivered[0]


def test_a_gpu_failure_is_announced_then_the_model_loads_on_the_cpu(rig, qtbot, ckpt_untied):
    from dictation.asr import AsrEngine

    devices = []

    def gpu_fails(options):
        devices.append(options.device)
        if options.device != "cpu":
            raise RuntimeError("CUDA error: out of memory")
        return AsrEngine(options)

    settings = Settings()
    settings = settings.replace(engine=settings.engine.replace(model=str(ckpt_untied), device="cuda"))
    r = rig(settings, engine_factory=gpu_fails)
    r.start()
    r.wait_status(Status.IDLE)
    assert devices == ["cuda", "cpu"]
    warnings = [m for level, m in r.notes if level == "warning"]
    assert warnings and "GPU could not be used" in warnings[0] and "CPU" in warnings[0]
    assert r.c.model_label.endswith("cpu")
    assert SettingsStore(r.store.path).load().engine.device == "cuda"  # the user's choice is kept


def test_a_broken_model_folder_shows_the_error_state_and_saves_recordings_untranscribed(rig, qtbot, tmp_path):
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    settings = Settings()
    settings = settings.replace(engine=settings.engine.replace(model=str(broken), device="cpu"))
    r = rig(settings)
    r.start()
    r.wait_status(Status.ERROR)
    assert any(level == "error" and "not-a-model" in m for level, m in r.notes)
    r.dictate(speech())
    qtbot.waitUntil(
        lambda: r.history.count() == 1 and r.history.recent(1)[0].outcome != Outcome.PENDING, timeout=10_000
    )
    entry = r.history.recent(1)[0]
    assert entry.text == "" and entry.outcome.startswith(Outcome.FAILED_PREFIX)
    assert entry.audio_path.is_file()
    assert r.chain.delivered == []


def test_silence_types_nothing_and_says_so(rig, qtbot):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(np.zeros(32000, np.float32))
    qtbot.waitUntil(lambda: len(r.notes) >= 1, timeout=10_000)
    r.wait_status(Status.IDLE)
    assert r.chain.delivered == []
    assert any("muted" in m or "No speech" in m for _, m in r.notes)


def test_failed_delivery_leaves_the_text_in_history_marked_and_tells_the_user(rig, qtbot):
    r = rig(chain=FakeChain(ok=False))
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech())
    qtbot.waitUntil(
        lambda: r.history.count() == 1 and r.history.recent(1)[0].outcome != Outcome.PENDING, timeout=20_000
    )
    assert r.history.recent(1)[0].outcome == Outcome.CLIPBOARD_ONLY
    assert any(level == "warning" and "clipboard" in m for level, m in r.notes)


def test_keep_recordings_zero_deletes_the_file_once_the_text_is_stored(rig, qtbot, ckpt_untied):
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"),
        general=settings.general.replace(keep_recordings=0),
    )
    r = rig(settings)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech())
    qtbot.waitUntil(lambda: r.history.count() == 1 and r.history.recent(1)[0].outcome == Outcome.PASTED, timeout=20_000)
    qtbot.waitUntil(lambda: r.history.recent(1)[0].audio_path is None, timeout=5000)
    assert list((r.store.path.parent.parent / "recordings").glob("*.wav")) == []


def test_settings_apply_live_and_invalid_ones_change_nothing(rig, qtbot, ckpt_tied):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    before = r.store.path.read_text()
    bad = r.c.settings.replace(recording=r.c.settings.recording.replace(max_seconds=1))
    errors = r.c.apply_settings(bad)
    assert [e.key for e in errors] == ["recording.max_seconds"]
    assert r.store.path.read_text() == before

    # a new model is loaded in the background, and the label follows
    new = r.c.settings.replace(engine=r.c.settings.engine.replace(model=str(ckpt_tied)))
    with qtbot.waitSignal(r.c.settings_changed, timeout=5000):
        assert r.c.apply_settings(new) == []
    qtbot.waitUntil(lambda: r.c.status is Status.IDLE and ckpt_tied.name in r.c.model_label, timeout=20_000)
    assert SettingsStore(r.store.path).load().engine.model == str(ckpt_tied)

    # the hotkey mode changes the session's rules at once: toggle mode ignores the release
    toggled = r.c.settings.replace(hotkeys=r.c.settings.hotkeys.replace(mode="toggle"))
    assert r.c.apply_settings(toggled) == []
    r.recorders.next_samples(speech())
    r.hotkeys.press()
    r.wait_status(Status.RECORDING)
    r.hotkeys.release()
    qtbot.waitUntil(lambda: r.sounds.played[-1:] == ["start"], timeout=5000)
    assert r.c.status is Status.RECORDING
    r.clock.advance(2.0)
    r.hotkeys.press()
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)


def test_paused_hotkeys_are_ignored_and_cancel_discards(rig, qtbot):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    r.c.set_hotkeys_paused(True)
    r.hotkeys.press()
    r.hotkeys.release()
    r.c.set_hotkeys_paused(False)

    r.hold(speech())  # the start cue comes once the microphone is live; cancel after it
    with qtbot.waitSignal(r.c.history_changed, timeout=10_000):  # the entry's removal, on the history thread
        r.hotkeys.press("cancel")
        r.wait_status(Status.IDLE)
    r.hotkeys.release()
    assert r.sounds.played == ["start", "cancel"]
    assert r.statuses.count(Status.RECORDING) == 1  # the presses while paused started nothing
    assert r.history.count() == 0


def test_the_cancel_key_is_a_hotkey_only_while_recording(rig, qtbot):
    """The x11 backend grabs the cancel key only while it is enabled: Esc stays with the user's
    windows unless a recording runs."""
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    assert set(r.hotkeys.bindings) == {"dictate", "cancel"}
    assert not r.hotkeys.is_enabled("cancel") and r.hotkeys.is_enabled("dictate")
    r.hold(speech())
    assert r.hotkeys.is_enabled("cancel")
    r.hotkeys.press("cancel")
    r.wait_status(Status.IDLE)
    assert not r.hotkeys.is_enabled("cancel")
    r.hotkeys.release()
    r.hold(speech())
    r.release(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.hotkeys.enabled_changes == [("cancel", True), ("cancel", False), ("cancel", True), ("cancel", False)]
    r.hotkeys.problems.append("The hotkey ctrl+alt+space is already taken by another program")
    assert r.c.handle_ipc("status")["hotkey_problems"] == r.hotkeys.problems
    # paused (the tray, or while the settings window captures a new hotkey): nothing is taken
    r.hotkeys.enabled_changes.clear()
    r.c.set_hotkeys_paused(True)
    assert not r.hotkeys.is_enabled("dictate") and not r.hotkeys.is_enabled("cancel")
    r.c.set_hotkeys_paused(False)
    assert r.hotkeys.enabled_changes == [("dictate", False), ("dictate", True)]


def test_the_sound_player_tells_the_recorder_when_a_cue_sounds(rig, qtbot):
    """So a cue the microphone hears is muted in the take (tests/audio/test_cue_echo.py)."""
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    assert r.sounds.on_cue is not None
    r.hold(speech())
    r.sounds.on_cue("start", 12.5, np.zeros(800, np.float32), 44_100)  # from the player's thread
    assert r.recorders.recorder.cues == [(12.5, 800, 44_100)]
    r.release(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)


def test_ipc_commands_drive_the_session(rig, qtbot):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    r.recorders.next_samples(speech())
    assert r.c.handle_ipc("start")["ok"]
    r.wait_status(Status.RECORDING)
    qtbot.waitUntil(lambda: r.sounds.played[-1:] == ["start"], timeout=5000)
    reply = r.c.handle_ipc("status")
    assert reply["status"] == "recording" and reply["hotkeys"] == "fake"
    r.clock.advance(2.0)
    r.c.handle_ipc("stop")
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.c.handle_ipc("bogus")["ok"] is False


def test_retranscribe_replaces_the_entry_text_with_the_current_context(rig, qtbot):
    from dictation.asr import AsrEngine
    from dictation.audio.wav import load_audio_16k

    calls = []  # (samples, context, text) for each transcription the app ran

    class Recording(AsrEngine):
        def transcribe(self, samples, *args, **kwargs):
            result = super().transcribe(samples, *args, **kwargs)
            calls.append((np.array(samples, copy=True), kwargs.get("context"), result.text))
            return result

    r = rig(engine_factory=Recording)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech(seed=9))
    qtbot.waitUntil(lambda: r.history.count() == 1 and bool(r.history.recent(1)[0].text), timeout=20_000)
    entry = r.history.recent(1)[0]
    assert len(calls) == 1 and not calls[0][1]
    context = "Kubernetes, PySide6"
    s = r.c.settings
    assert r.c.apply_settings(s.replace(transcription=s.transcription.replace(context=context))) == []
    qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=20_000)  # first one settled
    r.c.retranscribe_entry(entry.id)
    qtbot.waitUntil(lambda: len(calls) == 2, timeout=20_000)
    samples, used_context, text = calls[1]
    qtbot.waitUntil(lambda: r.history.get(entry.id).text == text + " ", timeout=20_000)
    assert used_context == context
    # the saved recording, trimmed as the first time (trimming is on by default; the take was
    # streamed, so only its trailing silence was cut, and so it is again)
    saved = load_audio_16k(entry.audio_path)
    assert len(calls[0][0]) == find_speech(calls[0][0]).end > len(trim_silence(calls[0][0]))
    np.testing.assert_array_equal(samples, saved[: find_speech(saved).end])
    assert r.history.get(entry.id).text == text + " "
    assert r.history.count() == 1  # replaced, not added


def test_idle_unload_frees_the_model_and_the_next_dictation_reloads_it(rig, qtbot, monkeypatch, ckpt_untied):
    monkeypatch.setattr(model_lifecycle, "MINUTE_MS", 20)
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu", idle_unload_minutes=1)
    )
    r = rig(settings)
    r.start()
    qtbot.waitUntil(lambda: r.c.session.model_state.value == "unloaded", timeout=10_000)
    assert r.c.model_label == ""
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.history.recent(1)[0].text == r.chain.delivered[0]


def test_first_run_without_a_model_is_an_error_state_that_a_model_choice_clears(rig, qtbot, ckpt_untied):
    r = rig(Settings())
    r.start()
    assert r.c.status is Status.ERROR
    s = r.c.settings
    assert r.c.apply_settings(s.replace(engine=s.engine.replace(model=str(ckpt_untied), device="cpu"))) == []
    r.wait_status(Status.IDLE)


def _counting_engine(made):
    from dictation.asr import AsrEngine

    def factory(options):
        made.append(options)
        return AsrEngine(options)

    return factory


def test_changing_adapters_applies_them_to_the_loaded_model_without_a_reload(rig, qtbot, tmp_path):
    from dictation.config.settings import Adapter
    from tests.asr.test_variants import write_adapter

    made = []
    r = rig(engine_factory=_counting_engine(made))
    r.start()
    r.wait_status(Status.IDLE)
    adapter = write_adapter(tmp_path / "medical", seed=4)
    s = r.c.settings
    with_adapter = s.replace(engine=s.engine.replace(adapters=(Adapter(path=str(adapter), weight=0.5),)))
    assert r.c.apply_settings(with_adapter) == []
    qtbot.waitUntil(lambda: "medical:0.5" in r.c.model_label, timeout=20_000)
    r.wait_status(Status.IDLE)
    assert len(made) == 1  # the base model was loaded once

    # an adapter for another model is refused with a warning; the loaded adapters stay
    wide = write_adapter(tmp_path / "wide", q_shape=(2048, 128), encoder=False)
    bad = s.replace(engine=s.engine.replace(adapters=(Adapter(path=str(wide)),)))
    assert r.c.apply_settings(bad) == []
    qtbot.waitUntil(lambda: any("LoRA adapters not applied" in m for _, m in r.notes), timeout=20_000)
    r.wait_status(Status.IDLE)
    assert "medical:0.5" in r.c.model_label and len(made) == 1
    message = next(m for _, m in r.notes if "LoRA adapters not applied" in m)
    assert str(wide) in message and "2048x128 in the adapter" in message
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)


def test_a_model_that_fails_to_load_leaves_the_previous_one_working(rig, qtbot, tmp_path, ckpt_untied):
    import numpy as np

    from tests.asr.test_gguf import QT, encode_all, our_tensors, write_single

    made = []
    r = rig(engine_factory=_counting_engine(made))
    r.start()
    r.wait_status(Status.IDLE)
    label = r.c.model_label
    encoded, _ = encode_all(our_tensors(ckpt_untied), lambda name, shape: "F32")
    encoded["decoder.layers.0.mlp.down_proj.weight"] = (np.zeros((64, 84), dtype=np.uint8), QT.Q2_K)
    broken = write_single(tmp_path / "broken.gguf", ckpt_untied, encoded)
    s = r.c.settings
    assert r.c.apply_settings(s.replace(engine=s.engine.replace(model=str(broken)))) == []
    qtbot.waitUntil(lambda: len(made) == 3 and r.c.status is Status.IDLE, timeout=20_000)
    errors = [m for level, m in r.notes if level == "error"]
    assert errors and "Q2_K" in errors[-1] and f"Still using {label}" in errors[-1]
    assert r.c.model_label == label
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)


def test_a_delivery_finishing_during_shutdown_still_records_its_outcome(rig, qtbot):
    """Quitting while text is being typed: the outcome is stored before history closes."""
    started, gate = threading.Event(), threading.Event()

    class SlowChain(FakeChain):
        def deliver(self, text):
            started.set()
            gate.wait(10)
            return super().deliver(text)

    r = rig(chain=SlowChain())
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech())
    qtbot.waitUntil(started.is_set, timeout=20_000)
    entry = r.history.recent(1)[0]
    threading.Timer(0.3, gate.set).start()  # the typing ends while shutdown waits for the output thread
    r.c.shutdown()
    assert r.history.get(entry.id).outcome == Outcome.PASTED


def test_a_gpu_failure_during_a_dictation_moves_the_model_to_the_cpu_and_keeps_the_text(rig, qtbot, ckpt_untied):
    import dataclasses

    import torch

    from dictation.asr import AsrEngine

    devices = []

    class GpuThatRunsOutOfMemory(AsrEngine):
        """Loads (on the CPU, standing in for the GPU) and then fails every transcription like a full GPU."""

        @property
        def model_label(self):
            return super().model_label.replace("cpu", "cuda")

        def transcribe(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def factory(options):
        devices.append(options.device)
        if options.device == "cuda":
            return GpuThatRunsOutOfMemory(dataclasses.replace(options, device="cpu"))
        return AsrEngine(options)

    settings = Settings()
    settings = settings.replace(engine=settings.engine.replace(model=str(ckpt_untied), device="cuda"))
    r = rig(settings, engine_factory=factory)
    r.start()
    r.wait_status(Status.IDLE)
    assert r.c.model_label.endswith("cuda")
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert devices == ["cuda", "cpu"]
    assert r.chain.delivered[0].strip() and r.history.recent(1)[0].text == r.chain.delivered[0]
    warnings = [m for level, m in r.notes if level == "warning"]
    assert warnings and "GPU failed during a dictation" in warnings[-1] and "not enough GPU memory" in warnings[-1]
    assert r.c.model_label.endswith("cpu")
    r.chain.delivered.clear()
    r.dictate(speech(seed=8))  # the next dictation runs on the CPU directly
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert devices == ["cuda", "cpu"]


def test_the_model_is_warmed_up_after_each_load_and_a_failed_warm_up_changes_nothing(rig, qtbot, tmp_path, caplog):
    """A short pass right after loading (and after an adapter swap), so the first dictation does not
    pay for one-time set-up; if it fails, the model stays loaded and dictation still works."""
    from dictation.asr import AsrEngine
    from dictation.config.settings import Adapter
    from tests.asr.test_variants import write_adapter

    events = []

    class Watched(AsrEngine):
        fail = False

        def warm_up(self):
            events.append(("warm_up", self.model_label))
            if Watched.fail:
                raise RuntimeError("CUDA error: out of memory")
            return super().warm_up()

        def transcribe(self, samples, *args, **kwargs):
            events.append(("transcribe", self.model_label))
            return super().transcribe(samples, *args, **kwargs)

    r = rig(engine_factory=Watched)
    r.start()
    r.wait_status(Status.IDLE)
    qtbot.waitUntil(lambda: len(events) == 1, timeout=20_000)
    assert events[0][0] == "warm_up"
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert [e for e, _ in events] == ["warm_up", "transcribe"]

    Watched.fail = True  # adapters swapped in place: warmed again, and a failure only logs
    adapter = write_adapter(tmp_path / "medical", seed=4)
    s = r.c.settings
    assert r.c.apply_settings(s.replace(engine=s.engine.replace(adapters=(Adapter(path=str(adapter)),)))) == []
    qtbot.waitUntil(lambda: len(events) == 3, timeout=20_000)
    assert events[2][0] == "warm_up" and "medical" in events[2][1]
    assert "the warm-up pass failed" in caplog.text
    r.wait_status(Status.IDLE)
    delivered = len(r.chain.delivered)
    r.dictate(speech(seed=7))
    qtbot.waitUntil(lambda: len(r.chain.delivered) > delivered, timeout=20_000)
    assert events[-1][0] == "transcribe" and r.c.status is Status.IDLE


def test_the_worker_warms_each_loaded_state_once_and_never_under_a_streamed_take(qtbot, ckpt_untied, caplog):
    import logging

    from dictation.app.workers import EngineWorker
    from dictation.asr import AsrEngine, EngineOptions

    warmed = []

    class Watched(AsrEngine):
        def warm_up(self):
            warmed.append(1)
            return super().warm_up()

    caplog.set_level(logging.INFO, logger="dictation.app.engine_worker")
    options = EngineOptions(model=str(ckpt_untied), device="cpu")
    worker = EngineWorker(Watched)
    worker.warm_up()  # nothing loaded: nothing to do
    worker.load(options)
    assert warmed == []  # loading alone does not warm: the controller asks when nothing is dictated
    worker.warm_up()
    worker.warm_up()
    assert warmed == [1]  # once per loaded state

    worker = EngineWorker(Watched)
    worker.load(options)
    worker.begin_take(1, None, "", False)
    worker.warm_up()
    assert warmed == [1] and "warm-up skipped: a take is under way" in caplog.text
    worker.cancel_take(1)


def test_a_press_that_starts_the_load_is_not_kept_waiting_by_a_warm_up(rig, qtbot):
    from dictation.asr import AsrEngine

    gate, events = threading.Event(), []

    class Slow(AsrEngine):
        def prepare(self):
            gate.wait(30)
            super().prepare()

        def warm_up(self):
            events.append("warm_up")
            return super().warm_up()

        def transcribe(self, samples, *args, **kwargs):
            events.append("transcribe")
            return super().transcribe(samples, *args, **kwargs)

    r = rig(engine_factory=Slow)
    r.start()
    r.dictate(speech())  # pressed and released while the model loads
    gate.set()
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)
    qtbot.wait(200)
    assert events == ["transcribe"]


def test_bad_adapters_at_start_are_switched_off_and_the_model_loads_without_them(rig, qtbot, tmp_path, ckpt_untied):
    """A deleted adapter, one for another base and one whose pattern never finishes used to fail the load
    (or freeze the app) at every start. Now the model loads with the good one, the bad ones are switched
    off in the saved settings with a warning each, dictation works, and the next start is clean."""
    import faulthandler
    import json
    import time

    from PySide6.QtCore import QTimer

    from dictation.config.settings import Adapter
    from tests.asr.test_variants import write_adapter

    good = write_adapter(tmp_path / "medical", seed=4)
    wrong_base = write_adapter(tmp_path / "wide", q_shape=(2048, 128), encoder=False)
    hangs = write_adapter(tmp_path / "hangs", seed=5)
    config = json.loads((hangs / "adapter_config.json").read_text())
    (hangs / "adapter_config.json").write_text(json.dumps({**config, "target_modules": "(.*)*X"}))
    deleted = tmp_path / "deleted-adapter"
    s = Settings()
    adapters = (
        Adapter(path=str(deleted)),
        Adapter(path=str(good)),
        Adapter(path=str(wrong_base), weight=0.5),
        Adapter(path=str(hangs)),
    )
    settings = s.replace(engine=s.engine.replace(model=str(ckpt_untied), device="cpu", adapters=adapters))
    made = []
    r = rig(settings, engine_factory=_counting_engine(made))
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(50)
    faulthandler.dump_traceback_later(180, exit=True)  # a frozen process ends the run instead of hanging it
    try:
        t0 = time.monotonic()
        r.start()
        r.wait_status(Status.IDLE, timeout=60_000)
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.stop()
    assert len(ticks) > 0.3 * (time.monotonic() - t0) / 0.05  # the GUI thread ran while the model loaded

    assert r.c.model_label.endswith("medical")  # loaded with the good adapter only
    saved = SettingsStore(r.store.path).load().engine.adapters
    assert [(a.path, a.enabled) for a in saved] == [
        (str(deleted), False),
        (str(good), True),
        (str(wrong_base), False),
        (str(hangs), False),
    ]
    assert r.c.settings.engine.adapters == saved
    warnings = [m for level, m in r.notes if level == "warning" and "switched off" in m]
    assert len(warnings) == 1  # one notification, naming each adapter and why, in the list's order
    assert warnings[0].startswith(
        f"3 LoRA adapters were switched off and the model loaded without them: {deleted}: no such folder; "
        f"{wrong_base}: trained for a different model"
    )
    assert f"; {hangs / 'adapter_config.json'}: its regular expressions did not finish matching" in warnings[0]
    assert warnings[0].endswith("Switch them on again in Settings → Model once fixed.")

    # the next start loads exactly the good one; switching the others off needed no second load
    assert engine_options(r.c.settings).adapters == (str(good),)
    assert len(made) == 1

    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    assert r.history.recent(1)[0].text == r.chain.delivered[0]
