#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces kiln-a-PID and kiln-b-PID joined by a veth pair
# (10.201.0.1 and 10.201.0.2; the traffic never leaves the pair). mpirun runs in the first and starts
# the second host's daemon through an rsh agent that runs `ip netns exec` (as ssh would run it on
# another machine); MPI runs over TCP only (no shared memory), on that link. Then the collectives and
# DDP parity tests run there, one rank per host. Exit 77 (skipped) where namespaces cannot be made.
#   two_hosts.sh MPIRUN TEST_DIST
set -u
mpirun=$1 prog=$2
skip() { echo "two_hosts.sh: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (ip netns)"
command -v ip > /dev/null || skip "ip (iproute2) is not installed"
A=kiln-a-$$ B=kiln-b-$$
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$A" 2> /dev/null
  ip netns del "$B" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$A" 2> "$tmp/err" || skip "ip netns add: $(cat "$tmp/err") (needs CAP_SYS_ADMIN)"
ip netns add "$B"
ip link add name veth-a netns "$A" type veth peer name veth-b netns "$B" 2> "$tmp/err" || skip "ip link add veth: $(cat "$tmp/err")"
ip -n "$A" addr add 10.201.0.1/24 dev veth-a
ip -n "$B" addr add 10.201.0.2/24 dev veth-b
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set veth-a up
ip -n "$B" link set veth-b up

# The rsh agent: `agent HOST COMMAND...` runs COMMAND in HOST's namespace, as ssh would on HOST.
cat > "$tmp/agent" << AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.201.0.1) ns=$A ;;
  10.201.0.2) ns=$B ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$tmp/agent"
printf '10.201.0.1 slots=1\n10.201.0.2 slots=1\n' > "$tmp/hosts"
run() {
  ip netns exec "$A" "$mpirun" --hostfile "$tmp/hosts" -np 2 --map-by node --bind-to none \
    --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include 10.201.0.0/24 --mca oob_tcp_if_include 10.201.0.0/24 "$@"
}
echo "two_hosts.sh: each rank's network (rank 0 in $A, rank 1 in $B):"
run sh -c 'echo "rank $OMPI_COMM_WORLD_RANK: $(ip -o -4 addr show | grep -v " lo " | awk "{print \$2, \$4}")"' || exit 1
run "$prog" --use-colour no "[collectives]~*Cuda*,[two-hosts]"
