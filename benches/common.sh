# Shell helpers the benchmark scripts share (sourced, not run): installing a missing tool,
# reading wrk's latencies, medians.

# need COMMAND PACKAGE: installs the Debian package when the command is missing.
need() { command -v "$1" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }

# wrk prints latencies as 850.00us, 1.20ms or 1.01s; converts one to microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v+0} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1000000}}'; }

# The median of the numbers on stdin, one per line.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# etcd_delete_prefix PREFIX: deletes every key under PREFIX (which ends in "/") from the etcd at
# $ETCD_URL, through its JSON gateway.
etcd_delete_prefix() {
  local key end
  key=$(printf '%s' "$1" | base64 -w0)
  end=$(printf '%s0' "${1%/}" | base64 -w0)
  curl -fsS "$ETCD_URL/v3/kv/deleterange" -d "{\"key\":\"$key\",\"range_end\":\"$end\"}" >/dev/null
}
