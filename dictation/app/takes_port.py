"""`TakesPort`: what `dictation.takes.Takes` asks of the app, done by the controller: reads of its
settings and state, session events, notifications, and queued signals to the worker threads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from dictation import session as S
from dictation.takes import Retranscription, Retype

if TYPE_CHECKING:
    from dictation.config import History, Settings


class Emits(Protocol):
    """A Qt signal as the port uses it: queued to the receiver's thread."""

    def emit(self, *args: Any) -> None: ...


class PortedController(Protocol):
    """What the port reaches in `dictation.app.controller.AppController`: its state, its event queue,
    its notices and its signals to the worker threads."""

    session: S.DictationSession
    history: History
    retranscribed: Emits
    _settings: Settings
    _model_label: str
    _started: bool
    _transcribe: Emits
    _transcribe_take: Emits
    _drop_take: Emits
    _type_text: Emits
    _history_begin: Emits
    _history_store: Emits
    _history_finish: Emits
    _history_discard: Emits
    _history_update: Emits

    def _dispatch(self, event: Any) -> None: ...

    def _notify(self, level: str, message: str, *, log_as: str | None = None) -> None: ...


class TakesPort:
    """`dictation.takes.TakesPort` for the controller: what `Takes` asks for becomes a queued signal."""

    def __init__(self, controller: PortedController) -> None:
        self._c = controller

    @property
    def settings(self) -> Settings:
        return self._c._settings

    @property
    def model_label(self) -> str:
        return self._c._model_label

    @property
    def model_ready(self) -> bool:
        return self._c.session.model_state is S.ModelState.READY

    @property
    def running(self) -> bool:
        return self._c._started

    def dispatch(self, event: Any) -> None:
        self._c._dispatch(event)

    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None:
        self._c._notify(level, message, log_as=log_as)

    def transcribe_take(self, take_id: int, language: str | None, context: str) -> None:
        self._c._transcribe_take.emit(take_id, language, context)

    def drop_take(self, take_id: int) -> None:
        self._c._drop_take.emit(take_id)

    def transcribe_entry(self, request: Retranscription, samples: Any, language: str | None, context: str) -> None:
        self._c._transcribe.emit(request, samples, language, context)

    def history_entry(self, entry_id: int) -> Any:
        return self._c.history.get(entry_id)

    def history_begin(self, take_id: int, audio_path: Any) -> None:
        self._c._history_begin.emit(take_id, audio_path)

    def history_store(self, take_id: int, fields: dict) -> None:
        self._c._history_store.emit(take_id, fields)

    def history_finish(self, take_id: int, fields: dict, delete_audio: bool, keep: int) -> None:
        self._c._history_finish.emit(take_id, fields, delete_audio, keep)

    def history_discard(self, take_id: int, delete_audio: bool, keep: int) -> None:
        self._c._history_discard.emit(take_id, delete_audio, keep)

    def history_update(self, entry_id: int, fields: dict) -> None:
        self._c._history_update.emit(entry_id, fields)

    def retranscribed(self, entry_id: int, problem: str) -> None:
        self._c.retranscribed.emit(entry_id, problem)

    def type_text(self, key: int | Retype, text: Any) -> None:  # a str, or an output.steps.Plan
        self._c._type_text.emit(key, text)
