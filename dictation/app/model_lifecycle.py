"""`ModelLifecycle`: the speech model's life, for the controller (which holds one: `AppController.model`).

The engine worker reports a load, a failure (a GPU failure is retried on the CPU once), a new model
that failed while the previous one was kept, a move to the CPU mid-dictation, adapters it could not
apply or left out of a load (switched off in the saved settings, and said), and an unload; each
becomes the model label and progress the windows show and the session event the lifecycle needs;
`state_text` tells a window opened later where the model stands. After ``engine.idle_unload_minutes``
idle with the model loaded, it is unloaded (`idle`). The engine worker's signals reach
it on the GUI thread (routed by `dictation.app.worker_port`); it asks the engine worker to load,
unload and warm up through the port, and tells the app through `ModelApp`.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QTimer

from dictation import session as S
from dictation.app.options import adapters_skipped_message, engine_options, without_adapters

if TYPE_CHECKING:
    from dictation.app.worker_port import EngineCalls
    from dictation.config import Settings
    from dictation.takes import Emits, Takes

log = logging.getLogger("dictation.app.controller")  # the controller's part: its log lines stay its own

MINUTE_MS = 60_000  # idle-unload unit (tests shorten it)

NO_MODEL_MESSAGE = "No speech model is chosen yet: open Settings → Model to download one or choose a folder."
# The model's state in words where no message about it was given (`ModelLifecycle.state_text`).
STATE_TEXT = {
    S.ModelState.LOADING: "Loading the speech model …",
    S.ModelState.READY: "Loaded",
    S.ModelState.FAILED: "Failed to load (the log says why)",
    S.ModelState.UNLOADED: "Unloaded (idle); it loads again at the next dictation.",
    S.ModelState.NOT_CHOSEN: NO_MODEL_MESSAGE,
}


class ModelApp(Protocol):
    """What `ModelLifecycle` reads and tells (the controller)."""

    session: S.DictationSession
    takes: Takes

    @property
    def settings(self) -> Settings: ...
    @property
    def status(self) -> S.Status: ...
    @property
    def model_label_changed(self) -> Emits: ...
    @property
    def model_progress(self) -> Emits: ...

    def dispatch(self, event: Any) -> None: ...
    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None: ...
    def keep_settings(self, settings: Settings) -> bool: ...  # saved (True if it could be) but not applied


class ModelLifecycle(QObject):
    """The engine worker's model signals, the loads the app asks for, the idle unload. A QObject (a
    child of ``parent``, the controller) so its timer's slot does not keep the controller alive."""

    def __init__(self, app: ModelApp, engine: EngineCalls, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._app = app
        self._engine = engine
        self.label = ""  # the loaded model's label ("" none)
        self.cpu_fallback = False  # the GPU failed: the model runs on the CPU until the engine settings change
        self._said: tuple[S.ModelState, str] | None = None  # the last progress message, for the state it told
        self._idle_timer = QTimer(self)
        self._idle_timer.setSingleShot(True)
        self._idle_timer.timeout.connect(self._idle_unload)

    def idle(self) -> None:
        """The app's state changed: the idle unload is timed from now while nothing is dictated."""
        minutes = self._app.settings.engine.idle_unload_minutes
        if minutes > 0 and self._app.status is S.Status.IDLE and self._app.session.model_state is S.ModelState.READY:
            self._idle_timer.start(minutes * MINUTE_MS)
        else:
            self._idle_timer.stop()

    def stop(self) -> None:
        self._idle_timer.stop()

    def _idle_unload(self) -> None:
        if self._app.status is S.Status.IDLE and self._app.session.model_state is S.ModelState.READY:
            self._engine.unload()

    @property
    def state_text(self) -> str:
        """The model's state in words, for a window opened after the progress messages went by (the
        Model page's Status row): the last message given for the state the session is in, else
        that state alone."""
        state = self._app.session.model_state
        said = self._said
        return said[1] if said is not None and said[0] is state else STATE_TEXT[state]

    def _say(self, state: S.ModelState, text: str) -> None:
        self._said = (state, text)
        self._app.model_progress.emit(text)

    def _set_label(self, label: str) -> None:
        self.label = label
        self._app.model_label_changed.emit(label)

    def request_load(self, device: str | None = None) -> None:
        """Load (again) as the settings say: the session hears that the model is loading."""
        if self._app.session.model_state is not S.ModelState.LOADING:
            self._app.dispatch(S.ModelLoading())
        self.build_and_load(device)

    def build_and_load(self, device: str | None = None) -> None:
        """The engine worker builds the options (torch is imported there, not here) and loads."""
        self._engine.build_and_load(functools.partial(engine_options, self._app.settings, device))

    def unload(self) -> None:
        self._engine.unload()

    def loading(self, what: str) -> None:
        self._app.model_progress.emit(f"Loading {what} …")

    def loaded(self, label: str, seconds: float) -> None:
        self._set_label(label)
        self._say(S.ModelState.READY, f"Loaded {label} in {seconds:.1f} s")
        log.info("speech model ready: %s (%.1f s)", label, seconds)
        self._app.dispatch(S.ModelReady())
        if self._app.status is S.Status.IDLE:
            # Not when a press started the load: that take is recorded or waiting to be transcribed,
            # and must not queue behind the warm-up's own pass.
            self._engine.warm_up()
        self._app.takes.transcribe_recovered()

    def load_failed(self, message: str, gpu_failure: bool) -> None:
        self._set_label("")
        if gpu_failure and not self.cpu_fallback and self._app.settings.engine.device != "cpu":
            self.cpu_fallback = True
            self._app.notify(
                "warning",
                f"The GPU could not be used ({message}). Loading the model on the CPU instead; "
                "dictation will be slower.",
            )
            self._say(S.ModelState.LOADING, f"GPU failed: {message}; loading on the CPU …")
            self.build_and_load(device="cpu")
            return
        self._say(S.ModelState.FAILED, f"Failed: {message}")
        self._app.dispatch(S.ModelFailed(message))

    def kept_previous(self, message: str, label: str) -> None:
        self._app.notify("error", f"The new speech model could not be loaded: {message}. Still using {label}.")
        self.loaded(label, 0.0)
        self._say(S.ModelState.READY, f"Still using {label}: the new model could not be loaded ({message})")

    def moved_to_cpu(self, message: str, label: str) -> None:
        self.cpu_fallback = True
        self._app.notify(
            "warning",
            f"The GPU failed during a dictation ({message}). The model now runs on the CPU, so dictation "
            "is slower until the model is next loaded (a restart or a model setting change); "
            "this dictation's text is not lost.",
        )
        self._set_label(label)

    def adapters_failed(self, message: str) -> None:
        self._app.notify("warning", f"LoRA adapters not applied: {message}. The model keeps the adapters it had.")

    def adapters_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """The model loaded without these adapters (missing, for another model, unusable): switch them
        off in the settings, saved, so the next start does not try them again, and say so."""
        old = self._app.settings
        new = without_adapters(old, skipped)
        # The engine already runs without them: no reload (hence not through apply_settings).
        saved = self._app.keep_settings(new) if new != old else True
        self._app.notify("warning", adapters_skipped_message(skipped, saved))

    def unloaded(self) -> None:
        self._set_label("")
        settings = self._app.settings
        if settings.engine.model and self._app.session.model_state is S.ModelState.READY:
            log.info("speech model unloaded after %d idle minutes", settings.engine.idle_unload_minutes)
            self._say(S.ModelState.UNLOADED, STATE_TEXT[S.ModelState.UNLOADED])
            self._app.dispatch(S.ModelUnloaded())
        elif not settings.engine.model:
            self._say(S.ModelState.NOT_CHOSEN, NO_MODEL_MESSAGE)
            self._app.dispatch(S.ModelNotChosen())
