"""The frozen app's first runtime hook (the spec lists it; PyInstaller runs listed hooks before its own).

PyInstaller's PySide6 runtime hook sets QT_PLUGIN_PATH and QML2_IMPORT_PATH to the bundle's Qt (and
on Windows puts the bundle on PATH) without keeping the user's values. Record them first, so that the
programs the app starts get the user's (dictation/spawn.py).
"""

from dictation import spawn

spawn.remember_user_environment()
