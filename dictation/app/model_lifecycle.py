"""`ModelLifecycle`: the part of `AppController` that follows the speech model's life.

The engine worker reports a load, a failure (a GPU failure is retried on the CPU once), a new model
that failed while the previous one was kept, a move to the CPU mid-dictation, adapters it could not
apply or left out of a load (switched off in the saved settings, and said), and an unload; each
becomes the model label and progress the windows show and the session event the lifecycle needs;
`model_state_text` tells a window opened later where the model stands.
A mixin of `AppController` (its state and signals are the controller's), kept apart to be read alone.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from dictation import session as S
from dictation.app.options import adapters_skipped_message, engine_options, without_adapters

log = logging.getLogger("dictation.app.controller")  # the controller's part: its log lines stay its own

NO_MODEL_MESSAGE = "No speech model is chosen yet: open Settings → Model to download one or choose a folder."
# The model's state in words where no message about it was given (`ModelLifecycle.model_state_text`).
STATE_TEXT = {
    S.ModelState.LOADING: "Loading the speech model …",
    S.ModelState.READY: "Loaded",
    S.ModelState.FAILED: "Failed to load (the log says why)",
    S.ModelState.UNLOADED: "Unloaded (idle); it loads again at the next dictation.",
    S.ModelState.NOT_CHOSEN: NO_MODEL_MESSAGE,
}


class ModelLifecycle:
    """Methods of `AppController`: the engine worker's model signals (wired in `_wire_workers`)."""

    _settings: Any
    _s: Any
    session: S.DictationSession
    _status: S.Status
    _model_label: str
    _cpu_fallback: bool
    _model_said: tuple[S.ModelState, str] | None = None  # the last progress message, for the state it told

    @property
    def model_state_text(self) -> str:
        """The model's state in words, for a window opened after the progress messages went by (the
        Model page's Status row): the last message given for the state the session is in, else
        that state alone."""
        state = self.session.model_state
        said = self._model_said
        return said[1] if said is not None and said[0] is state else STATE_TEXT[state]

    def _say(self, state: S.ModelState, text: str) -> None:
        self._model_said = (state, text)
        self.model_progress.emit(text)

    def _request_load(self, device: str | None = None) -> None:
        if self.session.model_state is not S.ModelState.LOADING:
            self._dispatch(S.ModelLoading())
        self._build_and_load.emit(functools.partial(engine_options, self._settings, device))

    def _on_loading(self, what: str) -> None:
        self.model_progress.emit(f"Loading {what} …")

    def _on_loaded(self, label: str, seconds: float) -> None:
        self._model_label = label
        self.model_label_changed.emit(label)
        self._say(S.ModelState.READY, f"Loaded {label} in {seconds:.1f} s")
        log.info("speech model ready: %s (%.1f s)", label, seconds)
        self._dispatch(S.ModelReady())
        if self._status is S.Status.IDLE:
            # Not when a press started the load: that take is recorded or waiting to be transcribed,
            # and must not queue behind the warm-up's own pass.
            self._warm_up.emit()
        self.takes.transcribe_recovered()

    def _on_load_failed(self, message: str, gpu_failure: bool) -> None:
        self._model_label = ""
        self.model_label_changed.emit("")
        if gpu_failure and not self._cpu_fallback and self._settings.engine.device != "cpu":
            self._cpu_fallback = True
            self._notify(
                "warning",
                f"The GPU could not be used ({message}). Loading the model on the CPU instead; "
                "dictation will be slower.",
            )
            self._say(S.ModelState.LOADING, f"GPU failed: {message}; loading on the CPU …")
            self._build_and_load.emit(functools.partial(engine_options, self._settings, device="cpu"))
            return
        self._say(S.ModelState.FAILED, f"Failed: {message}")
        self._dispatch(S.ModelFailed(message))

    def _on_kept_previous(self, message: str, label: str) -> None:
        self._notify("error", f"The new speech model could not be loaded: {message}. Still using {label}.")
        self._on_loaded(label, 0.0)
        self._say(S.ModelState.READY, f"Still using {label}: the new model could not be loaded ({message})")

    def _on_moved_to_cpu(self, message: str, label: str) -> None:
        self._cpu_fallback = True
        self._notify(
            "warning",
            f"The GPU failed during a dictation ({message}). The model now runs on the CPU, so dictation "
            "is slower until the model is next loaded (a restart or a model setting change); "
            "this dictation's text is not lost.",
        )
        self._model_label = label
        self.model_label_changed.emit(label)

    def _on_adapters_failed(self, message: str) -> None:
        self._notify("warning", f"LoRA adapters not applied: {message}. The model keeps the adapters it had.")

    def _on_adapters_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """The model loaded without these adapters (missing, for another model, unusable): switch them
        off in the settings, saved, so the next start does not try them again, and say so."""
        old = self._settings
        new = without_adapters(old, skipped)
        saved = True
        if new != old:
            try:
                self._s.store.save(new)
            except (OSError, ValueError) as exc:  # SettingsError is a ValueError
                log.warning("cannot save the settings with the adapter switched off: %s", exc)
                saved = False
            # The engine already runs without them: no reload (hence not through apply_settings).
            self._settings = new
            self.settings_changed.emit(new)
        self._notify("warning", adapters_skipped_message(skipped, saved))

    def _on_unloaded(self) -> None:
        self._model_label = ""
        self.model_label_changed.emit("")
        if self._settings.engine.model and self.session.model_state is S.ModelState.READY:
            log.info("speech model unloaded after %d idle minutes", self._settings.engine.idle_unload_minutes)
            self._say(S.ModelState.UNLOADED, STATE_TEXT[S.ModelState.UNLOADED])
            self._dispatch(S.ModelUnloaded())
        elif not self._settings.engine.model:
            self._say(S.ModelState.NOT_CHOSEN, NO_MODEL_MESSAGE)
            self._dispatch(S.ModelNotChosen())
