#!/bin/sh
# The real-GPU acceptance kit (bench/real_gpu.py) from a checkout: runs it with the
# checkout's .venv when there is one, else python3. Arguments go to the kit, e.g.
#   sudo bash bench/real_gpu.sh --out report.md
case $0 in */*) dir=${0%/*} ;; *) dir=. ;; esac
here=$(cd "$dir/.." && pwd)
py=$here/.venv/bin/python3
[ -x "$py" ] || py=python3
exec "$py" "$here/bench/real_gpu.py" "$@"
