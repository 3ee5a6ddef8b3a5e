#!/usr/bin/env bash
# Runs the image scripts/image.sh built (fencegate:local) and checks it as a user would run it.
# Podman cannot start containers on these machines (crun: setrlimit RLIMIT_NOFILE: Operation not
# permitted), so the image's own root filesystem runs under `buildah run --isolation chroot`,
# on the host's network, with the image's user, entrypoint arguments and configuration:
#
#   scripts/image.sh && scripts/image-test.sh      # as root
#
# Checks: the image runs as a non-root user with config/docker.toml; /healthz and /readyz answer;
# a fenced write is forwarded and an older token refused (409), as in the README walk-through; the
# image's HEALTHCHECK command exits 0; the embedded store is in the declared volume and a restart
# keeps its marks. Not in .ci/run: building the image takes about 10 minutes of this machine's two
# cores, half of CI's budget.
set -euo pipefail
cd "$(dirname "$0")/.."
export STORAGE_DRIVER=vfs
# buildah run caps open files at 1024 unless containers.conf says otherwise; Docker's default is
# far higher, and the image's default caps need about 10,600. This machine's hard limit is given.
containers_conf=$(mktemp)
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s"]\n' "$(ulimit -Hn)" "$(ulimit -Hn)" >"$containers_conf"
export CONTAINERS_CONF=$containers_conf
TAG=${IMAGE_TAG:-fencegate:local}
TOKEN=image-test-admin-token-0123456789
DATA=8080
ADMIN=9090
UPSTREAM=9000

fail() { echo "image-test: FAIL: $*" >&2; exit 1; }
pass() { echo "image-test: ok: $*"; }

buildah inspect --type image "$TAG" >/dev/null 2>&1 || fail "no image $TAG: run scripts/image.sh first"
for port in $DATA $ADMIN $UPSTREAM; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port is in use"; fi
done

config=$(buildah inspect --type image "$TAG")
field() {
  python3 -c 'import json,sys; c=json.loads(sys.argv[1])["Docker"]["config"]; print(json.dumps(c.get(sys.argv[2])))' "$config" "$1"
}
user=$(field User | tr -d '"')
volumes=$(field Volumes)
healthcheck=$(field Healthcheck)
entrypoint=$(field Entrypoint)
cmd=$(field Cmd)
uid=${user%%:*}
[ -n "$uid" ] && [ "$uid" != 0 ] && [ "$uid" != root ] || fail "the image's USER is '$user', not a non-root uid"
pass "USER $user"
python3 -c 'import json,sys; v=json.loads(sys.argv[1]) or {}; sys.exit(0 if "/var/lib/fencegate" in v else 1)' "$volumes" \
  || fail "the image declares no volume /var/lib/fencegate ($volumes)"
pass "VOLUME /var/lib/fencegate"
# The command the image runs, and its health check, as exec-form lists.
mapfile -t run_args < <(python3 -c 'import json,sys; [print(a) for a in (json.loads(sys.argv[1]) or []) + (json.loads(sys.argv[2]) or [])]' "$entrypoint" "$cmd")
mapfile -t health_args < <(python3 -c 'import json,sys; h=json.loads(sys.argv[1]) or {"Test": ["NONE"]}; t=h["Test"]; [print(a) for a in t[1:]] if t[0]=="CMD" else None' "$healthcheck")
[ "${#run_args[@]}" -gt 0 ] || fail "the image has no entrypoint or command"
[ "${#health_args[@]}" -gt 0 ] || fail "the image has no HEALTHCHECK command"

