#!/bin/bash
# The whole test suite: installs what it needs (tests/setup.sh), then runs pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k cdi -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
# No path given: pytest runs its testpaths (tests/); a path given runs only that.
# --durations: the slowest tests are named at the end, to keep the suite under 30 minutes
exec .venv/bin/python3 -m pytest -q -p no:cacheprovider --durations=25 "$@"
