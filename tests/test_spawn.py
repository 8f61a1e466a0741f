"""Child processes get the environment the user started the app with.

The frozen (PyInstaller) app is simulated in this process (tests/frozen.py: sys.frozen, sys._MEIPASS,
LD_LIBRARY_PATH=<bundle>/_internal, LD_LIBRARY_PATH_ORIG, Qt's plugin paths, _PYI_* variables);
real child processes report what they received: a Python child, and stand-ins for xdotool and
nvidia-smi that run `env`. Every place in dictation/ that starts a process goes through
dictation.spawn (the last test keeps it so).
"""

from __future__ import annotations

import ast
import json
import os
import runpy
import sys
from pathlib import Path

import pytest

from dictation import spawn
from tests.frozen import (
    USER_LIBRARY_PATH,
    USER_QT_PLUGIN_PATH,
    bundle_variables,
    fake_tool,
    read_fake_tool,
    simulate_frozen,
)

ROOT = Path(__file__).resolve().parents[1]
DUMP_ENV = "import json, os; print(json.dumps(dict(os.environ)))"

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the fake tools are shell scripts")


@pytest.fixture(autouse=True)
def no_recorded_environment(monkeypatch):
    """Each test starts as if the app's runtime hook had not run (the module keeps what it recorded)."""
    monkeypatch.setattr(spawn, "_before_runtime_hooks", {})


def child_environment(**kwargs) -> dict[str, str]:
    proc = spawn.run([sys.executable, "-c", DUMP_ENV], capture_output=True, text=True, timeout=60, **kwargs)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_frozen_apps_child_gets_the_users_library_path(monkeypatch, tmp_path):
    bundle = simulate_frozen(monkeypatch, tmp_path)
    env = child_environment()
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH
    assert bundle_variables(env, bundle) == {}
    assert "QT_PLUGIN_PATH" not in env and "QML2_IMPORT_PATH" not in env  # the user had none
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"]  # the rest as it was
    assert os.environ["LD_LIBRARY_PATH"].startswith(str(bundle))  # this process keeps its own


def test_without_a_user_library_path_the_child_gets_none(monkeypatch, tmp_path):
    bundle = simulate_frozen(monkeypatch, tmp_path, user_library_path=None)
    env = child_environment()
    assert "LD_LIBRARY_PATH" not in env
    assert bundle_variables(env, bundle) == {}


def test_the_users_qt_paths_come_back_as_the_first_runtime_hook_recorded_them(monkeypatch, tmp_path):
    """packaging/pyinstaller/rthook_user_env.py runs before PyInstaller's PySide6 hook overwrites them."""
    monkeypatch.setenv("QT_PLUGIN_PATH", USER_QT_PLUGIN_PATH)
    monkeypatch.delenv("QML2_IMPORT_PATH", raising=False)
    runpy.run_path(str(ROOT / "packaging" / "pyinstaller" / "rthook_user_env.py"))
    bundle = simulate_frozen(monkeypatch, tmp_path)  # then the bootloader's and PySide6's changes
    env = child_environment()
    assert env["QT_PLUGIN_PATH"] == USER_QT_PLUGIN_PATH
    assert "QML2_IMPORT_PATH" not in env
    assert bundle_variables(env, bundle) == {}


def test_an_explicit_environment_is_cleaned_too_and_cleaning_twice_changes_nothing(monkeypatch, tmp_path):
    bundle = simulate_frozen(monkeypatch, tmp_path)
    session = {**os.environ, "DISPLAY": ":7"}
    env = child_environment(env=session)
    assert env["DISPLAY"] == ":7" and env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH
    assert bundle_variables(env, bundle) == {}
    once = spawn.user_environment(session)
    assert spawn.user_environment(once) == once


def test_a_source_install_passes_the_environment_on_unchanged(monkeypatch, tmp_path):
    """Not frozen: even variables that look like a bundle's are the user's business."""
    monkeypatch.setattr(sys, "frozen", False, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "_internal"))
    monkeypatch.setenv("LD_LIBRARY_PATH_ORIG", "/elsewhere")
    monkeypatch.setenv("_PYI_APPLICATION_HOME_DIR", str(tmp_path))
    env = child_environment()
    for name in ("LD_LIBRARY_PATH", "LD_LIBRARY_PATH_ORIG", "_PYI_APPLICATION_HOME_DIR"):
        assert env[name] == os.environ[name]


def test_the_typing_tool_gets_the_users_environment(monkeypatch, tmp_path):
    """xdotool started by the X11 typing backend through SystemHost, the path every dictation takes."""
    from dictation.output.environment import Session
    from dictation.output.keys import XdotoolKeys
    from dictation.output.process import SystemHost

    bundle = simulate_frozen(monkeypatch, tmp_path)
    out = tmp_path / "xdotool.out"
    fake_tool(tmp_path / "bin", "xdotool", out)
    session_env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "DISPLAY": ":5"}
    XdotoolKeys(SystemHost(session_env), Session("x11", display=":5")).type_text("hello", 0)
    args, env, stdin = read_fake_tool(out)
    assert args.endswith("type --delay 0 --file -") and stdin == "hello"
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH and env["DISPLAY"] == ":5"
    assert bundle_variables(env, bundle) == {}


