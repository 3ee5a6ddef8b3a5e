#!/usr/bin/env bash
# Installs, only where missing, schemathesis (PyPI), pinned, for tests/process/admin_openapi.rs:
# it checks the running admin listener against docs/admin-openapi.json.
# Into its own virtual environment under the user's cache directory
# (${XDG_CACHE_HOME:-~/.cache}/fencegate/schemathesis-VERSION), so that its dependencies
# (hypothesis, requests, ...) never meet the packages tests/upstreams/install.sh puts into the
# python3 on PATH, and a Debian system python's refusal of pip installs (PEP 668) does not apply.
# Idempotent; runnable from any directory. Prints one line to stderr saying what it did and, on
# success, the path of the `schemathesis` executable on stdout (nothing else); exits non-zero,
# naming what failed, otherwise.
set -u

SCHEMATHESIS_VERSION=4.32.5

cache="${XDG_CACHE_HOME:-${HOME:?neither XDG_CACHE_HOME nor HOME is set}/.cache}"
venv="$cache/fencegate/schemathesis-$SCHEMATHESIS_VERSION"
exe="$venv/bin/schemathesis"

installed_version() {
  "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null
}

if [ -x "$exe" ] && [ "$(installed_version)" = "$SCHEMATHESIS_VERSION" ]; then
  echo "schemathesis: present ($SCHEMATHESIS_VERSION, $venv)" >&2
  echo "$exe"
  exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
  echo "schemathesis: FAILED: no python3 on PATH" >&2
  exit 1
fi

# Debian splits the venv module (and the pip it bootstraps) into python3-venv.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv \
    >/dev/null 2>&1
fi

# A half-made environment from an interrupted run is made again from scratch.
rm -rf "$venv"
if python3 -m venv "$venv" >/dev/null \
    && "$venv/bin/python" -m pip install -q --disable-pip-version-check \
         "schemathesis==$SCHEMATHESIS_VERSION" >&2 \
    && [ -x "$exe" ] && [ "$(installed_version)" = "$SCHEMATHESIS_VERSION" ]; then
  echo "schemathesis: installed ($SCHEMATHESIS_VERSION, $venv)" >&2
  echo "$exe"
  exit 0
fi
echo "schemathesis: FAILED to install (python3 -m venv $venv;" \
  "$venv/bin/python -m pip install schemathesis==$SCHEMATHESIS_VERSION)" >&2
exit 1
