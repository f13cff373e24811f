#!/usr/bin/env bash
# The Debian package on a fresh Debian 12: debootstrap a minimal bookworm into a folder, install
# build-package/kiln_*.deb there with apt-get (which pulls its Depends), then as a user would: build
# examples/consumer with CMake from /usr with no hints, and with pkg-config, run both, and run `kiln`
# from PATH. Needs root (chroot) and the network to a Debian mirror; takes a few minutes. debootstrap
# fetches from the first Debian mirror the host's apt sources name (scripts/lib/mirror.sh;
# KILN_DEBIAN_MIRROR overrides, http://deb.debian.org/debian when there is none).
#   scripts/package.sh && sudo scripts/check_package.sh [ROOT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/mirror.sh
deb=$(ls -t build-package/kiln_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || { echo "no build-package/kiln_*.deb: run scripts/package.sh first" >&2; exit 2; }
root=${1:-/tmp/kiln-bookworm}
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
if [ ! -x "$root/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase bookworm "$root" "$(debian_mirror)"
fi
for m in proc sys dev; do mountpoint -q "$root/$m" || mount --bind /$m "$root/$m"; done
trap 'for m in dev sys proc; do umount "$root/$m" 2>/dev/null || true; done' EXIT
cp "$deb" "$root/tmp/"
rm -rf "$root/tmp/consumer" && cp -r examples/consumer "$root/tmp/consumer"
chroot "$root" /bin/bash -euo pipefail -c "
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends /tmp/$(basename "$deb") cmake g++ make pkg-config >/dev/null
  echo '== Depends:'; dpkg-query -W -f='\${Depends}\n' kiln
  echo '== kiln on PATH:'; command -v kiln; kiln --version
  cd /tmp/consumer
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build >/dev/null
  echo '== CMake, no hints:'; build/train
  g++ -std=c++20 -O2 train.cpp -o train-pc \$(pkg-config --cflags --libs kiln)
  echo '== pkg-config:'; ./train-pc
"
echo "check_package: $deb installs and works on a fresh Debian 12 ($root)"
