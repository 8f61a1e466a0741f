"""Personalise: train a personal LoRA adapter on the dictations the user corrected.

`Personaliser` lives on the GUI thread (the controller owns one, `AppController.personaliser`; the
History window and the Model page show it through `PersonalisePanel`). `start` trains on a QThread
of its own (`TrainingWorker`), never on the GUI thread: the corrected entries with their recordings
(`dictation.training.samples_from_history`, on the history's file) on the model and device of the
settings, into ``<data dir>/adapters/personal-<UTC time>`` (0700). With `HOLD_OUT_FROM` or more
recordings (so that at least `MIN_HELD_OUT` are), a `HOLD_OUT_SHARE` of them is held out and scored
before and after (WER/CER); with fewer every one is trained on, and the outcome says why no figures
are given (a figure on one or two dictations is noise).

Progress (step, steps, loss, time left) and status lines come back as queued signals; `cancel` asks
training to stop at its next check and leaves no adapter (a folder left by a stopped run is removed).
On success the worker checks the adapter against the model and writes `REPORT_FILE` beside it (the
figures, no text); the GUI thread then adds the adapter to ``engine.adapters`` enabled, through
``apply_settings`` (the engine reloads with it), and switches off the personal adapters trained
before (the new one learned from the same entries and more). One training at a time; `shutdown`
(the app quitting) cancels and waits for it.

The training function is injected (``train``, ``samples``) with the signatures of
`dictation.training.train_adapter` / `samples_from_history`, imported on the worker thread when not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from dictation.config.settings import Adapter, Settings
from dictation.private import make_private, private_dir

log = logging.getLogger(__name__)

ADAPTERS_FOLDER = "adapters"  # under dictation.paths.data_dir()
NAME_PREFIX = "personal-"
REPORT_FILE = "personalised.json"  # beside the adapter's files: how it was trained and its figures
HOLD_OUT_SHARE = 0.2  # one in five (the trainer rounds; at least one)
# A figure takes at least this many held-out dictations (dictation.training.MIN_HELD_OUT, not imported:
# it would load the tokenizer at the app's start); one clip's WER said "960.0%".
MIN_HELD_OUT = 3
HOLD_OUT_FROM = 13  # the fewest recordings of which one in five makes MIN_HELD_OUT (the trainer rounds)
SHUTDOWN_WAIT_MS = 60_000  # quitting waits this long for a cancelled training to stop

NO_MODEL = "Choose a speech model first (Settings → Model): the adapter is trained for it."
NO_ENTRIES = (
    "No corrected dictations with a recording yet. Correct a transcript in the History window (Edit…): "
    "Personalise trains a personal adapter on those."
)
RUNNING = "A personal adapter is being trained."


@dataclass(frozen=True)
class Job:
    model: str  # engine.model: a folder or a cached repo id
    device: str  # engine.device
    history: Path  # the history database the samples are read from
    out: Path  # the adapter folder to make (it does not exist yet)
    val: float  # share held out to score the adapter before and after
    options: Any  # TrainOptions, or None for the trainer's defaults
    entries: int  # corrected entries with a recording when it started
    stop: threading.Event


@dataclass(frozen=True)
class Trained:
    """A finished training: the adapter folder and what the trainer reported."""

    out: Path
    report: Any  # dictation.training.TrainReport
    summary: str


def usable_entries(history: Any) -> list[Any]:
    """The corrected entries whose recording is still on disk (what training can use)."""
    try:
        entries = history.corrected_entries()
    except Exception as exc:  # a history that cannot be read: nothing to train on, said in the log
        log.warning("cannot read the corrected dictations: %s", exc)
        return []
    return [e for e in entries if e.audio_path is not None and Path(e.audio_path).is_file()]


def held_out_share(count: int) -> float:
    return HOLD_OUT_SHARE if count >= HOLD_OUT_FROM else 0.0


def out_folder(adapters_dir: Path, now: datetime | None = None) -> Path:
    """A new ``personal-<UTC time>`` folder name under ``adapters_dir`` (not created)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    out = adapters_dir / f"{NAME_PREFIX}{stamp}"
    n = 2
    while os.path.lexists(out):
        out = adapters_dir / f"{NAME_PREFIX}{stamp}-{n}"
        n += 1
    return out