def test_the_clipboard_tool_that_stays_behind_gets_the_users_environment(monkeypatch, tmp_path):
    """xclip -i forks a daemon that serves the selection: it runs without pipes (capture_stdout=False)."""
    from dictation.output.process import SystemHost

    bundle = simulate_frozen(monkeypatch, tmp_path, user_library_path=None)
    out = tmp_path / "xclip.out"
    fake_tool(tmp_path / "bin", "xclip", out)
    host = SystemHost({**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    result = host.run(["xclip", "-i", "-selection", "clipboard"], input=b"text", capture_stdout=False)
    assert result.ok, result.failure()
    _, env, stdin = read_fake_tool(out)
    assert stdin == "text" and "LD_LIBRARY_PATH" not in env and bundle_variables(env, bundle) == {}


def test_nvidia_smi_gets_the_users_environment(monkeypatch, tmp_path):
    from dictation import doctor

    bundle = simulate_frozen(monkeypatch, tmp_path)
    out = tmp_path / "smi.out"
    fake_tool(tmp_path / "bin", "nvidia-smi", out, stdout="0, NVIDIA H100 80GB HBM3, 81559, 80000\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env_in = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    (gpu,) = doctor.engine._smi_memory(env_in)
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.free_bytes == 80000 * 2**20
    _, env, _ = read_fake_tool(out)
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH and bundle_variables(env, bundle) == {}


def test_the_pattern_matchers_child_gets_the_users_environment(monkeypatch, tmp_path):
    """The child that matches a LoRA adapter's regular expressions (dictation.asr.tune.patterns)."""
    from dictation.asr.tune import patterns

    bundle = simulate_frozen(monkeypatch, tmp_path)
    env_out = tmp_path / "child-env.json"
    child = tmp_path / "child.py"  # records its environment, then is the real child
    child.write_text(
        "import json, os, runpy\n"
        f"open({str(env_out)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        f"runpy.run_path({patterns.__file__!r}, run_name='__main__')\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(patterns, "child_command", lambda: [sys.executable, "-I", "-S", str(child)])
    result = patterns.first_matches([(patterns.FULL, ["q_proj|v_proj"])], ["v_proj", "k_proj"])
    assert result == [[0, None]]
    env = json.loads(env_out.read_text(encoding="utf-8"))
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH and bundle_variables(env, bundle) == {}


# --- every process the app starts goes through dictation.spawn ------------------------------------

# Calls that start a process, by module: subprocess's, os's, and Qt's (QProcess, QDesktopServices).
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
OS_CALLS = {"system", "popen", "posix_spawn", "posix_spawnp", "startfile"} | {
    f"{base}{suffix}" for base in ("exec", "spawn") for suffix in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")
}
# The one allowed exception: Qt opens the log folder where there is no xdg-open (Windows, macOS).
ALLOWED = {("dictation/app/pages/log_page.py", "QDesktopServices.openUrl")}


def process_starts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os"):
            names = SUBPROCESS_CALLS if node.module == "subprocess" else OS_CALLS
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name in names]
        if isinstance(node, ast.ImportFrom) and node.module and "QtCore" in node.module:
            found += ["QProcess" for a in node.names if a.name == "QProcess"]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            call = f"{name}.{node.func.attr}"
            if (
                (name == "subprocess" and node.func.attr in SUBPROCESS_CALLS)
                or (name == "os" and node.func.attr in OS_CALLS)
                or call == "QDesktopServices.openUrl"
            ):
                found.append(call)
    return found


def test_every_process_the_app_starts_goes_through_spawn():
    offenders = {}
    for path in sorted((ROOT / "dictation").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "dictation/spawn.py":
            continue
        calls = [c for c in process_starts(path) if (rel, c) not in ALLOWED]
        if calls:
            offenders[rel] = calls
    assert offenders == {}


def test_the_guard_sees_each_way_of_starting_a_process(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, subprocess\nfrom subprocess import Popen\nfrom PySide6.QtCore import QProcess\n"
        "subprocess.run(['x'])\nsubprocess.check_output(['x'])\nos.system('x')\nos.execvp('x', ['x'])\n"
        "QDesktopServices.openUrl(url)\nspawn.run(['x'])\n",
        encoding="utf-8",
    )
    assert sorted(process_starts(sample)) == sorted(
        [
            "from subprocess import Popen",
            "QProcess",
            "subprocess.run",
            "subprocess.check_output",
            "os.system",
            "os.execvp",
            "QDesktopServices.openUrl",
        ]
    )
