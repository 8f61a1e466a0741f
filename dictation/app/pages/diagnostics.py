"""The Diagnostics page: the `dictation doctor` checks as a tree, with the fixes, "Copy report" and "Run again".

The checks (:func:`dictation.doctor.run_checks`) run in a `dictation doctor --json` child process,
waited for on a worker thread, so a slow D-Bus or a cold torch import never freezes the window.
They run when the page is first shown, again when it is shown after a settings change, and on
"Run again". Three rows come from the running app itself, on the GUI thread: whether Qt sees a
system tray (instead of the doctor's guess from D-Bus), and which hotkey and output backends the
app is using right now.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from PySide6.QtCore import QModelIndex, QObject, QPointF, QRect, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QSystemTrayIcon,
    QTreeWidget,
    QTreeWidgetItem,
    QWidget,
)

from dictation import spawn
from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import WrappedLabel, style_as_help
from dictation.config.settings import Settings
from dictation.doctor import Check, format_report, summary, tray_check

log = logging.getLogger(__name__)

Runner = Callable[[Settings], list[Check]]
DOCTOR_TIMEOUT_S = 60


def doctor_command() -> list[str]:
    """How to start `dictation doctor --json`: this interpreter, or the frozen app's own binary."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "doctor", "--json"]
    return [sys.executable, "-m", "dictation", "doctor", "--json"]


def doctor_in_a_process(settings: Settings) -> list[Check]:
    """The checks, run by `dictation doctor --json` in a child process (the saved settings are what the
    controller applied). A process, not a thread of this one: the checks import modules (torch,
    sounddevice, the backends) and an import on a Python thread while Qt's GUI thread collects
    garbage can crash PySide6's import hook; and a slow torch import never touches the GUI."""
    try:
        proc = spawn.run(doctor_command(), capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S)
        report = json.loads(proc.stdout)
        return [Check(**item) for item in report["checks"]]
    except subprocess.TimeoutExpired:
        return [Check("Diagnostics", "Run", "problem", f"`dictation doctor` took over {DOCTOR_TIMEOUT_S} s")]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = (proc.stderr.strip().splitlines() or [""])[-1] if "proc" in locals() else ""
        return [Check("Diagnostics", "Run", "problem", f"`dictation doctor` failed: {exc} {detail}".strip())]


COLOURS = {"ok": "#2e7d32", "info": "#78909c", "warning": "#ef8f00", "problem": "#c62828"}
STATUS_TEXT = {"ok": "OK", "info": "Note", "warning": "Warning", "problem": "Problem"}
FIX_COLOUR = "#1565c0"
NAME_WIDTH, NAME_GAP = 190, 12  # the Check column at least; wider when a name needs it (`_fill_tree`)


def status_icon(status: str, size: int = 16) -> QIcon:
    """A filled circle in the status colour with a white tick, i, ! or cross (drawn, no font needed)."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QBrush(QColor(COLOURS[status])))
    painter.drawEllipse(0, 0, size, size)
    pen = QPen(QColor("white"), max(1.5, size / 8))
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    painter.setPen(pen)
    s = size / 16
    if status == "ok":
        painter.drawPolyline([QPointF(4.5 * s, 8.5 * s), QPointF(7 * s, 11 * s), QPointF(11.5 * s, 5.5 * s)])
    elif status == "problem":
        painter.drawLine(QPointF(5 * s, 5 * s), QPointF(11 * s, 11 * s))
        painter.drawLine(QPointF(11 * s, 5 * s), QPointF(5 * s, 11 * s))
    else:  # "!" for a warning, "i" for a note: a bar and a dot, swapped
        bar, dot = ((4 * s, 9 * s), 12 * s) if status == "warning" else ((7.5 * s, 12 * s), 4.5 * s)
        painter.drawLine(QPointF(8 * s, bar[0]), QPointF(8 * s, bar[1]))
        painter.drawPoint(QPointF(8 * s, dot))
    painter.end()
    return QIcon(pixmap)


def worst(checks: list[Check]) -> str:
    """An area's status: "problem" or "warning" if any check has it, else "ok" (notes need nothing done)."""
    statuses = {c.status for c in checks}
    return next((s for s in ("problem", "warning") if s in statuses), "ok")


