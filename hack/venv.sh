#!/usr/bin/env bash
# A Python virtual environment holding a requirements file's packages, for the tests that need
# packages from PyPI (the `cs` conformance test):
#   hack/venv.sh target/venv tests/conformance/requirements.txt
# Installs only when the environment is missing, no longer runs, or was made from another
# version of the requirements file (its sha256 is kept in DIR/.requirements.sha256); otherwise
# silent. Uses $PYTHON (default python3). Where `python3 -m venv` cannot install pip itself
# (Debian/Ubuntu without python3-venv: no ensurepip), the environment is made without pip and
# filled by the system's pip (`pip --python`, pip 22.3+).
set -euo pipefail

venv="$1"
req="$2"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
  exit 0
fi

fail() {
  echo "venv: $*" >&2
  rm -rf "$venv" # half made: the next run starts over
  exit 1
}

command -v "$python" >/dev/null || fail "$python not found: install Python 3 (or set PYTHON=…)"
echo "venv: creating $venv ($("$python" --version 2>&1)) with the packages of $req"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if err="$("$python" -m venv "$venv" 2>&1)"; then
  pip=("$venv/bin/python" -m pip)
else
  rm -rf "$venv"
  echo "venv: '$python -m venv' failed:" >&2
  sed 's/^/  | /' <<<"$err" >&2
  echo "venv: trying again without pip in the environment, filled by the system's pip" >&2
  "$python" -m venv --without-pip "$venv" ||
    fail "'$python -m venv --without-pip' failed too; install the venv module (Debian/Ubuntu: apt-get install python3-venv)"
  version="$("$python" -m pip --version 2>/dev/null | awk '{print $2}')" ||
    fail "no pip either; install python3-venv (or python3-pip) (Debian/Ubuntu: apt-get install python3-venv)"
  [[ -n "$version" ]] ||
    fail "no pip either; install python3-venv (or python3-pip) (Debian/Ubuntu: apt-get install python3-venv)"
  [[ "$(printf '%s\n' 22.3 "$version" | sort -V | head -n1)" == 22.3 ]] ||
    fail "the system's pip $version cannot install into another environment (needs 22.3+); install python3-venv (Debian/Ubuntu: apt-get install python3-venv)"
  pip=("$python" -m pip --python "$venv/bin/python")
fi
"${pip[@]}" install --quiet --disable-pip-version-check -r "$req" ||
  fail "installing $req into $venv failed (see above); PyPI must be reachable"
echo "$want" >"$stamp"
echo "venv: $venv ready"
