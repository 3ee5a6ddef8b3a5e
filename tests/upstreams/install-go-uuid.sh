#!/usr/bin/env bash
# Installs, only where missing, Debian's golang-github-google-uuid-dev: the source of
# github.com/google/uuid under /usr/share/gocode/src, which tests/upstreams/go_app.go is built
# against offline in GOPATH mode:
#   GO111MODULE=off GOPATH=/usr/share/gocode go build -o OUT tests/upstreams/go_app.go
# Idempotent; runnable from any directory. Prints one line and exits non-zero if the install fails.
set -u

PACKAGE=golang-github-google-uuid-dev
SOURCE=/usr/share/gocode/src/github.com/google/uuid/uuid.go

package_version() { dpkg-query -W -f='${Version}' "$PACKAGE" 2>/dev/null; }

if [ -f "$SOURCE" ]; then
  echo "go-uuid: present ($(package_version))"
elif apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$PACKAGE" \
      >/dev/null \
    && [ -f "$SOURCE" ]; then
  echo "go-uuid: installed ($(package_version))"
else
  echo "go-uuid: FAILED to install (apt-get install $PACKAGE)"
  exit 1
fi
exit 0
