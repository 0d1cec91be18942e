# Sourced by the benchmark scripts. cpu_ns PID: on-CPU nanoseconds of every thread of process
# PID, the first field of /proc/PID/task/*/schedstat summed (the process's own schedstat file
# counts its main thread only); 0 once it has exited. A thread may exit between the glob and
# the read: not an error.
cpu_ns() { { cat /proc/"$1"/task/*/schedstat 2>/dev/null || true; } | awk '{ns += $1} END {print ns + 0}'; }
