#!/usr/bin/env bash
# Installs everything abicache's demo and tests need on a fresh machine.
# Idempotent: a second run only checks. Set PYTHON to use another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

apt_packages=()
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc)
command -v c++ >/dev/null 2>&1 || apt_packages+=(g++)
if ((${#apt_packages[@]})); then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing ${apt_packages[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}"
  else
    echo "bootstrap: please install ${apt_packages[*]} (a C and C++ compiler)" >&2
    exit 1
  fi
fi

"$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[test]'
echo "bootstrap: ready ($("$PY" -m abicache --version), $("$PY" --version))"
