#!/usr/bin/env bash
# Installs, only where missing, the official Adyen, PayPal and Square Python libraries (pinned) for
# the python3 on PATH, for tests/upstreams/payments_client.py (which fake_payments.py answers).
# Whatever versions of stripe and requests are already installed (install.sh pins stripe) are held
# as pip constraints, so these installs cannot move them.
# Idempotent; runnable from any directory. Prints one line per library and exits non-zero if an
# install fails.
set -u

ADYEN_VERSION=16.0.0
PAYPAL_VERSION=2.4.0
SQUARE_VERSION=46.0.0.20260916

apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -qq || return 1
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" \
    >/dev/null || return 1
}

dist_version() {
  python3 -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null
}

if ! command -v python3 >/dev/null 2>&1; then
  echo "adyen: FAILED: no python3 on PATH"
  echo "paypal-server-sdk: FAILED: no python3 on PATH"
  echo "squareup: FAILED: no python3 on PATH"
  exit 1
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
for held in stripe requests; do
  version="$(dist_version "$held")"
  if [ -n "$version" ]; then
    echo "$held==$version" >>"$constraints"
  fi
done

failed=0
# distribution name, pinned version, module the client imports
for entry in "adyen $ADYEN_VERSION Adyen" \
             "paypal-server-sdk $PAYPAL_VERSION paypalserversdk" \
             "squareup $SQUARE_VERSION square"; do
  read -r dist version module <<<"$entry"
  if [ "$(dist_version "$dist")" = "$version" ] && python3 -c "import $module" >/dev/null 2>&1; then
    echo "$dist: present ($version)"
    continue
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q -c "$constraints" "$dist==$version" \
       || python3 -m pip install -q --break-system-packages -c "$constraints" "$dist==$version"; } \
      && python3 -c "import $module" >/dev/null 2>&1; then
    echo "$dist: installed ($(dist_version "$dist"))"
  else
    held_list="$(tr '\n' ' ' <"$constraints")"
    echo "$dist: FAILED to install (python3 -m pip install $dist==$version; held: ${held_list:-nothing})"
    failed=1
  fi
done
exit "$failed"