work=$(mktemp -d)
container=""
upstream_pid=""
gateway_pid=""
cleanup() {
  if [ -n "$gateway_pid" ] && kill "$gateway_pid" 2>/dev/null; then
    # Its drain delay and drain: the ports are free once it is gone.
    for _ in $(seq 1 400); do kill -0 "$gateway_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null || true
  [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$work" "$containers_conf"
}
trap cleanup EXIT

# The upstream the configuration names (upstream:9000): answers 200 to anything, on the host.
cat >"$work/upstream.py" <<'PY'
import http.server, sys
class Answer(http.server.BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
PY
python3 "$work/upstream.py" "$UPSTREAM" &
upstream_pid=$!

# `upstream` resolves to this host (buildah 1.28's run has no --add-host; --no-hosts keeps this file).
printf '127.0.0.1 localhost upstream\n::1 localhost\n' >"$work/hosts"
chmod 644 "$work/hosts"
# The volume: a host directory the image's user owns, mounted where the image declares it.
mkdir -p "$work/data"
chown "$uid" "$work/data"
container=$(buildah from "$TAG")
# The declared volume is given as the bind mount above, as `docker run -v` gives it. buildah 1.28's
# run also mounts an anonymous volume for every VOLUME of the container's config, over or under
# the bind in no fixed order; the working container (not the image) forgets it.
buildah config --volume /var/lib/fencegate- "$container"

wait_for() {
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  return 1
}

start() {
  buildah run --isolation chroot --user "$user" --no-hosts -v "$work/hosts:/etc/hosts:ro" \
    --env FENCEGATE_ADMIN_TOKEN="$TOKEN" -v "$work/data:/var/lib/fencegate" \
    "$container" -- "${run_args[@]}" >>"$work/gateway.log" 2>&1 &
  wait_for "http://127.0.0.1:$ADMIN/healthz" || { cat "$work/gateway.log" >&2; fail "the gateway did not start"; }
  # The gateway itself, not the buildah process that started it (its command line starts with buildah).
  gateway_pid=$(pgrep -n -f "^${run_args[*]}" || true)
  [ -n "$gateway_pid" ] || fail "no gateway process found"
}

stop() {
  kill -TERM "$gateway_pid"
  for _ in $(seq 1 400); do kill -0 "$gateway_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$gateway_pid" 2>/dev/null && fail "the gateway did not stop on SIGTERM"
  gateway_pid=""
  # Its buildah run ends with it.
  sleep 1
}

status() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

start
process_uid=$(awk '/^Uid:/ {print $2}' "/proc/$gateway_pid/status")
[ "$process_uid" = "$uid" ] || fail "the gateway runs as uid $process_uid, not $uid"
pass "the gateway runs as uid $process_uid with ${run_args[*]}"
[ "$(status "http://127.0.0.1:$ADMIN/healthz")" = 200 ] || fail "/healthz"
for _ in $(seq 1 50); do [ "$(status "http://127.0.0.1:$ADMIN/readyz")" = 200 ] && break; sleep 0.1; done
[ "$(status "http://127.0.0.1:$ADMIN/readyz")" = 200 ] || fail "/readyz"
pass "/healthz and /readyz answer 200"

first=$(status -X POST -H 'X-Fence: 5' -d '{}' "http://127.0.0.1:$DATA/invoices/7")
[ "$first" = 200 ] || fail "a fenced write with token 5 was answered $first, not 200"
stale=$(status -X POST -H 'X-Fence: 4' -d '{}' "http://127.0.0.1:$DATA/invoices/7")
[ "$stale" = 409 ] || fail "an older token was answered $stale, not 409"
pass "a fenced write is forwarded (200) and an older token refused (409)"

# In the running container's mounts, as Docker runs it (without the volume, buildah's run would
# stand up the image's VOLUME on its own and, cleaning it up, empty the directory the gateway uses).
buildah run --isolation chroot --user "$user" --no-hosts -v "$work/hosts:/etc/hosts:ro" \
  --env FENCEGATE_ADMIN_TOKEN="$TOKEN" -v "$work/data:/var/lib/fencegate" \
  "$container" -- "${health_args[@]}" >/dev/null 2>&1 \
  || fail "the HEALTHCHECK command (${health_args[*]}) failed"
pass "the HEALTHCHECK command exits 0"

[ -s "$work/data/fencegate.db" ] || fail "no embedded store in the volume (/var/lib/fencegate/fencegate.db); the volume holds: $(ls -la "$work/data")"
pass "the embedded store is in the volume"

stop
start
stale=$(status -X POST -H 'X-Fence: 4' -d '{}' "http://127.0.0.1:$DATA/invoices/7")
[ "$stale" = 409 ] || fail "after a restart, an older token was answered $stale, not 409"
pass "after a restart the mark is kept (409)"
stop
echo "image-test: all checks passed"
