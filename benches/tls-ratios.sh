#!/usr/bin/env bash
# What TLS costs, from one benches/fenced-writes.sh run's medians (its RESULTS file, lines of
# "path req/s p50 p99 non2xx cpu_us"): for TLS on the listener, to the upstream and on both,
# fencegate's and nginx's req/s and CPU per request against their own plain path, and fencegate
# against nginx doing the same. Prints a markdown table.
#
#   benches/tls-ratios.sh RESULTS
set -euo pipefail
results=$1

# field PATH COLUMN (2 = req/s, 6 = CPU µs/request)
field() { awk -v p="$1" -v c="$2" '$1 == p {print $c}' "$results"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && a != "-" && b > 0) printf "%.2f", a / b; else print "-"}'; }
# cpu_cell CPU BASE: "1.40 (+9.5 µs)", CPU against BASE and the microseconds added, or "-".
cpu_cell() {
  awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && a != "-" && b > 0) printf "%.2f (%+.1f µs)", a / b, a - b; else print "-"}'
}

base_rps=$(field passthrough 2) base_cpu=$(field passthrough 6)
nginx_rps=$(field nginx 2) nginx_cpu=$(field nginx 6)
echo "| TLS on | fencegate req/s × passthrough | nginx req/s × nginx | fencegate / nginx req/s | fencegate CPU µs/req × passthrough (added) | nginx CPU µs/req × nginx (added) | fencegate / nginx CPU |"
echo "|---|---|---|---|---|---|---|"
for leg in listener upstream both; do
  fg=passthrough-tls-$leg ng=nginx-tls-$leg
  fg_rps=$(field "$fg" 2) fg_cpu=$(field "$fg" 6) ng_rps=$(field "$ng" 2) ng_cpu=$(field "$ng" 6)
  echo "| $leg | $(ratio "$fg_rps" "$base_rps") | $(ratio "$ng_rps" "$nginx_rps") | $(ratio "$fg_rps" "$ng_rps") |" \
    "$(cpu_cell "$fg_cpu" "$base_cpu") | $(cpu_cell "$ng_cpu" "$nginx_cpu") | $(ratio "$fg_cpu" "$ng_cpu") |"
done
