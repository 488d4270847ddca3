#!/bin/bash
# Quick start, part 1: nvshim's main job on a built-in simulated 8 x H100 host (no GPU
# needed). Installs what it needs (tests/setup.sh), then runs tests/sim/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
exec .venv/bin/python3 -m tests.sim.demo "$@"