class _WrapDelegate(QStyledItemDelegate):
    """Row heights that fit the text wrapped at the width the style really gives it (the column less
    the tree's indentation, the icon and the text margins): QTreeView alone keeps one line, and a
    guess wider than the real text area wraps a line Qt then has no room for and elides ("Grab …")."""

    def __init__(self, tree: QTreeWidget):
        super().__init__(tree)
        self.tree = tree

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        size = super().sizeHint(option, index)
        text = index.data(Qt.ItemDataRole.DisplayRole) or ""
        width = self.tree.columnWidth(index.column())
        if index.column() == 0:
            depth, parent = 0, index.parent()
            while parent.isValid():
                depth, parent = depth + 1, parent.parent()
            width -= self.tree.indentation() * (depth + 1)
        if width <= 0 or not text:
            return size
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.rect = QRect(0, 0, width, size.height())
        style = self.tree.style()
        area = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, self.tree)
        width = area.width() - 2 * (style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, self.tree) + 1)
        if width <= 0:
            return size
        metrics = QFontMetrics(opt.font)
        height = metrics.boundingRect(QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, text).height()
        return QSize(size.width(), max(size.height(), height + 6))


class _Relay(QObject):
    """Carries a finished run from the worker thread to the GUI thread (a queued signal)."""

    done = Signal(int, object)


