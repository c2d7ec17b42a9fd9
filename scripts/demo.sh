#!/usr/bin/env bash
# One command: set up flashcore on this machine and run its main job (`flashcore demo`).
# Keeps an existing torch (e.g. a CUDA build); otherwise installs the CPU build 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
python3 -c "import triton" 2>/dev/null || python3 -m pip install -q "triton==3.6.0"
python3 -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || {
  python3 -m pip install -q "numpy<2.3"     # the Triton interpreter needs numpy < 2.3
  export TRITON_INTERPRET=1                  # no GPU: run the Triton kernels in the interpreter
}
python3 -m pip install -q --no-build-isolation -e ".[test]" 2>/dev/null || python3 -m pip install -q -e ".[test]"
exec flashcore demo "$@"
