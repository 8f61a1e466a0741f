"""The Model page: which model (a folder, or a known model from the Hugging Face cache, or a download),
where it runs and in which precision, LoRA adapters (and Personalise, which trains one on the
dictations the user corrected: `PersonalisePanel`), and the language and vocabulary hints.

Folders and adapters are checked before they are applied (``check_model_folder``, ``check_adapter``):
a refused one is named with its problem under the control and the settings stay as they were.
Adapter checks run on a worker thread (an adapter's regular expressions may take up to a few
seconds to be refused, dictation.asr.tune.patterns): the list is disabled meanwhile, the window stays live.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from dictation.app.pages import SettingsPage
from dictation.app.widgets.adapter_list import AdapterList
from dictation.app.widgets.download_panel import DownloadPanel
from dictation.app.widgets.fields import ChoiceEditor, FieldEditor, WrappedLabel, fields_of, info_for, style_as_help
from dictation.app.widgets.personalise_panel import PersonalisePanel
from dictation.app.widgets.recent_models import RecentModelsList
from dictation.asr.checkpoints.hub import KNOWN_MODELS, KnownModel, find_known_model, hf_cache_dir, looks_like_repo_id
from dictation.asr.tune.adapter_files import check_adapter as _check_adapter
from dictation.config.schema import FieldInfo
from dictation.config.settings import Adapter, Settings

# Weight memory of each variant relative to bf16, measured with `dictation bench` (engine.weight_bytes):
# int8 0.72x (0.6B) / 0.65x (1.7B), int4 0.60x / 0.50x; the audio encoder, embeddings and output head stay
# in bf16, so the small model shrinks less. The larger (0.6B) ratios, so the estimate is not optimistic.
MEMORY_FACTORS = {"bf16": 1.0, "fp16": 1.0, "fp32": 2.0, "int8": 0.72, "int4": 0.6}

# Built by hand on this page; engine.idle_unload_minutes is on the General page.
HAND_BUILT = {"engine.model", "engine.recent_models", "engine.adapters", "engine.idle_unload_minutes"}
# On the Vocabulary page (dictation.app.pages.vocabulary_page).
VOCABULARY_KEYS = {"transcription.context", "transcription.learned_words", "transcription.learn_from_corrections"}


def check_model_folder(path: str | Path) -> str | None:
    from dictation.asr.checkpoints.hub import check_model_folder as check

    return check(path)


def check_adapter(adapter_dir: str | Path, model_folder: str | Path | None) -> str | None:
    return _check_adapter(adapter_dir, model_folder)  # imported above: never import on a worker thread


class _Relay(QObject):
    """Carries a check's results from its worker thread to the GUI thread (a queued signal)."""

    done = Signal(str, int, object)  # kind, generation, results


def known_model_for(spec: str, cached: dict[str, Path] | None = None) -> KnownModel | None:
    """The known model ``spec`` (a repo id or a folder) is, if it can be told; None otherwise."""
    if not spec:
        return None
    model = find_known_model(spec)
    if model is not None:
        return model
    path = Path(spec).expanduser()
    for repo_id, folder in (cached or {}).items():
        if path == folder:
            return find_known_model(repo_id)
    for known in KNOWN_MODELS:
        cache_name = "models--" + known.repo_id.replace("/", "--")
        if cache_name in path.parts or path.name == known.repo_id.split("/")[1]:
            return known
    return None


def variant_labels(choices: tuple[tuple[str, str], ...], known: KnownModel | None) -> dict[str, str]:
    """Combo labels with the approximate GPU memory each weights variant needs."""
    labels = {}
    for value, label in choices:
        factor = MEMORY_FACTORS.get(value)
        if factor is None:
            labels[value] = f"{label} (matches the precision)" if value == "auto" else label
        elif known is not None:
            labels[value] = f"{label} — about {known.vram_gb * factor:.1f} GB GPU memory (approx.)"
        else:
            labels[value] = f"{label} — about {factor:g}× the bf16 memory (approx.)"
    return labels


