#!/usr/bin/env bash
# Execute mdata's notebooks top to bottom and keep what they show (tables, plots, printed
# output) in executed copies, readable in JupyterLab or on a code host:
#
#   bash scripts/render_notebooks.sh                 # every notebook -> docs/notebooks/NAME.ipynb
#   bash scripts/render_notebooks.sh --out DIR notebooks/explore_plan.ipynb
#
# The notebooks are committed without outputs and the copies are generated, so docs/notebooks/
# is ignored by git: run this again after a change. Each notebook runs with `jupyter execute`
# (nbclient, in the dev extras) in its own folder, as when opened there, so it finds
# ../example-data (built on first use) and reads its MDATA_* settings from the environment.
# PYTHON picks the interpreter (default: the checkout's .venv); MDATA_NB_CELL_TIMEOUT the most
# seconds one cell may take (default 600).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=$root/docs/notebooks
notebooks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -*) echo "render_notebooks.sh: unknown option $1" >&2; exit 2 ;;
    *) notebooks+=("$(realpath "$1")"); shift ;;
  esac
done
[ ${#notebooks[@]} -gt 0 ] || notebooks=("$root"/notebooks/*.ipynb)
mkdir -p "$out"
out=$(cd "$out" && pwd)
for notebook in "${notebooks[@]}"; do
  name=$(basename "$notebook" .ipynb)
  "$python" -m jupyter execute --timeout="${MDATA_NB_CELL_TIMEOUT:-600}" --output="$out/$name" "$notebook"
  echo "render_notebooks.sh: wrote $out/$name.ipynb"
done
