#!/usr/bin/env bash
# Sets up .venv if needed, then trains GAGPO on the embedded default: a tiny policy built offline, on CPU.
#   bash scripts/train.sh                 # the built-in maze (a few minutes on 2 cores)
#   bash scripts/train.sh alfworld        # the bundled ALFWorld games
#   bash scripts/train.sh webshop         # the bundled WebShop catalogue
# Extra arguments go to the example script (see `python tuned_examples/gagpo_builtin.py --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
env_name=${1:-maze}
case "$env_name" in
    maze) example=tuned_examples/gagpo_builtin.py ;;
    alfworld) example=tuned_examples/gagpo_alfworld.py ;;
    webshop) example=tuned_examples/gagpo_webshop.py ;;
    -*) env_name=maze; example=tuned_examples/gagpo_builtin.py; set -- maze "$@" ;;
    *) echo "unknown environment '$env_name': use maze, alfworld or webshop" >&2; exit 2 ;;
esac
shift || true
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export ALFWORLD_DATA="${ALFWORLD_DATA:-$HOME/.cache/alfworld}"
exec python "$example" "$@"
