#!/usr/bin/env bash
# Time from a clone on a bare Debian 12 to the main job's first training step (issue 14, item 5).
#
# A fresh Debian 12 root (debootstrap, default variant: no compiler, no cmake, no BLAS) gets a clone of
# this repository; inside it `STEPS=3 scripts/train_demo.sh` runs exactly as a user's first command
# would: apt installs (scripts/setup.sh --main), configure, build of the `kiln` command line, data
# preparation, training. The clock starts when train_demo.sh starts and stops when the first record
# appears in out/char_gpt/log.jsonl (written after step 0). Prints when configure began (the end of
# the apt step), the first step and the end of the run.
#
#   sudo bench/first_step.sh [ROOT_DIR]     (default /tmp/kiln-bare; needs root, debootstrap, network
#                                            to a Debian mirror; removes nothing it did not create)
# debootstrap fetches from the first Debian mirror the host's apt sources name (scripts/lib/mirror.sh;
# KILN_DEBIAN_MIRROR overrides, http://deb.debian.org/debian when there is none).
# The figure depends on the mirror's speed (apt fetches ~150 MB) and the cores; results in
# bench/RESULTS.md.
set -euo pipefail
root="${1:-/tmp/kiln-bare}"
src="$(cd "$(dirname "$0")/.." && pwd)"
. "$src/scripts/lib/mirror.sh"
[ "$(id -u)" -eq 0 ] || { echo "first_step.sh: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
if [ ! -e "$root/etc/debian_version" ]; then
  debootstrap bookworm "$root" "$(debian_mirror)" >/dev/null
fi
cleanup() { umount -R "$root/proc" "$root/dev" "$root/sys" 2>/dev/null || true; }
trap cleanup EXIT
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
cp /etc/resolv.conf "$root/etc/"
rm -rf "$root/root/kiln"
git clone -q "$src" "$root/root/kiln"

log="$root/root/kiln/out/char_gpt/log.jsonl"
start=$(date +%s%N)
chroot "$root" bash -c 'cd /root/kiln && STEPS=3 bash scripts/train_demo.sh' >"$root/root/first_step.log" 2>&1 &
pid=$!
configured="" first=""
since() {  # seconds since start, to the millisecond
  local ms=$((($(date +%s%N) - start) / 1000000))
  printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}
while kill -0 "$pid" 2>/dev/null; do
  [ -z "$configured" ] && [ -e "$root/root/kiln/build-cpu/CMakeCache.txt" ] && configured=$(since)
  [ -z "$first" ] && [ -s "$log" ] && first=$(since)
  sleep 0.2
done
wait "$pid" || { echo "first_step.sh: train_demo.sh failed; see $root/root/first_step.log" >&2; exit 1; }
echo "apt step done, configure began: ${configured:-?} s"
echo "first training step:            ${first:-?} s"
echo "run finished:                   $(since) s ($(nproc) cores; output in $root/root/first_step.log)"
