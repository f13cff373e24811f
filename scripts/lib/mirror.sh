# Sourced by bench/first_step.sh and scripts/check_package.sh: the Debian mirror debootstrap fetches from.
#
#   . scripts/lib/mirror.sh; debootstrap bookworm "$root" "$(debian_mirror)"
#
# debian_mirror [APT_DIR] prints, in this order of preference:
#   1. $KILN_DEBIAN_MIRROR when set (the user's choice);
#   2. the first Debian main mirror the host's apt sources name (APT_DIR, default /etc/apt):
#      sources.list, then sources.list.d/ by name as apt reads it: *.list (one-line "deb [options] URI
#      SUITE COMPONENTS...") and *.sources (deb822 stanzas: Types, URIs, Suites, Components, Enabled). An
#      entry counts when it is of type deb (not deb-src), is enabled, lists the component main, has a
#      plain Debian release among its suites (bookworm, trixie, stable, sid, ...; not bookworm-security,
#      -updates or -backports, not a third party's "nodistro" or "cloud-sdk-bookworm") and an http(s),
#      ftp or file URI (not mirror+, cdrom: or tor+). A mirror of one Debian release carries the others,
#      so a trixie host's mirror serves bookworm too;
#   3. http://deb.debian.org/debian, when none is found (an Ubuntu host, no sources at all).
# The URI is printed without its trailing slash.

# A plain Debian release or alias: what a Debian mirror's dists/ holds, and nobody else's.
_kiln_debian_suite() {
  case "$1" in
    buster | bullseye | bookworm | trixie | forky | duke | sid | \
      oldoldstable | oldstable | stable | testing | unstable) return 0 ;;
  esac
  return 1
}

_kiln_mirror_uri() {
  case "$1" in
    http://* | https://* | ftp://* | file:/*) return 0 ;;
  esac
  return 1
}

# One entry: type, URI, suites (space separated), components (space separated), enabled (yes|no).
# Prints the URI and succeeds when it is a Debian main mirror.
_kiln_mirror_entry() {
  local types=$1 uris=$2 suites=$3 comps=$4 enabled=${5:-yes} t u s c main="" deb="" release=""
  case "$enabled" in [Nn][Oo] | [Ff]alse | 0) return 1 ;; esac
  for t in $types; do [ "$t" = deb ] && deb=1; done
  for c in $comps; do [ "$c" = main ] && main=1; done
  for s in $suites; do _kiln_debian_suite "$s" && release=1; done
  [ -n "$deb" ] && [ -n "$main" ] && [ -n "$release" ] || return 1
  for u in $uris; do
    if _kiln_mirror_uri "$u"; then
      printf '%s\n' "${u%/}"
      return 0
    fi
  done
  return 1
}

# One-line format: "deb [opt=value ...] URI SUITE COMPONENT...", comments after #.
_kiln_mirror_list() {
  local line type uri suite comps
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    # options in brackets go (they may hold spaces: "[ arch=amd64 signed-by=... ]")
    case "$line" in *\[*\]*) line="${line%%\[*}${line#*\]}" ;; esac
    line=${line%$'\r'}
    read -r type uri suite comps <<<"$line" || true
    [ -n "$comps" ] || continue
    _kiln_mirror_entry "$type" "$uri" "$suite" "$comps" yes && return 0
  done <"$1"
  return 1
}

# deb822: stanzas separated by blank lines; "Key: value", continuation lines start with a space.
_kiln_mirror_sources() {
  local line key value types="" uris="" suites="" comps="" enabled=yes
  while true; do
    if ! IFS= read -r line; then
      _kiln_mirror_entry "$types" "$uris" "$suites" "$comps" "$enabled" && return 0
      return 1
    fi
    line=${line%$'\r'}
    case "$line" in \#*) continue ;; esac
    if [ -z "${line//[[:space:]]/}" ]; then  # a blank line ends the stanza
      _kiln_mirror_entry "$types" "$uris" "$suites" "$comps" "$enabled" && return 0
      types="" uris="" suites="" comps="" enabled=yes
      continue
    fi
    case "$line" in
      [[:space:]]*) continue ;;  # a continuation (of a key kiln does not read, e.g. Signed-By's key block)
    esac
    key=${line%%:*}
    value=${line#*:}
    case "${key,,}" in
      types) types=$value ;;
      uris) uris=$value ;;
      suites) suites=$value ;;
      components) comps=$value ;;
      enabled) enabled=${value// /} ;;
    esac
  done <"$1"
}

debian_mirror() {
  local apt=${1:-/etc/apt} f
  if [ -n "${KILN_DEBIAN_MIRROR:-}" ]; then
    printf '%s\n' "${KILN_DEBIAN_MIRROR%/}"
    return 0
  fi
  if [ -f "$apt/sources.list" ] && _kiln_mirror_list "$apt/sources.list"; then return 0; fi
  for f in "$apt"/sources.list.d/*; do  # in apt's order: by name, either format
    [ -f "$f" ] || continue
    case "$f" in
      *.list) _kiln_mirror_list "$f" && return 0 ;;
      *.sources) _kiln_mirror_sources "$f" && return 0 ;;
    esac
  done
  printf '%s\n' http://deb.debian.org/debian
}
