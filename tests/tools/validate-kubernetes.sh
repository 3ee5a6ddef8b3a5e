#!/usr/bin/env bash
# Validates every manifest under deploy/kubernetes/ against the Kubernetes API's schemas with
# kubernetes-validate (PyPI, pinned; installed only where missing), strictly: a field the schema
# does not know is an error, so a misspelt or misplaced key fails, not only a wrong type or a
# missing required field. Each file is checked against two Kubernetes versions: 1.29, the first
# with native sidecars (an initContainers entry with restartPolicy: Always) on by default, and
# the newest the pinned validator knows.
#
# kubernetes-validate only warns, and exits 0, for a kind or apiVersion it has no schema for (a
# typo in either); here that fails too, as does a file with no resource in it.
# Runnable from any directory; exits non-zero, naming each file and resource at fault.
set -u

VALIDATOR_VERSION=1.37.0
KUBERNETES_VERSIONS=(1.29.0 1.37.0)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.." || { echo "validate-kubernetes.sh: cannot cd to the repository root" >&2; exit 1; }

validator_version() {
  python3 -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null
}

if ! command -v python3 >/dev/null 2>&1; then
  echo "validate-kubernetes.sh: FAILED: no python3 on PATH" >&2
  exit 1
fi
if [ "$(validator_version)" = "$VALIDATOR_VERSION" ]; then
  echo "kubernetes-validate: present ($VALIDATOR_VERSION)"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-pip \
      >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q "kubernetes-validate==$VALIDATOR_VERSION" \
       || python3 -m pip install -q --break-system-packages "kubernetes-validate==$VALIDATOR_VERSION"; } \
      && [ "$(validator_version)" = "$VALIDATOR_VERSION" ]; then
    echo "kubernetes-validate: installed ($VALIDATOR_VERSION)"
  else
    echo "validate-kubernetes.sh: FAILED to install kubernetes-validate" \
      "(python3 -m pip install kubernetes-validate==$VALIDATOR_VERSION)" >&2
    exit 1
  fi
fi

shopt -s nullglob
files=(deploy/kubernetes/*.yaml deploy/kubernetes/*.yml)
if [ "${#files[@]}" = 0 ]; then
  echo "validate-kubernetes.sh: FAILED: no manifests (*.yaml, *.yml) under deploy/kubernetes/" >&2
  exit 1
fi

version_args=()
for version in "${KUBERNETES_VERSIONS[@]}"; do
  version_args+=(-k "$version")
done

failed=()
for file in "${files[@]}"; do
  output="$(python3 -m kubernetes_validate --strict "${version_args[@]}" "$file" 2>&1)"
  status=$?
  [ -n "$output" ] && printf '%s\n' "$output"
  # Every line the validator prints for a resource that passed starts with INFO; anything else
  # (ERROR, WARN for an unknown kind or apiVersion, FATAL, a YAML parse error) is a failure.
  passed="$(printf '%s\n' "$output" | grep -c '^INFO ')"
  others="$(printf '%s\n' "$output" | grep -v -c -e '^INFO ' -e '^$')"
  if [ "$status" != 0 ] || [ "$others" != 0 ]; then
    failed+=("$file")
  elif [ "$passed" = 0 ]; then
    echo "ERROR $file holds no Kubernetes resource"
    failed+=("$file")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "validate-kubernetes.sh: FAILED: ${failed[*]} did not pass kubernetes-validate" \
    "$VALIDATOR_VERSION --strict against Kubernetes ${KUBERNETES_VERSIONS[*]} (see above)" >&2
  exit 1
fi
echo "validate-kubernetes.sh: ${#files[@]} files passed kubernetes-validate $VALIDATOR_VERSION" \
  "--strict against Kubernetes ${KUBERNETES_VERSIONS[*]}"
exit 0
