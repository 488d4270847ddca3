# apt_wait CMD...: run an apt-get command, waiting while another apt or dpkg holds its locks
# (a fresh cloud VM's unattended-upgrades often does for minutes). apt-get install waits by
# itself with DPkg::Lock::Timeout; apt-get update does not (apt 2.6), so both are retried.
# Gives up after APT_WAIT_SECONDS (default 900). Other failures print apt's output and fail.
# Sourced by tests/setup.sh.
apt_wait() {
    local limit=${APT_WAIT_SECONDS:-900} step=${APT_WAIT_STEP:-5} waited=0 out
    until out=$("$@" -o DPkg::Lock::Timeout="$step" 2>&1 >/dev/null); do
        if ! grep -qE 'Could not get lock|Unable to (acquire|lock)' <<<"$out" \
                || [ "$waited" -ge "$limit" ]; then
            printf '%s\n' "$out" >&2
            return 1
        fi
        [ "$waited" -gt 0 ] || echo "setup: waiting for another apt or dpkg to finish ($1 $2)" >&2
        sleep "$step"
        waited=$((waited + step))
    done
}