def duration_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def figures_text(report: Any) -> str:
    """Before and after on the held-out dictations, or why there are none."""
    before, after = getattr(report, "before", None), getattr(report, "after", None)
    if before is None or after is None:
        why = getattr(report, "unscored", "")
        if why:  # the trainer had too few held out and trained on them instead
            return f"No figures: {why}."
        return (
            f"No figures: measuring it takes {MIN_HELD_OUT} held-out dictations, so {HOLD_OUT_FROM} or more "
            "corrected ones (one in five is held out); all of them were trained on."
        )
    return f"Held-out dictations before: {before}; after: {after}."


def summary_text(report: Any, entries: int) -> str:
    clips = getattr(report, "train_clips", entries)
    return (
        f"Personal adapter trained on {clips} dictation{'s' if clips != 1 else ''} in "
        f"{duration_text(getattr(report, 'seconds', 0.0))} and switched on. {figures_text(report)}"
    )


def _score(score: Any) -> dict | None:
    if score is None:
        return None
    out = {"text": str(score)}
    for name in ("wer", "cer", "clips"):
        value = getattr(score, name, None)
        if isinstance(value, int | float) and math.isfinite(value):
            out[name] = value
    return out


def write_report(out: Path, job: Job, report: Any, summary: str) -> None:
    """`REPORT_FILE` in the adapter folder: numbers only, never the dictations' text (0600)."""
    data = {
        "trained": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": job.model,
        "entries": job.entries,
        "train_clips": getattr(report, "train_clips", None),
        "val_clips": getattr(report, "val_clips", None),
        "steps": getattr(report, "steps", None),
        "final_loss": getattr(report, "final_loss", None),
        "seconds": getattr(report, "seconds", None),
        "before": _score(getattr(report, "before", None)),
        "after": _score(getattr(report, "after", None)),
        "summary": summary,
    }
    path = out / REPORT_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)


