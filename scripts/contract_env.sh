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

# install_torch VENV: the pinned CPU torch (constraints.txt) and its dependencies in VENV. Where
# the main environment (PRECISION_PLUGIN_TORCH_FROM, default .venv) holds that very build for the
# same Python, its files are hard-linked in first, so pip finds torch installed and adds only its
# dependencies: ~0.75 GB less disk per contract environment (six of them; a CI machine with less
# free disk ran out) and no second unpacking. Anything else (no main environment, another Python,
# another filesystem) falls back to pip's own install.
install_torch() {
  local venv="$1" from="${PRECISION_PLUGIN_TORCH_FROM:-.venv}" version src dst info name
  version=$(sed -n 's/^torch==//p' constraints.txt)
  site() { "$1/bin/python" -c 'import sys, sysconfig; print(sys.version_info[:2], sysconfig.get_paths()["purelib"])' 2>/dev/null; }
  src=$(site "$from") || src=""
  dst=$(site "$venv")
  info=""
  if [ -n "$src" ] && [ "${src%% /*}" = "${dst%% /*}" ]; then
    src="/${src#* /}"
    dst="/${dst#* /}"
    info=$(find "$src" -maxdepth 1 -name "torch-$version*.dist-info" | head -1)
  fi
  if [ -n "$info" ] && [ -z "$(find "$dst" -maxdepth 1 -name 'torch-*.dist-info')" ]; then
    echo ">> linking torch $version from $from into $venv"
    for name in $(cat "$info/top_level.txt") "$(basename "$info")"; do
      if ! cp -al "$src/$name" "$dst/$name" 2>/dev/null; then
        echo ">> could not link $name (another filesystem?): pip installs torch instead"
        for name in $(cat "$info/top_level.txt") "$(basename "$info")"; do rm -rf "${dst:?}/$name"; done
        break
      fi
    done
  fi
  "$venv/bin/python" -m pip install -q -c constraints.txt "torch==$version"
}
