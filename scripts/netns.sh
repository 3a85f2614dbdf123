#!/usr/bin/env bash
# Fake "other machines" for apiary's multi-node tests: N network namespaces on
# one bridge, each running Debian's openssh-server with its own generated host
# key, reachable from the root namespace (where the queen runs) over SSH.
#
#   scripts/netns.sh up   PREFIX N STATE_DIR [SUBNET]   # SUBNET default 10.77.0
#   scripts/netns.sh down PREFIX STATE_DIR
#
# up creates, for i in 1..N:
#   namespace PREFIXi, veth PREFIXhi (root side, on bridge PREFIXbr) <-> eth0
#   in the namespace with address SUBNET.(i+1)/24; the bridge has SUBNET.1/24;
#   sshd listening on SUBNET.(i+1):22 with STATE_DIR/nodei/host_key, root
#   allowed by key only, and XDG_DATA_HOME=STATE_DIR/nodei/data in sessions
#   (the namespaces share one file system: each "machine" gets its own
#   apiary data dir).
# and, for the client side (ssh -F STATE_DIR/ssh_config):
#   STATE_DIR/client_key         the key the nodes accept
#   STATE_DIR/known_hosts        every node's host key
#   STATE_DIR/ssh_config         IdentityFile + UserKnownHostsFile above
#   STATE_DIR/ssh_config_nohostkeys  same, with an empty known_hosts
#   STATE_DIR/ssh_config_wrongkey    same, with a key no node accepts
#   STATE_DIR/nodes              lines "NAME ADDRESS"
# Needs root, iproute2, openssh-server and openssh-client.
set -euo pipefail

die() { echo "netns.sh: $*" >&2; exit 1; }

cmd=${1:-}
case "$cmd" in
up)
  [ $# -ge 4 ] || die "usage: $0 up PREFIX N STATE_DIR [SUBNET]"
  prefix=$2 n=$3 state=$4 subnet=${5:-10.77.0}
  ;;
down)
  [ $# -ge 3 ] || die "usage: $0 down PREFIX STATE_DIR"
  prefix=$2 state=$3
  ;;
*) die "usage: $0 up PREFIX N STATE_DIR [SUBNET] | down PREFIX STATE_DIR" ;;
esac
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "PREFIX must be 1-6 lowercase letters or digits (interface names are short)"
[ "$(id -u)" -eq 0 ] || die "must run as root (ip netns, sshd)"

if [ "$cmd" = down ]; then
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true); do
    # Every process of the "machine": sshd, its sessions, hives, workers.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      kill -9 $pids 2>/dev/null || true
      for _ in $(seq 1 100); do
        alive=""
        for p in $pids; do [ -e "/proc/$p" ] && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.05
      done
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  # A namespace some process still holds outlives its name: remove our end
  # of its veth (which removes both ends) and the bridge.
  for link in $(ip -br link | awk '{print $1}' | sed 's/@.*//' | grep -E "^${prefix}h[0-9]+$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "${prefix}br" 2>/dev/null || true
  exit 0
fi

[[ "$n" =~ ^[1-9][0-9]?$ ]] || die "N must be 1-99"
[[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "SUBNET must be like 10.77.0"
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] || die "no sshd: install openssh-server"
command -v ssh-keygen >/dev/null || die "no ssh-keygen: install openssh-client"
command -v ip >/dev/null || die "no ip: install iproute2"

mkdir -p "$state" /run/sshd
chmod 0700 "$state"
[ -f "$state/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C apiary-test-client -f "$state/client_key"
[ -f "$state/wrong_key" ] || ssh-keygen -q -t ed25519 -N '' -C apiary-test-wrong -f "$state/wrong_key"
cp "$state/client_key.pub" "$state/authorized_keys"
chmod 0600 "$state/authorized_keys"
: > "$state/known_hosts"
: > "$state/empty_known_hosts"
: > "$state/nodes"

ip link add "${prefix}br" type bridge
ip addr add "${subnet}.1/24" dev "${prefix}br"
ip link set "${prefix}br" up

for i in $(seq 1 "$n"); do
  ns="${prefix}${i}" host="${prefix}h${i}" addr="${subnet}.$((i + 1))" dir="$state/node$i"
  mkdir -p "$dir/data"
  ip netns add "$ns"
  ip link add "$host" type veth peer name eth0 netns "$ns"
  ip link set "$host" master "${prefix}br" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "${subnet}.1"
  ssh-keygen -q -t ed25519 -N '' -C "apiary-test-node$i" -f "$dir/host_key" <<<y >/dev/null
  cat > "$dir/sshd_config" <<EOF
Port 22
ListenAddress $addr
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
SetEnv XDG_DATA_HOME=$dir/data
LogLevel ERROR
EOF
  ip netns exec "$ns" "$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log"
  echo "$addr $(cut -d' ' -f1,2 "$dir/host_key.pub")" >> "$state/known_hosts"
  echo "node$i $addr" >> "$state/nodes"
done

for variant in "ssh_config:client_key:known_hosts" "ssh_config_nohostkeys:client_key:empty_known_hosts" "ssh_config_wrongkey:wrong_key:known_hosts"; do
  IFS=: read -r file key hosts <<<"$variant"
  cat > "$state/$file" <<EOF
Host *
  User root
  IdentityFile $state/$key
  IdentitiesOnly yes
  UserKnownHostsFile $state/$hosts
  GlobalKnownHostsFile /dev/null
EOF
done

# sshd daemonizes once it listens; check that each answers.
for i in $(seq 1 "$n"); do
  addr="${subnet}.$((i + 1))"
  ok=""
  for _ in $(seq 1 100); do
    if ssh -F "$state/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 "$addr" true 2>/dev/null; then ok=1; break; fi
    sleep 0.05
  done
  [ -n "$ok" ] || die "sshd of node$i at $addr does not answer; its log: $(cat "$state/node$i/sshd.log" 2>/dev/null)"
done
echo "netns.sh: $n nodes up on ${subnet}.0/24 (state in $state)" >&2