def adapter_summary(folder: str | Path) -> str | None:
    """What Personalise said of the adapter in ``folder`` (its figures), or None if it did not make it."""
    try:
        data = json.loads((Path(folder) / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, str):
        return None
    trained = data.get("trained")
    return f"Trained {trained}. {summary}" if isinstance(trained, str) else summary


def is_personal(adapter: Adapter, adapters_dir: Path) -> bool:
    path = Path(adapter.path)
    return path.parent == adapters_dir and path.name.startswith(NAME_PREFIX)


def with_new_adapter(settings: Settings, out: Path, adapters_dir: Path) -> Settings:
    """``settings`` with ``out`` added, enabled, and the personal adapters trained before switched off."""
    kept = tuple(
        a.replace(enabled=False) if a.enabled and is_personal(a, adapters_dir) else a
        for a in settings.engine.adapters
        if a.path != str(out)
    )
    engine = settings.engine.replace(adapters=(*kept, Adapter(path=str(out), enabled=True)))
    return settings.replace(engine=engine)


class TrainingWorker(QObject):
    """Runs one training on its own thread; every answer is a queued signal."""

    progress = Signal(int, int, float, float)  # step, steps, loss, seconds left
    status = Signal(str)
    finished = Signal(object)  # Trained
    failed = Signal(str)  # one line
    cancelled = Signal()

    def __init__(self, train: Callable[..., Any] | None, samples: Callable[..., Any] | None) -> None:
        super().__init__()
        self._train = train
        self._samples = samples

    @Slot(object)
    def run(self, job: Job) -> None:
        try:
            trained = self._run(job)
        except Exception as exc:
            from dictation.asr.errors import AdapterError, AudioError, ModelError  # no torch in these modules
            from dictation.asr.tune.data import TrainingCancelled

            remove_unfinished(job.out)  # nothing half-written stays, nor a checkpoint to resume from
            if job.stop.is_set() or isinstance(exc, _Cancelled | TrainingCancelled):
                log.info("personal adapter training cancelled")
                self.cancelled.emit()
            else:
                message = _one_line(exc)
                if not isinstance(exc, AdapterError | ModelError | AudioError):  # TrainingError is an AdapterError
                    log.exception("personal adapter training failed")
                else:
                    log.warning("personal adapter training failed: %s", message)
                self.failed.emit(message)
            return
        self.finished.emit(trained)

    def _run(self, job: Job) -> Trained:
        train, samples = self._train, self._samples
        if train is None or samples is None:
            from dictation import training  # torch and the trainer: imported here, off the GUI thread

            train = train or training.train_adapter
            samples = samples or training.samples_from_history
        self.status.emit("Reading the corrected dictations …")
        data = samples(job.history)
        if job.stop.is_set():
            raise _Cancelled()
        options = job.options
        if options is None:
            from dictation.asr.tune.train import TrainOptions

            options = TrainOptions()
        self.status.emit(f"Training on {len(data)} dictation{'s' if len(data) != 1 else ''} …")
        report = train(
            job.model,
            data,
            job.out,
            options,
            device=job.device,
            val=job.val,
            resume=False,
            on_progress=lambda p: self.progress.emit(
                int(p.step), int(p.steps), float(p.loss), float(getattr(p, "seconds_left", 0.0) or 0.0)
            ),
            on_status=self.status.emit,
            should_stop=job.stop.is_set,
        )
        if job.stop.is_set():  # asked to stop after its last check: no adapter, as promised
            raise _Cancelled()
        out = Path(getattr(report, "out", None) or job.out)
        if not out.is_dir():
            raise RuntimeError(f"training finished but wrote no adapter at {out}")
        problem = _check(out, job.model)
        if problem:
            raise RuntimeError(f"the trained adapter does not load: {problem}")
        make_private(out)
        summary = summary_text(report, job.entries)
        write_report(out, job, report, summary)
        return Trained(out=out, report=report, summary=summary)


class _Cancelled(Exception):
    """Stopped between the trainer's own checks."""


def _check(out: Path, model: str) -> str | None:
    """Whether the engine takes the new adapter for ``model`` (on the worker thread)."""
    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.errors import ModelError
    from dictation.asr.tune.adapter_files import check_adapter

    try:
        folder = resolve_model(model)
    except ModelError:
        folder = None
    return check_adapter(out, folder)


def remove_unfinished(out: Path) -> None:
    """Remove what a stopped or failed run left for ``out`` (a name `out_folder` made new for it): the
    folder itself and the trainer's work folders beside it (``.<name>.training`` or ``<name>.work``
    with its checkpoints, a temporary ``.<name>...`` being renamed into place)."""
    _remove(out)
    with contextlib.suppress(OSError):
        for path in out.parent.iterdir():
            if path.name.startswith((f".{out.name}", f"{out.name}.")):
                _remove(path)


def _remove(path: Path) -> None:
    if os.path.lexists(path):
        log.info("removing the unfinished adapter folder %s", path)
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class Personaliser(QObject):
    """The Personalise action: availability, one training at a time, its progress and its outcome."""

    changed = Signal()  # availability or running state changed
    progress = Signal(int, int, float, float)  # step, steps, loss, seconds left
    status = Signal(str)
    finished = Signal(str, bool)  # message for the user, whether it is an error ("" never)
    _run = Signal(object)  # Job -> the worker's thread

    def __init__(
        self,
        controller: Any,
        *,
        train: Callable[..., Any] | None = None,
        samples: Callable[..., Any] | None = None,
        options: Any = None,
        adapters_dir: Path | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.controller = controller
        self.train = train
        self.samples = samples
        self.options = options
        self._adapters_dir = adapters_dir
        self._thread: QThread | None = None
        self._worker: TrainingWorker | None = None
        self._job: Job | None = None
        self.last_message = ""
        self.last_error = False
        controller.history_changed.connect(self.changed)
        # a method, not a lambda: the controller would hold a lambda holding this, which holds the
        # controller, a cycle the collector cannot see through Qt
        controller.settings_changed.connect(self._on_settings_changed)

    def _on_settings_changed(self, _settings: Any) -> None:
        self.changed.emit()

    # --- state -----------------------------------------------------------------------------------

    @property
    def adapters_dir(self) -> Path:
        if self._adapters_dir is None:
            from dictation import paths

            return paths.data_dir() / ADAPTERS_FOLDER
        return self._adapters_dir

    @property
    def running(self) -> bool:
        return self._job is not None

    @property
    def cancelling(self) -> bool:
        return self._job is not None and self._job.stop.is_set()

    def entries(self) -> list[Any]:
        return usable_entries(self.controller.history)

    def unavailable_reason(self) -> str | None:
        """Why Personalise cannot start now, or None when it can."""
        if self.running:
            return RUNNING
        if not self.controller.settings.engine.model:
            return NO_MODEL
        if not self.entries():
            return NO_ENTRIES
        return None

    def describe(self) -> str:
        """What a start would do (the button's tooltip and the question before it starts)."""
        count = len(self.entries())
        held = held_out_share(count)
        plan = f"Train a personal adapter on your {count} corrected dictation{'s' if count != 1 else ''}"
        if held:
            plan += f", holding about one in {round(1 / held)} out to measure it before and after"
        else:
            plan += f" (with {HOLD_OUT_FROM} or more, some are held out to measure it)"
        return plan + ". The new adapter is switched on when it is done."

    # --- actions ---------------------------------------------------------------------------------

    def start(self) -> str | None:
        """Start training; None when it started, else why not (also `finished` as an error)."""
        reason = self.unavailable_reason()
        if reason:
            return reason
        settings = self.controller.settings
        count = len(self.entries())
        try:
            out = out_folder(private_dir(self.adapters_dir))
        except OSError as exc:
            message = f"Cannot create {self.adapters_dir}: {exc.strerror or exc}"
            self._finish(message, error=True)
            return message
        self._job = Job(
            model=settings.engine.model,
            device=settings.engine.device,
            history=Path(self.controller.history.path),
            out=out,
            val=held_out_share(count),
            options=self.options,
            entries=count,
            stop=threading.Event(),
        )
        log.info("training a personal adapter on %d corrected dictation(s) into %s", count, out)
        self.last_message, self.last_error = "", False
        worker = TrainingWorker(self.train, self.samples)
        thread = QThread()
        thread.setObjectName("personalise")
        worker.moveToThread(thread)
        worker.progress.connect(self.progress)
        worker.status.connect(self.status)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.cancelled.connect(self._on_cancelled)
        self._run.connect(worker.run)
        self._worker, self._thread = worker, thread
        thread.start()
        self.changed.emit()
        self.status.emit("Starting …")
        self._run.emit(self._job)
        self._run.disconnect(worker.run)  # the next start has a worker of its own
        return None

    def cancel(self) -> None:
        """Ask the training to stop at its next check; `finished` follows once it has."""
        if self._job is not None and not self._job.stop.is_set():
            self._job.stop.set()
            log.info("personal adapter training: cancel requested")
            self.status.emit("Cancelling …")
            self.changed.emit()

    def shutdown(self) -> None:
        """The app quits: cancel a training and wait for its thread (at most `SHUTDOWN_WAIT_MS`)."""
        if self._job is None or self._thread is None:
            return
        self._job.stop.set()
        thread = self._thread
        thread.quit()  # its loop ends once the training returns
        if not thread.wait(SHUTDOWN_WAIT_MS):
            log.warning("the personalise training did not stop within %d s", SHUTDOWN_WAIT_MS // 1000)
            return
        _remove_if_unfinished(self._job.out)
        self._release()

    # --- answers from the worker ------------------------------------------------------------------

    def _on_finished(self, trained: Trained) -> None:
        job = self._job
        self._release()
        if job is None:
            return
        log.info("personal adapter trained: %s", trained.out)
        settings = self.controller.settings
        if settings.engine.model != job.model:  # the model was changed meanwhile: it is not for this one
            engine = settings.engine.replace(
                adapters=(*settings.engine.adapters, Adapter(str(trained.out), enabled=False))
            )
            self.controller.apply_settings(settings.replace(engine=engine))
            self._finish(
                f"The adapter was trained for {job.model}, but the model is now {settings.engine.model or 'none'}: "
                "it is in the adapter list, switched off. " + figures_text(trained.report),
                error=True,
            )
            return
        new = with_new_adapter(settings, trained.out, self.adapters_dir)
        errors = self.controller.apply_settings(new)
        if errors:
            message = (
                f"The adapter was trained ({trained.out}) but could not be switched on: "
                f"{'; '.join(str(e) for e in errors)}"
            )
            self._finish(message, error=True)
            return
        self._finish(trained.summary, error=False)

    def _on_failed(self, message: str) -> None:
        self._release()
        self._finish(f"Personalise failed: {message}", error=True)

    def _on_cancelled(self) -> None:
        self._release()
        self._finish("Personalise was cancelled; no adapter was made.", error=False)

    def _release(self) -> None:
        thread = self._thread
        self._job = self._worker = self._thread = None
        if thread is not None:
            thread.quit()
            thread.wait()

    def _finish(self, message: str, *, error: bool) -> None:
        self.last_message, self.last_error = message, error
        self.changed.emit()
        self.finished.emit(message, error)


def _remove_if_unfinished(out: Path) -> None:
    """After a cancelled run at quitting: an adapter folder without its report is not finished."""
    if not (out / REPORT_FILE).exists():
        remove_unfinished(out)
