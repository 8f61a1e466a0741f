"""The engine runs with Qt and the reference implementation unavailable (docs/architecture.md, principles 1 and 2)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import dictation

BLOCKED = [
    "PySide6",
    "PyQt5",
    "PyQt6",
    "transformers",
    "qwen_asr",
    "librosa",
    "soundfile",
    "scipy",
    "accelerate",
    "peft",
    "gguf",
]
PACKAGE = Path(dictation.__file__).parent


def test_engine_imports_and_transcribes_with_qt_and_transformers_blocked(ckpt_untied):
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked import of {{name}}")

        sys.meta_path.insert(0, Block())
        import numpy as np
        import dictation.asr, dictation.cli, dictation.audio.wav
        from dictation.asr import AsrEngine, EngineOptions
        t = np.arange(32000) / 16000
        audio = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
        engine = AsrEngine(EngineOptions(model={str(ckpt_untied)!r}, device="cpu"))
        print(len(engine.transcribe(audio, max_new_tokens=4).token_ids))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print("loaded:", loaded)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["4", "loaded: []"]


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_imports_qt_outside_app_or_the_reference_anywhere():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        roots = _imported_roots(path)
        in_app = "app" in path.relative_to(PACKAGE).parts[:1]
        if roots & {"transformers", "qwen_asr"} or (not in_app and roots & {"PySide6", "PyQt5", "PyQt6"}):
            offenders.append(str(path))
        if "import_module" in path.read_text(encoding="utf-8"):  # no way around the check above either
            offenders.append(f"{path} (importlib)")
    assert offenders == []


def test_light_modules_do_not_load_torch():
    """Settings, prompt helpers and the session machine stay cheap to import (the tray starts fast)."""
    script = (
        "import sys, dictation.asr, dictation.asr.text.prompt, dictation.asr.errors, dictation.session,"
        " dictation.config;"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_owner_of_takes_and_the_settings_mapping_load_neither_qt_nor_torch():
    """The app's logic outside its wiring (dictation.takes, dictation.app.options) is unit-tested without Qt."""
    script = (
        "import sys, dictation.takes, dictation.app.options;"
        "print(sorted(m for m in ('torch', 'PySide6') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
