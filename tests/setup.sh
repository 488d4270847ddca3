#!/bin/bash
# Install what nvshim's tests and demo need on a Debian machine (run as root), idempotently:
# system packages (gcc, runc, podman, containerd, busybox) and a virtualenv in .venv holding
# nvshim (editable) and its test dependencies. Prints nothing when all is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
for spec in gcc:gcc ldconfig:libc-bin runc:runc podman:podman containerd:containerd \
            busybox:busybox-static ip:iproute2 unshare:util-linux mmdebstrap:mmdebstrap \
            lintian:lintian dh:debhelper dpkg-buildpackage:dpkg-dev fakeroot:fakeroot \
            patchelf:patchelf systemd-analyze:systemd kubectl:kubectl etcd:etcd-server \
            openssl:openssl nsenter:util-linux iptables:iptables conmon:conmon; do
    cmd=${spec%%:*}; pkg=${spec#*:}
    command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null 2>&1 \
        || need_pkgs+=("$pkg")
done
[ -e /usr/include/stdio.h ] || need_pkgs+=(libc6-dev)
# the test cluster's pod network (tests/k8s): bridge + host-local; CRI-O's libraries
[ -e /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 ] || need_pkgs+=(libsqlite3-0)
[ -x /usr/lib/cni/bridge ] || need_pkgs+=(containernetworking-plugins)
# crun's library (crun itself is unpacked into the test cache below)
[ -e /usr/lib/x86_64-linux-gnu/libyajl.so.2 ] || need_pkgs+=(libyajl2)
/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_pkgs+=(python3 python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    source tests/apt_wait.sh
    apt_wait apt-get update -qq
    apt_wait apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

# The real Debian interpreter, never a version-manager shim: hooks point at it.
PY=/usr/bin/python3
stamp=.venv/.nvshim-deps
if [ ! -x .venv/bin/python3 ] || [ ! -e "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    echo "setup: preparing .venv" >&2
    [ -x .venv/bin/python3 ] || "$PY" -m venv .venv
    log=$(mktemp)
    if ! .venv/bin/python3 -m pip install -q --disable-pip-version-check -e '.[test]' >"$log" 2>&1; then
        cat "$log" >&2; rm -f "$log"
        echo "setup: pip install failed (output above)" >&2
        exit 1
    fi
    rm -f "$log"
    touch "$stamp"
fi

# crun, nvshim's second low-level runtime (tests/crun_util.py): unpacked from Debian's
# package into the test cache, never installed (an installed crun becomes podman's default)
crun_dir=${NVSHIM_TEST_CACHE:-/tmp/nvshim-test-cache}/crun
if [ ! -x "$crun_dir/usr/bin/crun" ]; then
    echo "setup: unpacking crun into $crun_dir" >&2
    source tests/apt_wait.sh
    rm -rf "$crun_dir.tmp" && mkdir -p "$crun_dir.tmp"
    (cd "$crun_dir.tmp" && apt-get download -qq crun 2>/dev/null) || {
        apt_wait apt-get update -qq
        (cd "$crun_dir.tmp" && apt-get download -qq crun)
    }
    dpkg-deb -x "$crun_dir.tmp"/crun_*.deb "$crun_dir.tmp/root"
    rm -rf "$crun_dir" && mv "$crun_dir.tmp/root" "$crun_dir" && rm -rf "$crun_dir.tmp"
fi

# The compiled nvshim-runtime front (nvshim/runtime/frontbin.py), for this source: the
# tests run it, and the sh front beside it
if ! .venv/bin/python3 -c 'import sys; from nvshim.runtime.frontbin import built; sys.exit(built() is None)'; then
    echo "setup: building the compiled nvshim-runtime front" >&2
    .venv/bin/python3 -m nvshim.runtime.frontbin build >/dev/null
fi
