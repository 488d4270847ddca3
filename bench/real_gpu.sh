#!/bin/sh
# The real-GPU acceptance kit (bench/real_gpu.py) from a checkout. With the checkout's
# .venv it runs there; without one it runs python3 with what bench/real_gpu_carry.py put
# in build/real-gpu-kit (dependencies, the probe image, a runc used only when the host
# has none). Arguments go to the kit, e.g.  sudo sh bench/real_gpu.sh --out report.md
case $0 in */*) dir=${0%/*} ;; *) dir=. ;; esac
here=$(cd "$dir/.." && pwd)
py=$here/.venv/bin/python3
carry=$here/build/real-gpu-kit
if [ ! -x "$py" ]; then
    py=python3
    if [ -d "$carry/site" ]; then
        PYTHONPATH=$carry/site:$here${PYTHONPATH:+:$PYTHONPATH}
        PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}:$carry/bin
        export PYTHONPATH PATH
        [ -f "$carry/probe-image.tar.gz" ] && set -- --image "$carry/probe-image.tar.gz" "$@"
    fi
fi
exec "$py" "$here/bench/real_gpu.py" "$@"
