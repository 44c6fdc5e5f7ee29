# Python for the interop tests (interop/): a virtual environment with the exact packages of
# interop/requirements.txt, cached under ~/.cache/km0/ and keyed by that file's hash, so a
# change of pins makes a new one and an unchanged file reuses the old one silently.
#
#   . scripts/lib/python.sh && ensure_interop_venv && "$KM0_INTEROP_PYTHON" interop/...
#
# Progress goes to stderr, so callers may read stdout for their own output.

KM0_INTEROP_REQUIREMENTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/interop/requirements.txt"

# The interpreter to build the venv with: python3.11 where there is one, else python3.
interop_base_python() {
  if command -v python3.11 >/dev/null; then
    command -v python3.11
  else
    command -v python3
  fi
}

# Whether the venv at $1 imports what the interop scripts need.
interop_venv_works() {
  [ -f "$1/.km0-installed" ] &&
    "$1/bin/python" -c 'import confluent_kafka, pika, psycopg' >/dev/null 2>&1
}

ensure_interop_venv() {
  local cache="${KM0_CACHE:-$HOME/.cache/km0}" hash venv base
  [ -f "$KM0_INTEROP_REQUIREMENTS" ] || {
    echo "missing $KM0_INTEROP_REQUIREMENTS" >&2
    return 1
  }
  hash=$(sha256sum "$KM0_INTEROP_REQUIREMENTS" | cut -c1-16)
  venv="$cache/venv-interop-$hash"
  if ! interop_venv_works "$venv"; then
    mkdir -p "$cache"
    # One builder at a time: parallel test binaries may all ask for it at once.
    (
      flock 9
      interop_venv_works "$venv" && exit 0
      base=$(interop_base_python) || { echo "python3 is required" >&2; exit 1; }
      echo "creating the interop venv $venv" >&2
      rm -rf "$venv"
      "$base" -m venv "$venv" >&2 &&
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
          --no-input -r "$KM0_INTEROP_REQUIREMENTS" >&2 &&
        touch "$venv/.km0-installed"
    ) 9>"$cache/venv-interop.lock" || {
      echo "could not provision the interop venv $venv" >&2
      return 1
    }
  fi
  export KM0_INTEROP_PYTHON="$venv/bin/python"
}
