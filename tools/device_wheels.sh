#!/usr/bin/env bash
# The wheels a device call carries (.whl/, git-ignored): what the lent GPU machines lack for this project.
#   tools/device_wheels.sh          # once per checkout, here (not on the device): then carry ".whl" in each call
# The device image has torch and lightning (LoRA runs need nothing more: flux_cp has its own adapters), but not diffusers,
# wandb or jsonargparse (../shared/device-wheels) nor torchao (--fp8: downloaded here for Python 3.12 x86_64).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
cp ../shared/device-wheels/*.whl .whl/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  -d .whl "torchao==0.18.0"
ls .whl | wc -l | xargs echo "wheels in .whl/:"
