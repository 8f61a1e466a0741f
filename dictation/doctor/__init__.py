"""`dictation doctor` and the settings window's Diagnostics page: what works here, what does not, the fix.

`run_checks(settings)` returns a flat list of `Check(area, name, status, detail, fix)`, grouped by
area in `AREAS` order, one module per area:

- `session`: the display server and desktop, the tray, Qt's platform plugin and system libraries,
  the start-at-login entry;
- `hotkeys` and `output`: the hotkey and text-output backends, through those packages' own
  choosers, so the report says what the app itself would pick;
- `microphone`: the audio library, the sound server, the microphones;
- `engine`: torch and the GPU;
- `model`: the model folder, the adapters, the disk space;
- `files`: the app's files and who can read them.

`check` holds what they share (`Check`, `Context`); `report` runs them and formats the report
(`main` is `dictation doctor [--json]`). Status is "ok", "info" (nothing to do), "warning" (works,
but worse than it could) or "problem" (something the user wants does not work); every warning and
problem that has a remedy carries it in ``fix`` as the exact command or setting.

Qt-free (no Qt import) and safe to call from any thread. Nothing here loads a model, opens a
microphone stream, writes a file or touches the network (the Qt check dlopens Qt's platform plugin
and the system libraries of `dictation.system_packages`, as the app itself loads them); a run takes
well under a second, plus the import of torch when its build has CUDA (a CPU-only build is
recognised from torch/version.py without importing it). An exception inside an area becomes one
"problem" Check naming it: a run never raises.

Tests replace a probe (`torch_build`, `cuda_devices`, `bus_name_has_owner`, `hotkey_factories`, ...)
in the module that defines and calls it, e.g. ``monkeypatch.setattr(doctor.engine, "torch_build", ...)``;
this package re-exports only the report's API, the types and the fix texts.
"""

from dictation.doctor.check import AREAS, STATUSES, Check, Context
from dictation.doctor.engine import CPU_TORCH_URL, CUDA_TORCH_FIX, GpuInfo, TorchBuild, cpu_torch_fix
from dictation.doctor.hotkeys import BIND_COMMANDS_FIX
from dictation.doctor.microphone import SOUND_SERVER_FIX
from dictation.doctor.model import NO_MODEL_FIX
from dictation.doctor.output import YDOTOOLD_FIX
from dictation.doctor.report import (
    format_report,
    has_problems,
    load_settings_readonly,
    main,
    report_dict,
    run_checks,
    summary,
)
from dictation.doctor.session import tray_check

__all__ = [
    "AREAS",
    "BIND_COMMANDS_FIX",
    "CPU_TORCH_URL",
    "CUDA_TORCH_FIX",
    "NO_MODEL_FIX",
    "SOUND_SERVER_FIX",
    "STATUSES",
    "YDOTOOLD_FIX",
    "Check",
    "Context",
    "GpuInfo",
    "TorchBuild",
    "cpu_torch_fix",
    "format_report",
    "has_problems",
    "load_settings_readonly",
    "main",
    "report_dict",
    "run_checks",
    "summary",
    "tray_check",
]
