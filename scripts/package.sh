#!/usr/bin/env bash
# Builds the Debian package kiln_<version>_<arch>.deb into build-package/: the shared library, the public headers,
# the CMake package and kiln.pc under /usr, and the `kiln` command.
#   scripts/package.sh            then: sudo apt-get install ./build-package/kiln_*.deb
# A package runs on any x86-64 machine Debian supports, so it is a portable build (KILN_NATIVE=OFF: no
# -march=native). It is built without the CUDA backend: Debian 12 has no CUDA 13 package to depend on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dpkg-query -W -f='${Status}' dpkg-dev 2>/dev/null | grep -q "install ok installed" || {
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends dpkg-dev  # dpkg-shlibdeps
}
dir=build-package
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DKILN_NATIVE=OFF -DKILN_WITH_CUDA=OFF \
  -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_EXAMPLES=OFF -DKILN_INSTALL=ON
cmake --build "$dir" -j"$(nproc)"
(cd "$dir" && cpack -G DEB >/dev/null)
deb=$(ls -t "$dir"/kiln_*.deb | head -1)
echo "scripts/package.sh: wrote $deb"
dpkg-deb --field "$deb" Package Version Architecture Depends
