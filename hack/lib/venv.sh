# Sourced by hack/* scripts: make (once) and activate the project's virtual environment.
# It lives under $HOME/.cache/speculator-operator/, keyed by the Python version and a hash of
# the dependency lists in pyproject.toml, so a fresh clone reuses it and a dependency change makes a new one.
# Only the project itself is reinstalled (editable, no dependencies) on every call.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_py=${PYTHON:-python3}
_pyver=$("$_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# the key is the dependency lists only: editing tool settings in pyproject.toml reuses the venv
_key=$("$_py" -c 'import hashlib, json, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = [p.get("dependencies", []), p.get("optional-dependencies", {})]
print(hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:12])' "$_repo/pyproject.toml")
VENV=${SPECULATOR_VENV:-$HOME/.cache/speculator-operator/venv-py$_pyver-$_key}
if [ ! -f "$VENV/.complete" ]; then
  echo "venv: creating $VENV" >&2
  _t0=$SECONDS
  (
    set -e
    rm -rf "$VENV"
    "$_py" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e "$_repo[dev]"
  ) >&2 || { echo "venv: FAILED to create $VENV" >&2; return 1 2>/dev/null || exit 1; }
  touch "$VENV/.complete"
  echo "venv: ready in $((SECONDS - _t0)) s" >&2
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$_repo" >&2 \
  || { echo "venv: FAILED to install the project into $VENV" >&2; return 1 2>/dev/null || exit 1; }
export VIRTUAL_ENV=$VENV
export PATH=$VENV/bin:$PATH
unset _repo _py _pyver _key _t0
