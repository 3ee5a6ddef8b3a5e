# Shell helpers the benchmark scripts share (sourced, not run): installing a missing tool,
# reading wrk's latencies, medians.

# need COMMAND PACKAGE: installs the Debian package when the command is missing.
need() { command -v "$1" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }

# wrk prints latencies as 850.00us, 1.20ms or 1.01s; converts one to microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v+0} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1000000}}'; }

# The median of the numbers on stdin, one per line.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
