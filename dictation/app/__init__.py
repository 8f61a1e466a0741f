"""The desktop app: tray icon, settings and history windows, overlay, IPC (the only package importing PySide6).

`dictation.app.main.run()` starts it; `AppController` (controller.py) wires the Qt-free core
(session, capture, engine, output, hotkeys, settings, history) together on the GUI thread.
"""
