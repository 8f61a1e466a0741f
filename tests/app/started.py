"""Tear down apps that `dictation.app.main.start()` started inside a test process."""

from __future__ import annotations

import logging
import signal


def stop_started_apps(started: list, handlers: dict) -> None:
    """Shut each app down, close its windows, stop its wake timer; restore the signal handlers
    saved before (``handlers``: signal -> handler) and drop the app's log handlers."""
    for app in started:
        app.shutdown()
        for thread in app.controller.left_running:  # the engine was still loading: let it end, then
            thread.wait()  # free the model it loaded (the app's process would simply end here)
            app.controller._s.engine_worker.close()
        app.qapp.aboutToQuit.disconnect(app.shutdown)
        for window in (app.settings_window, app.history_window):
            if window is not None:
                window.close()
        app.wake.stop()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_dictation", False)]:
        root.removeHandler(handler)
        handler.close()
