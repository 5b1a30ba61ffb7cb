#!/usr/bin/env bash
# Sets up .venv if needed, then runs the linter and the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export ALFWORLD_DATA="${ALFWORLD_DATA:-$(mktemp -d)}"
ruff check .
python -m pytest "$@"