def intro_text() -> str:
    parts = []
    for model in KNOWN_MODELS:
        if model.transformers_layout:
            continue
        parts.append(
            f"<b>{model.label}</b>: {model.description} Download {model.download_gb:.1f} GB, "
            f"needs about {model.vram_gb:.1f} GB of GPU memory in bf16."
        )
    return (
        "<p>Dictation runs a Qwen3-ASR speech model on this computer. Choose one to start:</p><ul>"
        + "".join(f"<li>{p}</li>" for p in parts)
        + "</ul><p>Press <b>Download</b> next to a model below, or choose a model folder you already have. "
        "With little GPU memory pick the 0.6B model or an int8/int4 variant; without a GPU the 0.6B model "
        "is the better choice.</p>"
    )


def dialog_start(value: str, recent: list[str] | tuple[str, ...] = ()) -> Path:
    """Where the folder chooser opens: beside the model folder in use (its parent, so the other models
    there show), else beside the newest recent folder that still exists, else the home folder; never
    the directory the app happened to be started from."""
    candidates = [value] if value and Path(value).expanduser().is_absolute() else []
    candidates += list(recent)
    for spec in candidates:
        path = Path(spec).expanduser()
        if path.exists() and path.parent.is_dir():
            return path.parent
    return Path.home()


