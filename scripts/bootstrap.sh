#!/usr/bin/env bash
# Sets up a fresh machine for abicache, idempotently (a second run only checks).
#   bash scripts/bootstrap.sh          the main job: a C/C++ compiler and abicache with its
#                                      core dependencies (pip install -e .), about a minute
#   bash scripts/bootstrap.sh --test   and everything the tests use: torch 2.13 CPU, Triton,
#                                      NVIDIA's CUDA wheels, redis-server, LLVM and clang (GBs)
# Set PYTHON to use another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    *) echo "bootstrap: unknown option $arg (use --test for the test tools)" >&2; exit 2 ;;
  esac
done
pip_install() {
  echo "bootstrap: pip install $*"
  "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@"
}

# PEP 668: a system Python (Debian 12, Ubuntu 23.04+) refuses pip installs outside a venv.
if "$PY" -c "import sys, sysconfig, os; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'))))"; then
  cat >&2 <<EOF_PEP668
bootstrap: $("$PY" -c 'import sys; print(sys.executable)') is managed by your system's package manager
(PEP 668: pip may not install into it). Make a virtual environment, activate it, and run this again:
    python3 -m venv .venv && . .venv/bin/activate
    bash scripts/bootstrap.sh$([ "$TEST" = 1 ] && echo " --test")
EOF_PEP668
  exit 1
fi

apt_packages=()
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc)
command -v c++ >/dev/null 2>&1 || apt_packages+=(g++)
if [ "$TEST" = 1 ]; then
  # redis-server: the remote tier's tests run against a real one on 127.0.0.1
  command -v redis-server >/dev/null 2>&1 || apt_packages+=(redis-server)
  # ccache: a real compiler wrapper ($CXX="ccache g++"), whose compiler abicache must see through,
  # and the compiler launcher's peer; make, CMake and ninja: the builds the launcher serves
  command -v ccache >/dev/null 2>&1 || apt_packages+=(ccache)
  command -v make >/dev/null 2>&1 || apt_packages+=(make)
  command -v cmake >/dev/null 2>&1 || apt_packages+=(cmake)
  command -v ninja >/dev/null 2>&1 || apt_packages+=(ninja-build)
  # llvm-readobj: LLVM's reader of AMDGPU code objects, the reference the AMD audit is checked against
  command -v llvm-readobj >/dev/null 2>&1 || apt_packages+=(llvm)
  # clang's HIP toolchain (clang, lld, clang-offload-bundler): a real host library with an AMD
  # offload bundle, no ROCm needed, and LLVM's own reader of bundles for the audit's tests
  compgen -G "/usr/lib/llvm-*/bin/clang-offload-bundler" >/dev/null || apt_packages+=(clang lld clang-tools)
fi
# gcc's plugin headers: a real -fplugin= (loaded by cc1plus with dlopen) for the fidelity tests;
# optional (named by the gcc here, which another distribution may not package): its test skips without
optional_packages=()
if [ "$TEST" = 1 ] && command -v gcc >/dev/null 2>&1 \
    && [ ! -f "$(gcc -print-file-name=plugin)/include/gcc-plugin.h" ]; then
  optional_packages+=("gcc-$(gcc -dumpversion | cut -d. -f1)-plugin-dev")
fi
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
if ((${#optional_packages[@]})) && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "bootstrap: installing ${optional_packages[*]} with apt-get"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${optional_packages[@]}"; } \
    || echo "bootstrap: ${optional_packages[*]} could not be installed: the tests that need them will skip" >&2
fi

if [ "$TEST" = 0 ]; then
  pip_install -e .
  echo "bootstrap: ready for the main job ($("$PY" -m abicache --version), $("$PY" --version)); the tests need: bash scripts/bootstrap.sh --test"
  exit 0
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
