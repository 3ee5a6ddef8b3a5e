#!/usr/bin/env bash
# Installs, only where missing, what the Rails upstream (tests/upstreams/rails_app/) needs, from
# Debian only (rubygems.org is not used): ruby-rails (Rails 6.1 in Debian 12), ruby-webrick (the
# HTTP server; Debian 12 has no ruby-puma), ruby-sqlite3 (ActiveRecord's integer-id models, in
# memory) and ruby-pg (ActiveRecord's PostgreSQL adapter, for the uuid-keyed models).
# Idempotent; runnable from any directory. Prints one line, `rails: present (VERSION)`,
# `rails: installed (VERSION)` or `rails: FAILED ...`, and exits non-zero on failure.
set -u

PACKAGES=(ruby-rails ruby-webrick ruby-sqlite3 ruby-pg)

# The libraries the app requires; all of them loading is what "present" means.
check() {
  ruby -e '
    require "rails"; require "active_record"; require "action_controller"
    require "webrick"; require "sqlite3"; require "pg"
    print Rails.version
  ' 2>/dev/null
}

if command -v ruby >/dev/null 2>&1 && version="$(check)" && [ -n "$version" ]; then
  echo "rails: present ($version)"
  exit 0
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  if ! apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1; then
    echo "rails: FAILED (apt-get update)"
    exit 1
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      "${missing[@]}" >/dev/null 2>&1; then
    echo "rails: FAILED to install (apt-get install ${missing[*]})"
    exit 1
  fi
fi

if command -v ruby >/dev/null 2>&1 && version="$(check)" && [ -n "$version" ]; then
  echo "rails: installed ($version)"
  exit 0
fi
echo "rails: FAILED (packages installed but ruby cannot load rails/active_record/webrick/sqlite3/pg)"
exit 1
