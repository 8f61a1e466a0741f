"""The build backend of this project: setuptools', with one change.

setuptools stages the package in ``build/lib`` and packs everything that folder holds into the wheel,
and it never removes what it put there before. A module deleted or renamed since the last
``pip install .`` or ``pip wheel .`` in the same checkout would otherwise ship again in the next
wheel. So every wheel (regular or editable) starts from an empty ``build/lib``; nothing else under
``build/`` is touched (PyInstaller's work folder lives there too).

pyproject.toml names this module (``build-backend``, found through ``backend-path``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook of the PEP 517/660 interface)

STAGING = Path("build") / "lib"  # setuptools' default build_lib, relative to the project (the working directory)


def _start_clean() -> None:
    shutil.rmtree(STAGING, ignore_errors=True)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _start_clean()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _start_clean()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
