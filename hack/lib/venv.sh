# Sourced by hack/* scripts: make (once) and activate the project's virtual environment.
# It lives under $HOME/.cache/speculator-operator/, keyed by the Python version and a hash of the dependency
# lists in pyproject.toml and hack/harness/pyproject.toml (the local cluster harness, a distribution of its own
# that the operator's wheel does not hold), so a fresh clone reuses it and a dependency change makes a new one.
# Only the two projects themselves are reinstalled (editable, no dependencies) on every call.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_py=${PYTHON:-python3}
_pyver=$("$_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# the key is the dependency lists only: editing tool settings in pyproject.toml reuses the venv
_key=$("$_py" -c 'import hashlib, json, sys, tomllib
deps = []
for path in sys.argv[1:]:
    p = tomllib.load(open(path, "rb"))["project"]
    deps += [p.get("dependencies", []), p.get("optional-dependencies", {})]
print(hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:12])' "$_repo/pyproject.toml" \
  "$_repo/hack/harness/pyproject.toml")
VENV=${SPECULATOR_VENV:-$HOME/.cache/speculator-operator/venv-py$_pyver-$_key}
if [ ! -f "$VENV/.complete" ]; then
  echo "venv: creating $VENV" >&2
  _t0=$SECONDS
  (
    set -e
    rm -rf "$VENV"
    "$_py" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e "$_repo[dev]" -e "$_repo/hack/harness"
  ) >&2 || { echo "venv: FAILED to create $VENV" >&2; return 1 2>/dev/null || exit 1; }
  touch "$VENV/.complete"
  echo "venv: ready in $((SECONDS - _t0)) s" >&2
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$_repo" \
  -e "$_repo/hack/harness" >&2 \
  || { echo "venv: FAILED to install the project and its harness into $VENV" >&2; return 1 2>/dev/null || exit 1; }
export VIRTUAL_ENV=$VENV
export PATH=$VENV/bin:$PATH
unset _repo _py _pyver _key _t0
