# Sourced by the setup_*_env.sh scripts (from the repository root): what every contract-test
# environment does the same way.

# install_self VENV NAME: install this checkout's precision_plugin into VENV as a real,
# non-editable distribution (so its entry points are real), only when its sources changed since
# the last install (stamp VENV/.precision_plugin-NAME-src; remove it to force a reinstall).
install_self() {
  local venv="$1" name="$2" src_stamp src
  src_stamp="$venv/.precision_plugin-$name-src"
  src=$(find precision_plugin -name '*.py' -o -name 'py.typed' | LC_ALL=C sort | xargs cat pyproject.toml | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$src_stamp" 2>/dev/null)" != "$src" ]; then
    echo ">> installing precision_plugin (non-editable) into $venv"
    # One build at a time (scripts/dev.sh sets environments up side by side): setuptools builds
    # in ./build, and reuses build/lib, so modules moved or deleted since would ship again.
    (
      flock 9
      rm -rf build
      "$venv/bin/python" -m pip install -q --no-deps --force-reinstall .
    ) 9>.build.lock
    echo "$src" > "$src_stamp"
  fi
}
