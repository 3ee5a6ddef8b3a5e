#!/usr/bin/env bash
# Renders every kustomize overlay under deploy/kubernetes/overlays/ with `kubectl kustomize` (what
# `kubectl apply -k` would apply) and validates the result against the Kubernetes API's schemas
# with kubernetes-validate (PyPI, pinned; installed only where missing), strictly: a field the
# schema does not know is an error, so a misspelt or misplaced key fails, not only a wrong type or
# a missing required field. Each rendering is checked against two Kubernetes versions: 1.29, the
# first with native sidecars (an initContainers entry with restartPolicy: Always) on by default,
# and the newest the pinned validator knows.
#
# kubernetes-validate only warns, and exits 0, for a kind or apiVersion it has no schema for (a
# typo in either); here that fails too, as does an overlay that renders no resource, and one whose
# rendering prints anything on stderr (kustomize's warnings: a deprecated field).
#
# kubectl comes from the machine (kubectl 1.27 or later: kustomize v5); where there is none,
# Debian's kubernetes-client is installed, whose kubectl 1.20 (kustomize v2) cannot render these
# overlays: the script then fails, saying so.
#
# --out DIR keeps each overlay's rendering as DIR/NAME.yaml (tests/process/deploy.rs reads them).
# Runnable from any directory; exits non-zero, naming each overlay and resource at fault.
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

out=""
case "${1:-}" in
  --out) out="${2:?--out needs a directory}"; mkdir -p "$out" || exit 1 ;;
  "") ;;
  *) echo "usage: validate-kubernetes.sh [--out DIR]" >&2; exit 2 ;;
esac
rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT

if ! command -v kubectl >/dev/null 2>&1; then
  echo "kubectl: missing; installing Debian's kubernetes-client"
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    kubernetes-client >/dev/null 2>&1 || true
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "validate-kubernetes.sh: FAILED: no kubectl, and kubernetes-client did not install" >&2
    exit 1
  fi
fi

shopt -s nullglob
overlays=()
for kustomization in deploy/kubernetes/overlays/*/kustomization.yaml; do
  overlays+=("$(dirname "$kustomization")")
done
if [ "${#overlays[@]}" = 0 ]; then
  echo "validate-kubernetes.sh: FAILED: no overlay (DIR/kustomization.yaml) under" \
    "deploy/kubernetes/overlays/" >&2
  exit 1
fi

failed=()
files=()
for overlay in "${overlays[@]}"; do
  file="$rendered/$(basename "$overlay").yaml"
  if ! kubectl kustomize "$overlay" >"$file" 2>"$file.err" || [ -s "$file.err" ]; then
    cat "$file.err"
    echo "ERROR $overlay: \`kubectl kustomize $overlay\` failed or warned" \
      "($(kubectl version --client 2>/dev/null | tr '\n' ' '); these overlays need kubectl 1.27+," \
      "kustomize v5)"
    failed+=("$overlay")
    continue
  fi
  echo "rendered $overlay ($(grep -c '^kind: ' "$file") resources)"
  files+=("$file")
  if [ -n "$out" ]; then cp "$file" "$out/" || exit 1; fi
done

version_args=()
for version in "${KUBERNETES_VERSIONS[@]}"; do
  version_args+=(-k "$version")
done

for file in "${files[@]}"; do
  overlay="deploy/kubernetes/overlays/$(basename "$file" .yaml)"
  # The validator names the file it read: name the overlay instead of the temporary file.
  output="$(python3 -m kubernetes_validate --strict "${version_args[@]}" "$file" 2>&1)"
  status=$?
  output="$(printf '%s\n' "$output" | sed "s|$file|$overlay (rendered)|g")"
  [ -n "$output" ] && printf '%s\n' "$output"
  # Every line the validator prints for a resource that passed starts with INFO; anything else
  # (ERROR, WARN for an unknown kind or apiVersion, FATAL, a YAML parse error) is a failure.
  passed="$(printf '%s\n' "$output" | grep -c '^INFO ')"
  others="$(printf '%s\n' "$output" | grep -v -c -e '^INFO ' -e '^$')"
  if [ "$status" != 0 ] || [ "$others" != 0 ]; then
    failed+=("$overlay")
  elif [ "$passed" = 0 ]; then
    echo "ERROR $overlay renders no Kubernetes resource"
    failed+=("$overlay")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "validate-kubernetes.sh: FAILED: ${failed[*]} did not render, or did not pass" \
    "kubernetes-validate $VALIDATOR_VERSION --strict against Kubernetes" \
    "${KUBERNETES_VERSIONS[*]} (see above)" >&2
  exit 1
fi
echo "validate-kubernetes.sh: ${#files[@]} overlays (${overlays[*]}) rendered and passed" \
  "kubernetes-validate $VALIDATOR_VERSION --strict against Kubernetes ${KUBERNETES_VERSIONS[*]}"
exit 0
