#!/usr/bin/env bash
# Installs, only where missing, Django (pinned) for the python3 on PATH, for the differential
# test's Django upstream (tests/upstreams/django_app.py).
# Idempotent; runnable from any directory. Prints one line and exits non-zero if the install fails.
set -u

DJANGO_VERSION=5.2.19

apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -qq || return 1
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" \
    >/dev/null || return 1
}

django_version() { python3 -c 'import importlib.metadata as m; print(m.version("django"))' 2>/dev/null; }

if ! command -v python3 >/dev/null 2>&1; then
  echo "django: FAILED: no python3 on PATH"
  exit 1
elif [ "$(django_version)" = "$DJANGO_VERSION" ] && python3 -c 'import django' >/dev/null 2>&1; then
  echo "django: present ($DJANGO_VERSION)"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q "django==$DJANGO_VERSION" \
       || python3 -m pip install -q --break-system-packages "django==$DJANGO_VERSION"; } \
      && python3 -c 'import django' >/dev/null 2>&1; then
    echo "django: installed ($(django_version))"
  else
    echo "django: FAILED to install (python3 -m pip install django==$DJANGO_VERSION)"
    exit 1
  fi
fi
exit 0
