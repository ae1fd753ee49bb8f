#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-bench from the llama-cpp-python sdist on PyPI,
# into specchat's cache dir, so `specchat bench` can run llama.cpp side by side with specchat.
#
#   scripts/build-llama-cpp.sh            # builds into <cache>/llama.cpp/<version>/bin
#   SPECCHAT_CACHE_DIR=/some/dir scripts/build-llama-cpp.sh
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 JOBS=4 scripts/build-llama-cpp.sh
#
# Needs: python with pip, cmake, ninja (pip-installed into a temporary venv if missing), a C++
# compiler, network access to PyPI. About 15 minutes on two busy cores.
# Idempotent: if the binaries are already there and answer --version, it does nothing.
# Atomic: it builds in a temporary dir and moves the finished bin/ into place at the end.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
TARGETS=(llama-server llama-bench)

say() { printf 'build-llama-cpp: %s\n' "$*"; }
die() { printf 'build-llama-cpp: error: %s\n' "$*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
if [[ -x "${PYTHON:-}" ]]; then py="$PYTHON"
elif [[ -x "$repo/.venv/bin/python" ]]; then py="$repo/.venv/bin/python"
else py="$(command -v python3 || true)"; fi
[[ -n "$py" ]] || die "no python found: run ./setup.sh first or set PYTHON"

# The cache dir as specchat computes it (engine/paths.py cache_dir(); SPECCHAT_CACHE_DIR overrides).
cache="$(cd "$repo" && "$py" -c 'from engine.paths import cache_dir; print(cache_dir())' 2>/dev/null || true)"
if [[ -z "$cache" ]]; then
  cache="${SPECCHAT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specchat}"
fi
dest="$cache/llama.cpp/$VERSION"
bin="$dest/bin"
say "step 1/6: target $bin"

have_all() {
  local t
  for t in "${TARGETS[@]}"; do
    [[ -x "$bin/$t" ]] || return 1
    "$bin/$t" --version >/dev/null 2>&1 || return 1
  done
}
if have_all; then
  say "already built: $("$bin/llama-server" --version 2>&1 | grep -m1 -i version || true)"
  say "binaries in $bin"
  exit 0
fi

command -v cmake >/dev/null || die "cmake not found: install it (apt-get install cmake, or pip install cmake)"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
  || die "no C++ compiler found: install g++ or clang++"

mkdir -p "$cache/llama.cpp"
work="$(mktemp -d "$cache/llama.cpp/.build-$VERSION.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if ! command -v ninja >/dev/null; then
  say "step 2/6: ninja not found, installing it with pip into $work/venv"
  "$py" -m venv "$work/venv" >/dev/null
  "$work/venv/bin/pip" install -q ninja || die "could not pip install ninja: install ninja-build"
  export PATH="$work/venv/bin:$PATH"
else
  say "step 2/6: cmake $(cmake --version | head -1 | awk '{print $3}'), ninja $(ninja --version)"
fi

say "step 3/6: downloading the llama-cpp-python==$VERSION sdist from PyPI"
"$py" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps --dest "$work/dl" "llama-cpp-python==$VERSION" \
  || die "pip download failed: check network access to PyPI"
sdist="$(find "$work/dl" -maxdepth 1 -name 'llama[_-]cpp[_-]python-*.tar.gz' -print -quit)"
[[ -n "$sdist" ]] || die "no sdist found in $work/dl"

say "step 4/6: unpacking $(basename "$sdist")"
mkdir -p "$work/src"
tar -xzf "$sdist" -C "$work/src" --strip-components=1
src="$work/src/vendor/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || die "the sdist has no vendor/llama.cpp/CMakeLists.txt"

say "step 5/6: building ${TARGETS[*]} with $JOBS jobs (static, native CPU; log in $work/build.log)"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
  >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; die "cmake configure failed"; }
cmake --build "$work/build" -j "$JOBS" --target "${TARGETS[@]}" >>"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log" >&2; die "build failed"; }

say "step 6/6: installing into $bin"
mkdir -p "$work/out/bin"
for t in "${TARGETS[@]}"; do
  cp "$work/build/bin/$t" "$work/out/bin/$t"
  "$work/out/bin/$t" --version >/dev/null 2>&1 || die "$t does not run (--version failed)"
done
"$work/out/bin/llama-server" --version >"$work/out/VERSION" 2>&1 || true
echo "llama-cpp-python==$VERSION" >>"$work/out/VERSION"
rm -rf "$dest.old"
[[ -e "$dest" ]] && mv "$dest" "$dest.old"
mv "$work/out" "$dest"
rm -rf "$dest.old"
say "done: $(grep -m1 -i version "$dest/VERSION" || true)"
say "binaries in $bin (specchat bench finds them there; or pass --llama-cpp $bin)"
