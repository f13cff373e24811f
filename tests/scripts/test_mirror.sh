#!/usr/bin/env bash
# scripts/lib/mirror.sh on sample apt source folders, both formats: which mirror debian_mirror picks.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/lib/mirror.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset KILN_DEBIAN_MIRROR
failures=0

# expect NAME WANT: debian_mirror on $tmp/NAME prints WANT
expect() {
  local got
  got=$(debian_mirror "$tmp/$1")
  if [ "$got" = "$2" ]; then
    echo "ok   $1: $got"
  else
    echo "FAIL $1: got '$got', want '$2'"
    failures=$((failures + 1))
  fi
}
# put NAME FILE: stdin into $tmp/NAME/FILE
put() {
  mkdir -p "$(dirname "$tmp/$1/$2")"
  cat >"$tmp/$1/$2"
}

# This host's layout (Debian 12 images): deb822 only, security second, third parties disabled or not Debian.
put deb822 sources.list.d/debian.sources <<'S'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
S
put deb822 sources.list.d/a-nodesource.sources <<'S'
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
S
expect deb822 http://mirror.example.org/debian

# One-line format with options in brackets, a deb-src line and a third party's line before it.
put oneline sources.list <<'S'
# comment
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
deb-src http://src.example.org/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://ftp.fr.debian.org/debian bookworm main contrib # eu
deb http://later.example.org/debian bookworm main
S
expect oneline http://ftp.fr.debian.org/debian

# Options with spaces inside the brackets; no component main first; a trixie mirror; no final newline.
put spaced sources.list.d/10.list <<'S'
deb [ arch=amd64 ] http://contrib-only.example.org/debian trixie contrib non-free
S
printf 'deb [ arch=amd64 trusted=yes ] https://trixie.example.org/debian/ trixie main' | put spaced sources.list.d/20.list
expect spaced https://trixie.example.org/debian

# deb822: a disabled stanza, deb-src only, a continuation block, several URIs (the first usable one),
# CRLF line ends, lower-case keys.
put stanzas sources.list.d/x.sources <<'S'
Types: deb
URIs: http://disabled.example.org/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://source-only.example.org/debian
Suites: bookworm
Components: main

types: deb deb-src
uris: mirror+file:/etc/apt/mirrors.txt http://second.example.org/debian
suites: sid
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 Components: nothing
 -----END PGP PUBLIC KEY BLOCK-----
components: main
S
sed -i 's/$/\r/' "$tmp/stanzas/sources.list.d/x.sources"
expect stanzas http://second.example.org/debian

# The main sources.list before sources.list.d; the files of sources.list.d by name, either format.
put order sources.list <<'S'
deb http://ubuntu.example.org/ubuntu jammy main
S
put order sources.list.d/b.list <<'S'
deb http://b.example.org/debian stable main
S
put order sources.list.d/a.sources <<'S'
Types: deb
URIs: http://a.example.org/debian
Suites: stable
Components: main
S
expect order http://a.example.org/debian

# Nothing Debian (an Ubuntu host), or no apt folder at all: the default.
put ubuntu sources.list <<'S'
deb http://archive.ubuntu.com/ubuntu jammy main restricted
deb http://security.ubuntu.com/ubuntu jammy-security main
S
expect ubuntu http://deb.debian.org/debian
expect missing http://deb.debian.org/debian

# KILN_DEBIAN_MIRROR wins.
got=$(KILN_DEBIAN_MIRROR=http://chosen.example.org/debian/ debian_mirror "$tmp/deb822")
[ "$got" = http://chosen.example.org/debian ] && echo "ok   KILN_DEBIAN_MIRROR: $got" || {
  echo "FAIL KILN_DEBIAN_MIRROR: got '$got'"
  failures=$((failures + 1))
}

[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
