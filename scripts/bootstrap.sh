#!/usr/bin/env bash
# Installs everything abicache's demo and tests need on a fresh machine.
# Idempotent: a second run only checks. Set PYTHON to use another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@"; }

apt_packages=()
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc)
command -v c++ >/dev/null 2>&1 || apt_packages+=(g++)
# redis-server: the remote tier's tests run against a real one on 127.0.0.1
command -v redis-server >/dev/null 2>&1 || apt_packages+=(redis-server)
# llvm-readobj: LLVM's reader of AMDGPU code objects, the reference the AMD audit is checked against
command -v llvm-readobj >/dev/null 2>&1 || apt_packages+=(llvm)
# clang's HIP toolchain (clang, lld, clang-offload-bundler): a real host library with an AMD
# offload bundle, no ROCm needed, and LLVM's own reader of bundles for the audit's tests
compgen -G "/usr/lib/llvm-*/bin/clang-offload-bundler" >/dev/null || apt_packages+=(clang lld clang-tools)
if ((${#apt_packages[@]})); then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing ${apt_packages[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}"
  elif ! command -v c++ >/dev/null 2>&1; then
    echo "bootstrap: please install ${apt_packages[*]} (a C and C++ compiler is required)" >&2
    exit 1
  else
    echo "bootstrap: ${apt_packages[*]} missing and apt-get unavailable: the tests that need them will skip" >&2
  fi
fi

pip_install -e '.[test]'

# The audit tests build torch ops and CUDA artifacts with the real tools.
# torch is pinned: 2.13.0 is the CPU wheel on these machines, and an unpinned
# 'torch' would pull a CUDA build of several GB.
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" \
  || pip_install 'torch==2.13.0'
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "bootstrap: no nvcc found; installing PyPI's nvidia-cuda-nvcc (CUDA 13)"
  pip_install 'nvidia-cuda-nvcc'
fi
# cross-checks the CUDA parser; NVRTC and runtimes of CUDA 12 and 13 for the loader,
# compile and stub tests (the CUDA 11 headers are downloaded by the tests themselves:
# its wheel would overwrite cu12's folder)
# Triton (pinned: the tests compare a 3.12 venv's compile with this one's)
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is None)" \
  || pip_install 'triton==3.9.0'
pip_install 'nvidia-cuda-cuobjdump' 'nvidia-cuda-nvrtc' 'nvidia-cuda-nvrtc-cu12' \
  'nvidia-cuda-runtime' 'nvidia-cuda-runtime-cu12'
if "$PY" -m pip show -q nvidia-cuda-runtime-cu11 >/dev/null 2>&1; then
  echo "bootstrap: nvidia-cuda-runtime-cu11 shares cu12's folder; removing it and restoring cu12" >&2
  "$PY" -m pip uninstall -y -q nvidia-cuda-runtime-cu11
  pip_install --force-reinstall --no-deps 'nvidia-cuda-runtime-cu12'
fi

echo "bootstrap: ready ($("$PY" -m abicache --version), $("$PY" --version))"
