#!/usr/bin/env bash
# Build the one-folder app dist/dictation/ with PyInstaller (Linux; see packaging/release.md for
# Windows and macOS, which run the same spec).
#
#     packaging/build_app.sh            # uses the active Python environment
#
# The environment must have the app installed (pip install .) or be a checkout with its
# dependencies, plus PyInstaller (pip install pyinstaller). For a CPU-only, smaller build install
# the CPU torch wheel first (pip install torch --index-url https://download.pytorch.org/whl/cpu);
# the CUDA wheel works too but the folder is several GB.
# Afterwards it runs the built app's --version and loads its engine as a smoke test, and prints the
# folder's size and (Linux) the oldest glibc and libstdc++ the folder runs on (packaging/linux_libs.py).
# DIST_DIR and WORK_DIR move the output (default dist/) and PyInstaller's work folder
# (default build/pyinstaller/); PYTHON picks the interpreter (default python); MAX_GLIBC (Linux, e.g.
# 2.35) fails the build when the folder needs a newer glibc than that.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
DIST_DIR=${DIST_DIR:-dist}
WORK_DIR=${WORK_DIR:-build/pyinstaller}

"$PYTHON" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "PyInstaller is not installed in this environment: $PYTHON -m pip install pyinstaller" >&2
    exit 1
}
start=$(date +%s)
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$DIST_DIR" --workpath "$WORK_DIR" packaging/pyinstaller/dictation.spec
end=$(date +%s)

app="$DIST_DIR/dictation/dictation"
[ -x "$app" ] || app="$DIST_DIR/dictation/dictation.exe"
"$app" --version
# `transcribe` imports torch and the engine before it looks at its files: a missing file must come
# back as the usual one-line error, not a traceback from a library the build left out.
out=$("$app" transcribe "$DIST_DIR/no-such-file.wav" --model none 2>&1 || true)
case "$out" in
    *Traceback*|*"Failed to execute"*|"") echo "the built app cannot load the engine:"; echo "$out"; exit 1 ;;
esac
if [ "$(uname -s)" = Linux ]; then
    "$PYTHON" packaging/linux_libs.py "$DIST_DIR/dictation" ${MAX_GLIBC:+--max "$MAX_GLIBC"}
fi
echo "built $DIST_DIR/dictation/ in $((end - start)) s, $(du -sh "$DIST_DIR/dictation" | cut -f1)"