class ModelFolderEditor(FieldEditor):
    """A line edit (folder or repo id) with a Browse button; applies on Enter, focus-out or a chosen folder."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("Model folder, or a Hugging Face id such as Qwen/Qwen3-ASR-1.7B")
        self.edit.editingFinished.connect(lambda: self.committed.emit(self.value()))
        layout.addWidget(self.edit, 1)
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self.choose_folder)
        layout.addWidget(self.browse)
        self._add(row)
        self.recent: tuple[str, ...] = ()  # the recent model folders, for where the chooser opens

    def value(self) -> str:
        return self.edit.text().strip()

    def set_value(self, value: Any) -> None:
        if self.edit.text() == value:
            return
        self.edit.blockSignals(True)
        self.edit.setText(str(value))
        self.edit.blockSignals(False)

    def choose_folder(self) -> None:
        start = str(dialog_start(self.value(), self.recent))
        folder = QFileDialog.getExistingDirectory(self, "Choose a Qwen3-ASR model folder", start)
        if folder:
            self.committed.emit(folder)


class KnownModelRow(QFrame):
    """One known model: name, sizes, description, whether it is downloaded, and Use / Download."""

    def __init__(self, model: KnownModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = model
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        text = QVBoxLayout()
        text.setSpacing(2)
        self.title = QLabel(f"<b>{model.label}</b>")
        text.addWidget(self.title)
        self.details = WrappedLabel(
            f"{model.download_gb:.1f} GB download · about {model.vram_gb:.1f} GB GPU memory (bf16) · "
            f"{model.description}"
        )
        style_as_help(self.details)
        text.addWidget(self.details)
        text.addStretch(1)
        layout.addLayout(text, 1)
        self.status = QLabel()
        layout.addWidget(self.status)
        self.button = QPushButton()
        self.button.setMinimumWidth(90)
        layout.addWidget(self.button)

    def show_state(self, *, cached: bool, in_use: bool, downloading: str) -> None:
        if in_use:
            self.status.setText("In use")
            self.button.setText("Use")
            self.button.setEnabled(False)
        elif cached:
            self.status.setText("Downloaded")
            self.button.setText("Use")
            self.button.setEnabled(True)
        else:
            self.status.setText("Downloading…" if downloading == self.model.repo_id else "Not downloaded")
            self.button.setText("Download")
            self.button.setEnabled(not downloading)


class ModelPage(SettingsPage):
    name = "model"
    title = "Model"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        self._cached: dict[str, Path] = {}

        self.intro = QFrame()
        self.intro.setObjectName("intro")
        self.intro.setStyleSheet(
            "QFrame#intro { border: 2px solid palette(highlight); border-radius: 6px; background: palette(base); }"
        )
        intro_layout = QVBoxLayout(self.intro)
        heading = QLabel("<b>Choose a speech model to start dictating</b>")
        intro_layout.addWidget(heading)
        self.intro_text = WrappedLabel(intro_text())
        self.intro_text.setTextFormat(Qt.TextFormat.RichText)
        intro_layout.addWidget(self.intro_text)
        self.add_widget(self.intro)

        current = self.add_group("Current model")
        self.loaded_label = QLabel()
        self.loaded_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        current.add_widget("Loaded", self.loaded_label)
        self.progress_label = WrappedLabel()
        self.progress_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        current.add_widget("Status", self.progress_label)
        self.model_row = current.add_field(info_for("engine.model"), ModelFolderEditor(info_for("engine.model")))
        self.model_editor: ModelFolderEditor = self.model_row.editor
        self.download_button = QPushButton()
        self.download_button.hide()
        self.download_button.clicked.connect(self._download_named_model)
        current.add_widget("", self.download_button)
        self._repo_to_download = ""
        self.recent_row = current.add_field(
            info_for("engine.recent_models"), RecentModelsList(info_for("engine.recent_models")), show_help=False
        )
        self.recent_list: RecentModelsList = self.recent_row.editor
        self.recent_list.use_requested.connect(self.choose_model)

        known = self.add_group("Known models")
        self.model_rows: dict[str, KnownModelRow] = {}
        for model in KNOWN_MODELS:
            row = KnownModelRow(model)
            row.button.clicked.connect(lambda _checked=False, repo_id=model.repo_id: self._on_model_button(repo_id))
            known.add_widget("", row)
            self.model_rows[model.repo_id] = row
        self.download_panel = DownloadPanel()
        self.download_panel.cancel_requested.connect(controller.cancel_download)
        known.add_widget("", self.download_panel)
        self.add_note(known, "Models are stored in the Hugging Face cache, shared with other tools.")

        runs = self.add_group("Where it runs")
        runs.add_fields(fields_of("engine", HAND_BUILT))
        self.variant_editor = runs.rows["engine.variant"].editor
        self.add_note(runs, "GPU memory figures are approximate: weights plus working memory for dictation.")

        self.add_group("Transcription", fields_of("transcription", VOCABULARY_KEYS))

        adapters = self.add_group("LoRA adapters")
        self.adapter_row = adapters.add_field(
            info_for("engine.adapters"), AdapterList(info_for("engine.adapters")), span=True
        )
        self.adapter_list: AdapterList = self.adapter_row.editor
        self.checking_label = self.add_note(adapters, "")
        self.checking_label.hide()
        self.personalise = PersonalisePanel(controller.personaliser)
        adapters.add_widget("", self.personalise)
        self._relay = _Relay(self)
        self._relay.done.connect(self._on_checked)
        self._checks: dict[str, tuple[int, Callable[[list], None]]] = {}  # kind -> (generation, then)

        controller.model_label_changed.connect(self._show_model_label)
        controller.model_progress.connect(self.progress_label.setText)
        self.progress_label.setText(controller.model_state_text)  # the messages before this page existed
        controller.download_progress.connect(self._on_download_progress)
        controller.download_finished.connect(self._on_download_finished)
        self._show_model_label(controller.model_label)
        self.scan_cache()
        self.finish()

    # --- showing ----------------------------------------------------------------------------------

    def refresh(self, settings: Settings) -> None:
        super().refresh(settings)
        self.intro.setVisible(settings.engine.model == "")
        self.recent_list.set_current(settings.engine.model)
        self.model_editor.recent = tuple(r.path for r in settings.engine.recent_models)
        known = known_model_for(settings.engine.model, self._cached)
        if isinstance(self.variant_editor, ChoiceEditor):
            self.variant_editor.set_item_labels(variant_labels(self.variant_editor.info.choices or (), known))
        self._update_model_rows(settings)

    def _update_model_rows(self, settings: Settings) -> None:
        spec = settings.engine.model
        downloading = self.download_panel.repo_id if self.download_panel.running else ""
        for repo_id, row in self.model_rows.items():
            folder = self._cached.get(repo_id)
            in_use = spec == repo_id or (folder is not None and spec != "" and Path(spec).expanduser() == folder)
            row.show_state(cached=folder is not None, in_use=in_use, downloading=downloading)

    def _show_model_label(self, label: str) -> None:
        self.loaded_label.setText(label or "No model loaded")

    def scan_cache(self) -> None:
        """Look again at which known models are in the Hugging Face cache (offline)."""
        from dictation.asr.checkpoints.hub import cached_models

        self._cached = dict(cached_models())
        self._update_model_rows(self.controller.settings)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.scan_cache()  # a model may have been downloaded elsewhere (the CLI) meanwhile
        self.recent_list.rebuild()  # and a folder may have gone (or its drive come back)

    # --- applying ---------------------------------------------------------------------------------

    def commit(self, info: FieldInfo, value: Any) -> None:
        if info.key == "engine.model":
            self.choose_model(value)
        elif info.key == "engine.recent_models":
            settings = self.controller.settings
            self.apply(settings.replace(engine=settings.engine.replace(recent_models=tuple(value))))
        elif info.key == "engine.adapters":
            self.set_adapters(value)
        else:
            super().commit(info, value)

    def choose_model(self, spec: str) -> bool:
        """Check ``spec`` (a folder or a repo id) and make it the model; False (and why, shown) if refused."""
        settings = self.controller.settings
        spec = spec.strip()
        if spec:
            path = Path(spec).expanduser()
            if path.is_dir() or not looks_like_repo_id(spec):
                spec = str(path.absolute())
        self._offer_download("")
        if spec == settings.engine.model:
            self.model_row.editor.set_value(spec)
            return True
        if spec:
            problem = model_problem(spec)
            if problem:
                self.model_row.show_error(problem)
                self.model_row.editor.set_value(settings.engine.model)
                if looks_like_repo_id(spec) and not Path(spec).is_dir() and not model_folder_of(spec):
                    self._offer_download(spec)
                return False
        errors = self.apply(settings.replace(engine=settings.engine.with_model(spec)))
        if errors:
            return False
        self._warn_unfit_adapters()
        return True

    def set_adapters(self, adapters: tuple[Adapter, ...]) -> None:
        """Apply a new adapter list after checking each adapter that is new or newly switched on (on a
        worker thread; the list waits, disabled, and the change applies when the checks pass)."""
        settings = self.controller.settings
        before = {a.path for a in settings.engine.adapters if a.enabled}
        paths = [a.path for a in adapters]
        duplicate = next((p for i, p in enumerate(paths) if p in paths[:i]), None)
        if duplicate:
            self._refuse_adapters(f"{duplicate} is already in the list.")
            return
        new = [a.path for a in adapters if a.enabled and a.path not in before]
        if not new:
            self._apply_adapters(adapters)
            return
        model_folder = model_folder_of(settings.engine.model)
        self.adapter_list.setEnabled(False)
        self.checking_label.setText(f"Checking {Path(new[0]).name} against the model …")
        self.checking_label.show()

        def then(problems: list[str | None]) -> None:
            self.adapter_list.setEnabled(True)
            self.checking_label.hide()
            problem = next((p for p in problems if p), None)
            if problem:
                self._refuse_adapters(problem)
            else:
                self._apply_adapters(adapters)

        self._check_off_thread("add", [(path, model_folder) for path in new], then)

    def _apply_adapters(self, adapters: tuple[Adapter, ...]) -> None:
        settings = self.controller.settings  # now: other settings may have changed while an adapter was checked
        self.apply(settings.replace(engine=settings.engine.replace(adapters=tuple(adapters))))

    def _refuse_adapters(self, problem: str) -> None:
        self.adapter_row.show_error(problem)
        self.adapter_list.set_value(self.controller.settings.engine.adapters)

    def _warn_unfit_adapters(self) -> None:
        """After a model change, say which enabled adapters do not fit it (they would be switched off at
        the load); checked on a worker thread."""
        settings = self.controller.settings
        folder = model_folder_of(settings.engine.model)
        jobs = [(a.path, folder) for a in settings.engine.adapters if a.enabled]

        def then(problems: list[str | None]) -> None:
            problems = [p for p in problems if p]
            if problems:
                self.adapter_row.show_error(" ".join(problems) + " Switch it off or remove it.")

        if jobs:
            self._check_off_thread("fit", jobs, then)

    def _check_off_thread(self, kind: str, jobs: list[tuple[str, Path | None]], then: Callable[[list], None]) -> None:
        """check_adapter for each (adapter, model folder) in ``jobs`` on a worker thread, then ``then(results)``
        on the GUI thread; a newer check of the same ``kind`` supersedes this one."""
        generation = self._checks.get(kind, (0, None))[0] + 1
        self._checks[kind] = (generation, then)
        check, relay = check_adapter, self._relay  # looked up here: the thread imports nothing

        def work() -> None:
            results = []
            for adapter, folder in jobs:
                try:
                    results.append(check(adapter, folder))
                except Exception as exc:  # a check that breaks still answers, as a refusal
                    results.append(f"{adapter}: cannot be checked ({exc})")
            with contextlib.suppress(RuntimeError):  # the window was closed meanwhile
                relay.done.emit(kind, generation, results)

        threading.Thread(target=work, name=f"adapter-check-{kind}", daemon=True).start()

    def _on_checked(self, kind: str, generation: int, results: list) -> None:
        current, then = self._checks.get(kind, (0, None))
        if generation != current or then is None:
            return  # superseded
        self._checks[kind] = (generation, None)
        then(results)

    # --- known models and downloads ---------------------------------------------------------------

    def _offer_download(self, repo_id: str) -> None:
        """Show (or, with "", hide) a Download button for a repo id that is not in the cache yet."""
        self._repo_to_download = repo_id
        if repo_id:
            self.download_button.setText(f"Download {repo_id}")
            self.download_button.setEnabled(not self.download_panel.running)
        self.download_button.setVisible(bool(repo_id))

    def _download_named_model(self) -> None:
        repo_id = self._repo_to_download
        if repo_id and not self.download_panel.running:
            self.model_row.clear_error()
            self._offer_download("")
            self.model_row.editor.set_value(repo_id)  # shown while it downloads; chosen when done
            self.start_download(repo_id)

    def _on_model_button(self, repo_id: str) -> None:
        if repo_id in self._cached:
            self.choose_model(repo_id)
        else:
            self.start_download(repo_id)

    def start_download(self, repo_id: str) -> None:
        self.download_panel.start(repo_id)
        self._update_model_rows(self.controller.settings)
        self._show_download_panel()
        self.controller.start_download(repo_id)

    def _show_download_panel(self) -> None:
        """Scroll the page so the download's progress is in view."""
        area = self.parentWidget()
        while area is not None and not isinstance(area, QScrollArea):
            area = area.parentWidget()
        if area is not None:
            area.ensureWidgetVisible(self.download_panel)

    def _on_download_progress(self, repo_id: str, done: int, total: int) -> None:
        if not self.download_panel.running or self.download_panel.repo_id != repo_id:
            self.download_panel.start(repo_id)  # started elsewhere (the tray's first-run prompt)
            self._update_model_rows(self.controller.settings)
        self.download_panel.set_progress(done, total)

    def _on_download_finished(self, repo_id: str, error: str) -> None:
        if self.download_panel.repo_id != repo_id:
            self.download_panel.start(repo_id)
        self.download_panel.finish(error)
        self.scan_cache()
        if not error:
            self.choose_model(repo_id)
        else:
            self.model_row.editor.set_value(self.controller.settings.engine.model)


def model_problem(spec: str) -> str | None:
    """Why ``spec`` (an absolute folder or a repo id) cannot be used, or None. A repo id that is not
    (completely) downloaded points to the Download button the page shows beside it."""
    if looks_like_repo_id(spec) and not Path(spec).is_dir():
        folder = model_folder_of(spec)
        if folder is None:
            return not_downloaded(spec)
        return check_model_folder(folder)
    return check_model_folder(spec)


def not_downloaded(repo_id: str) -> str:
    known = find_known_model(repo_id)
    size = f" ({known.download_gb:.1f} GB)" if known is not None else ""
    partly = (hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))).is_dir()
    if partly:
        return f"{repo_id} is only partly downloaded. Press Download{size} to finish it; it is chosen when done."
    return (
        f"{repo_id} is not downloaded yet. Press Download to fetch it{size} into the Hugging Face cache; "
        "it is chosen when done."
    )


def model_folder_of(spec: str) -> Path | None:
    """The folder ``engine.model`` names (a cached repo resolved offline), or None if there is none."""
    if not spec:
        return None
    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.errors import ModelError

    try:
        return resolve_model(spec)
    except ModelError:
        return None