class DiagnosticsPage(SettingsPage):
    name = "diagnostics"
    title = "Diagnostics"

    finished = Signal()  # a run's results are shown

    def __init__(self, controller: Any, parent: QWidget | None = None, *, runner: Runner | None = None):
        super().__init__(controller, parent)
        self._runner: Runner = runner or doctor_in_a_process
        self.checks: list[Check] = []
        self._generation = 0
        self._running = False
        self._stale = True  # run when the page is shown next
        self._relay = _Relay(self)
        self._relay.done.connect(self._show_results)

        intro = WrappedLabel(
            "What works on this computer, what does not, and how to fix it. "
            "`dictation doctor` prints the same report in a terminal."
        )
        style_as_help(intro)
        self.add_widget(intro)

        bar = QWidget()
        row = QHBoxLayout(bar)
        row.setContentsMargins(0, 0, 0, 0)
        self.summary = QLabel("Not checked yet.")
        row.addWidget(self.summary, 1)
        self.run_button = QPushButton("Run again")
        self.run_button.clicked.connect(self.run)
        row.addWidget(self.run_button)
        self.copy_button = QPushButton("Copy report")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy_report)
        row.addWidget(self.copy_button)
        self.add_widget(bar)

        self.tree = QTreeWidget()
        self.tree.setColumnCount(2)
        self.tree.setHeaderLabels(["Check", "Result"])
        self.tree.setWordWrap(True)
        self.tree.setUniformRowHeights(False)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.tree.setItemDelegate(_WrapDelegate(self.tree))
        self.tree.setSelectionMode(QTreeWidget.SelectionMode.SingleSelection)
        header = self.tree.header()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(0, NAME_WIDTH)
        header.sectionResized.connect(lambda *_: self.tree.doItemsLayout())  # re-wrap the long lines
        self.tree.setMinimumHeight(360)
        self._layout.addWidget(self.tree, 1)

    # --- running ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def run(self) -> None:
        """Start a run on a worker thread; a run still going is superseded (its results are dropped)."""
        self._generation += 1
        generation = self._generation
        self._running = True
        self._stale = False
        self.run_button.setEnabled(False)
        self.summary.setText("Checking…")
        settings = self.controller.settings
        thread = threading.Thread(target=self._work, args=(generation, settings), name="diagnostics", daemon=True)
        thread.start()

    def _work(self, generation: int, settings: Settings) -> None:
        try:
            checks = list(self._runner(settings))
        except Exception as exc:  # noqa: BLE001 - run_checks never raises; a replaced runner might
            log.exception("diagnostics failed")
            checks = [Check("Diagnostics", "Run", "problem", f"the checks failed: {type(exc).__name__}: {exc}")]
        with contextlib.suppress(RuntimeError):  # the page was deleted while the checks ran
            self._relay.done.emit(generation, checks)

    def _show_results(self, generation: int, checks: list[Check]) -> None:
        if generation != self._generation:
            return
        self.checks = self._with_live_checks(checks)
        self._running = False
        self.run_button.setEnabled(True)
        self.copy_button.setEnabled(True)
        self._fill_tree()
        self.summary.setText(f"{summary(self.checks)} Checked at {datetime.now().strftime('%H:%M:%S')}.")
        self.finished.emit()

    def _with_live_checks(self, checks: list[Check]) -> list[Check]:
        """The doctor's checks with what only the running app knows put in."""
        live = tray_check(QSystemTrayIcon.isSystemTrayAvailable(), os.environ, sys.platform, live=True)
        checks = [live if (c.area, c.name) == ("Session", "System tray") else c for c in checks]
        inserts = {}
        for area, getter in (("Hotkeys", "hotkey_description"), ("Output", "output_description")):
            describe = getattr(self.controller, getter, None)
            if describe is not None:
                try:
                    inserts[area] = Check(area, "In use by the app", "info", str(describe()))
                except Exception as exc:  # noqa: BLE001 - a row of the report, never a crash
                    inserts[area] = Check(area, "In use by the app", "info", f"unknown ({exc})")
        out: list[Check] = []
        for check in checks:
            out.append(check)
            if check.area in inserts and not any(c.area == check.area for c in out[:-1]):
                out.append(inserts.pop(check.area))  # right after the area's first (summary) row
        return out + list(inserts.values())

    # --- showing ----------------------------------------------------------------------------------

    def _fill_tree(self) -> None:
        self.tree.clear()
        areas = list(dict.fromkeys(c.area for c in self.checks))
        fix_brush = QBrush(QColor(FIX_COLOUR))
        for area in areas:
            members = [c for c in self.checks if c.area == area]
            status = worst(members)
            top = QTreeWidgetItem([area, STATUS_TEXT[status] if status in ("warning", "problem") else ""])
            top.setIcon(0, status_icon(status))
            font = top.font(0)
            font.setBold(True)
            top.setFont(0, font)
            self.tree.addTopLevelItem(top)
            for check in members:
                item = QTreeWidgetItem([check.name, check.detail])
                item.setIcon(0, status_icon(check.status))
                item.setToolTip(0, STATUS_TEXT[check.status])
                item.setToolTip(1, check.detail + (f"\n\nFix: {check.fix}" if check.fix else ""))
                item.setData(0, Qt.ItemDataRole.UserRole, check.status)
                top.addChild(item)
                if check.fix:
                    fix = QTreeWidgetItem(["Fix", check.fix])
                    fix.setForeground(0, fix_brush)
                    fix.setForeground(1, fix_brush)
                    item.addChild(fix)
            top.setExpanded(True)
            for i in range(top.childCount()):
                top.child(i).setExpanded(True)
        # Every check's name whole on one line ("Grab ctrl+alt+space"); the results wrap beside them.
        names = self.tree.sizeHintForColumn(0) + NAME_GAP
        self.tree.header().resizeSection(0, min(max(NAME_WIDTH, names), self.tree.viewport().width() // 2))

    def report(self) -> str:
        return format_report(self.checks)

    def copy_report(self) -> None:
        QApplication.clipboard().setText(self.report())
        self.summary.setText(f"{summary(self.checks)} The report is on the clipboard.")

    def shown_checks(self) -> list[tuple[str, str, str]]:
        """(area, name, status) of every check row in the tree, in order."""
        shown = []
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            for j in range(top.childCount()):
                item = top.child(j)
                shown.append((top.text(0), item.text(0), item.data(0, Qt.ItemDataRole.UserRole)))
        return shown

    # --- when to run ------------------------------------------------------------------------------

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if self._stale and not self._running:
            self.run()

    def refresh(self, settings: Settings) -> None:
        """Settings changed: the results may be out of date; run again now if the page is on screen."""
        self._stale = True
        if self.isVisible():
            self.run()  # supersedes a run still going with the old settings
