#!/usr/bin/env bash
# A test cluster of N hosts on one machine (root only), for the tests in tests/hosts and
# for benchmarks across hosts. See docs/hosts.md.
#
#   cluster.sh up N [--rate R] [--delay D]   N hosts host0..host{N-1}; R: tc tbf rate of
#                                            every host link (e.g. 1gbit); D: netem delay
#                                            per link direction (e.g. 5ms), if the kernel has it
#   cluster.sh shape [--rate R] [--delay D]  re-shape every host link of a running cluster
#                                            (neither: no shaping); jobs keep running
#   cluster.sh down                          stop every process of the cluster, remove it
#   cluster.sh exec HOST CMD...              run CMD inside HOST (net, UTS, mount, IPC ns)
#   cluster.sh mpirun MPIRUN-ARGS...         mpirun inside host0 over the cluster's hostfile
#                                            (or the --hostfile/--host given); prted started
#                                            on the other hosts through agent.sh
#   cluster.sh status                        hosts, addresses, links; exit 1 if not up
#   cluster.sh hostfile                      path of the hostfile (one line per host)
#
# Each host is a holder process made by `unshare --net --uts --mount --ipc`: its own network
# namespace (loopback + eth0 with 10.213.0.(10+i)/24), hostname, private /dev/shm (a tmpfs,
# so Open MPI's shared-memory segments of one host are invisible to the others), its own
# /etc/hosts naming every host, and its own System V IPC. The hosts' eth0 are veth pairs
# to a bridge inside a separate "switch" namespace; nothing is added to the root network
# namespace. The rest of the filesystem (the checkout, /tmp) is shared, like a cluster's
# shared filesystem. `up` first removes a leftover cluster of a crashed run; a failing
# `up` removes what it made.
#
# Environment: CONDUIT_HOSTS_DIR (state, default /run/conduit-hosts/$CONDUIT_HOSTS_NAME),
# CONDUIT_HOSTS_NAME (default "cluster"; several clusters may exist side by side).
set -euo pipefail

NAME=${CONDUIT_HOSTS_NAME:-cluster}
STATE=${CONDUIT_HOSTS_DIR:-/run/conduit-hosts/$NAME}
SUBNET_PREFIX=10.213.0
SUBNET=$SUBNET_PREFIX.0/24
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MAX_HOSTS=32

die() { echo "cluster.sh: $*" >&2; exit 2; }
log() { echo "cluster.sh: $*" >&2; }

# --- privilege ----------------------------------------------------------------------------
need_privilege() {
  local missing=()
  for c in ip unshare nsenter tc mount hostname; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing commands: ${missing[*]} (iproute2, util-linux)"
  [ "$(id -u)" = 0 ] || die "needs root (CAP_SYS_ADMIN for namespaces and mounts, \
CAP_NET_ADMIN for links); running as uid $(id -u)"
  unshare --net --uts --mount --ipc true 2>/dev/null \
    || die "unshare --net --uts --mount --ipc failed: CAP_SYS_ADMIN missing or namespaces disabled"
  unshare --net sh -c 'ip link add cnd_probe type bridge && ip link add cnd_v0 type veth peer name cnd_v1' \
    2>/dev/null || die "cannot create a bridge and a veth pair in a network namespace \
(CAP_NET_ADMIN missing, or no bridge/veth in the kernel)"
}

# --- state --------------------------------------------------------------------------------
holder_alive() {  # PID MARK: the holder is alive and is ours: its argv[0] is exactly MARK
  # (not merely a command line that contains MARK: the setup script that starts it does)
  [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] \
    && [ "$(head -z -n 1 "/proc/$1/cmdline" 2>/dev/null | tr -d '\0')" = "$2" ]
}
pid_of() {  # HOST -> holder pid (exit 1 if the host is not up)
  local f=$STATE/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  holder_alive "$pid" "conduit-host:$NAME:$1" || return 1
  echo "$pid"
}
hosts() { [ -f "$STATE/hosts.list" ] && cat "$STATE/hosts.list"; }

# every process inside the network namespace NS (net:[inode], recorded by `up`): daemons
# left there, then the holder - even if the holder itself died first
kill_netns() {
  local ns=$1 pid=${2:-} p
  [ -n "$ns" ] || return 0
  # never the machine's own namespace (nor this script's): that would kill everything
  if [ "$ns" = "$(readlink /proc/$$/ns/net)" ] || [ "$ns" = "$(readlink /proc/1/ns/net)" ]; then
    log "not killing the processes of $ns: it is the machine's own network namespace"
    return 0
  fi
  for sig in TERM KILL; do
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" = "$$" ] && continue
      [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$ns" ] && kill -s "$sig" "$p" 2>/dev/null || true
    done
    for _ in $(seq 20); do
      [ -n "$pid" ] && [ -e "/proc/$pid" ] || break
      sleep 0.1
    done
  done
}

down() {
  [ -d "$STATE" ] || return 0
  local f h pid
  for f in "$STATE"/*.netns; do  # every host started, even by an `up` that failed halfway
    [ -f "$f" ] || continue
    h=$(basename "$f" .netns)
    pid=$(pid_of "$h") || pid=""
    kill_netns "$(cat "$f")" "$pid"
  done
  rm -rf "$STATE"
}

# --- up -----------------------------------------------------------------------------------
start_holder() {  # HOST SETUP-SCRIPT: a process in new namespaces that runs SETUP, then waits
  local h=$1 setup=$2
  # setsid: not in the caller's process group, so a ^C of the caller leaves it to `down`
  setsid unshare --net --uts --mount --ipc --propagation private \
    bash -c "$setup
exec -a 'conduit-host:$NAME:$h' sleep infinity" </dev/null >"$STATE/$h.log" 2>&1 &
  echo $! >"$STATE/$h.pid"
  for _ in $(seq 100); do
    if holder_alive "$(cat "$STATE/$h.pid")" "conduit-host:$NAME:$h"; then
      readlink "/proc/$(cat "$STATE/$h.pid")/ns/net" >"$STATE/$h.netns"
      [ "$(cat "$STATE/$h.netns")" != "$(readlink /proc/$$/ns/net)" ] \
        || die "host $h is in the machine's own network namespace (unshare failed?)"
      return 0
    fi
    kill -0 "$(cat "$STATE/$h.pid")" 2>/dev/null || break
    sleep 0.05
  done
  die "host $h did not start: $(cat "$STATE/$h.log")"
}

in_ns() { local pid=$1; shift; nsenter -t "$pid" -n -u -m -i -- "$@"; }

netem_available() {
  unshare --net sh -c 'ip link add cnd_v0 type veth peer name cnd_v1 &&
    tc qdisc add dev cnd_v0 root netem delay 1ms' 2>/dev/null
}

shape() {  # PID DEV RATE DELAY
  local pid=$1 dev=$2 rate=$3 delay=$4
  if [ -n "$rate" ] && [ -n "$delay" ]; then
    in_ns "$pid" tc qdisc add dev "$dev" root handle 1: netem delay "$delay"
    in_ns "$pid" tc qdisc add dev "$dev" parent 1: handle 10: tbf rate "$rate" burst 64kb latency 100ms
  elif [ -n "$rate" ]; then
    in_ns "$pid" tc qdisc add dev "$dev" root tbf rate "$rate" burst 64kb latency 100ms
  elif [ -n "$delay" ]; then
    in_ns "$pid" tc qdisc add dev "$dev" root netem delay "$delay"
  fi
}

unshape() {  # PID DEV: remove any root qdisc (back to the default)
  in_ns "$1" tc qdisc del dev "$2" root 2>/dev/null || true
}

reshape() {
  [ -f "$STATE/hosts.list" ] || die "no cluster '$NAME' is up ($STATE)"
  local rate="" delay=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value such as 100mbit}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value such as 5ms}; shift 2 ;;
      *) die "unknown option $1 (shape [--rate R] [--delay D])" ;;
    esac
  done
  if [ -n "$delay" ] && ! netem_available; then
    die "--delay needs the netem qdisc (sch_netem), which this kernel does not have; \
--rate (tbf) works without it"
  fi
  local sw h pid i
  sw=$(pid_of switch) || die "the switch of cluster '$NAME' is not up"
  for h in $(hosts); do
    pid=$(pid_of "$h") || die "host '$h' is not up"
    i=${h#host}
    unshape "$pid" eth0
    unshape "$sw" "p$i"
    shape "$pid" eth0 "$rate" "$delay"
    shape "$sw" "p$i" "$rate" "$delay"
  done
  echo "rate=${rate:-none} delay=${delay:-none} subnet=$SUBNET" >"$STATE/links"
  log "shaped: $(cat "$STATE/links")"
}

up() {
  local n=${1:-}; shift || true
  local rate="" delay=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value such as 1gbit}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value such as 5ms}; shift 2 ;;
      *) die "unknown option $1 (up N [--rate R] [--delay D])" ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_HOSTS ] \
    || die "up needs a host count 1..$MAX_HOSTS, got '${n}'"
  need_privilege
  if [ -n "$delay" ] && ! netem_available; then
    die "--delay needs the netem qdisc (sch_netem), which this kernel does not have; \
--rate (tbf) works without it"
  fi
  if [ -d "$STATE" ]; then log "removing a leftover cluster in $STATE"; down; fi
  mkdir -p "$STATE"
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (exit $rc); removing what it made"; down; fi' EXIT
  local i h etc_hosts=$STATE/etc-hosts
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; i++)); do echo "$SUBNET_PREFIX.$((10 + i)) host$i"; done
  } >"$etc_hosts"
  : >"$STATE/hosts.list.tmp"
  start_holder switch "hostname switch; ip link set lo up; ip link add br0 type bridge; ip link set br0 up"
  local sw; sw=$(cat "$STATE/switch.pid")
  for ((i = 0; i < n; i++)); do
    h=host$i
    start_holder "$h" "hostname $h
mount -t tmpfs -o mode=1777,size=50% shm /dev/shm
mount --bind '$etc_hosts' /etc/hosts
ip link set lo up"
    local pid; pid=$(cat "$STATE/$h.pid")
    # the veth pair is made inside the switch; its host end is moved straight into the host
    in_ns "$sw" ip link add "p$i" type veth peer name eth0 netns "$pid"
    in_ns "$sw" ip link set "p$i" master br0 up
    in_ns "$pid" ip addr add "$SUBNET_PREFIX.$((10 + i))/24" dev eth0
    in_ns "$pid" ip link set eth0 up
    shape "$pid" eth0 "$rate" "$delay"
    shape "$sw" "p$i" "$rate" "$delay"
    echo "$h" >>"$STATE/hosts.list.tmp"
  done
  mv "$STATE/hosts.list.tmp" "$STATE/hosts.list"
  for ((i = 0; i < n; i++)); do echo "host$i slots=64"; done >"$STATE/hostfile"
  echo "rate=${rate:-none} delay=${delay:-none} subnet=$SUBNET" >"$STATE/links"
  # every host reaches every other one before `up` returns
  if command -v ping >/dev/null; then
    for ((i = 1; i < n; i++)); do
      in_ns "$(pid_of host0)" ping -c 1 -W 2 "$SUBNET_PREFIX.$((10 + i))" >/dev/null \
        || die "host0 does not reach host$i over the bridge"
    done
  fi
  trap - EXIT
  log "up: $n hosts ($(cat "$STATE/links")), state in $STATE"
}

status() {
  [ -f "$STATE/hosts.list" ] || { echo "no cluster '$NAME' ($STATE)"; return 1; }
  local h pid ok=0
  echo "cluster '$NAME': $(cat "$STATE/links")"
  for h in $(hosts); do
    if pid=$(pid_of "$h"); then
      echo "$h pid $pid $(in_ns "$pid" hostname) $(in_ns "$pid" ip -4 -o addr show eth0 | awk '{print $4}')"
    else
      echo "$h DOWN"; ok=1
    fi
  done
  return $ok
}

exec_in() {
  local h=${1:?exec needs a host}; shift
  [ $# -gt 0 ] || die "exec needs a command"
  local pid; pid=$(pid_of "$h") || die "host '$h' is not up (cluster '$NAME', $STATE)"
  exec nsenter -t "$pid" -n -u -m -i --wd="$PWD" -- "$@"
}

reachable() {  # HOST: host0 reaches HOST over the bridge within 2 s (a TCP connection
  # to a closed port is refused at once when the host is there; a dropped or dead link
  # times out or has no route)
  local ip=$SUBNET_PREFIX.$((10 + ${1#host})) out
  out=$(in_ns "$(pid_of host0)" timeout 2 bash -c "exec 3<>/dev/tcp/$ip/9" 2>&1) && return 0
  [[ "$out" == *refused* ]]
}

check_hosts() {  # WHERE HOST...: the hosts an mpirun names - each once, each a host of this
  # cluster that is up and that host0 reaches - else a named error before PRRTE starts
  local where=$1 h seen=" " known
  known=" $(hosts | tr '\n' ' ')"
  shift
  [ $# -gt 0 ] || die "$where names no host"
  for h in "$@"; do
    [[ "$seen" == *" $h "* ]] && die "$where names host '$h' twice: give each host one \
line (with slots=N for several ranks)"
    seen+="$h "
    [[ "$known" == *" $h "* ]] || die "$where names host '$h', which is not a host of \
cluster '$NAME' (its hosts:${known% })"
    pid_of "$h" >/dev/null || die "host '$h' ($where) is down: its holder process is gone; \
run cluster.sh up again"
    [ "$h" = host0 ] || reachable "$h" || die "host '$h' ($where) cannot be reached from \
host0 over the bridge within 2 s (link down, or its traffic dropped)"
  done
}

mpirun_in() {
  [ -f "$STATE/hostfile" ] || die "no cluster '$NAME' is up"
  # prted on the other hosts is started by the agent (PRRTE's ssh launcher with our script);
  # the out-of-band channel and the TCP BTL keep to the cluster's subnet
  export PRTE_MCA_plm_ssh_agent=$HERE/agent.sh
  export PRTE_MCA_oob_tcp_if_include=${PRTE_MCA_oob_tcp_if_include:-$SUBNET}
  export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-$SUBNET}
  export CONDUIT_HOSTS_NAME=$NAME CONDUIT_HOSTS_DIR=$STATE
  # a hostfile or host list of the caller's wins (a subset of the hosts); the hosts it
  # names are checked first
  local args=("$@") i a file="" list="" own=0
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[$i]}
    case $a in
      --hostfile|--machinefile) file=${args[$((i + 1))]:-}; own=1 ;;
      --hostfile=*|--machinefile=*) file=${a#*=}; own=1 ;;
      --host|-H) list=${args[$((i + 1))]:-}; own=1 ;;
      --host=*) list=${a#*=}; own=1 ;;
    esac
  done
  if [ -n "$file" ]; then
    [ -r "$file" ] || die "hostfile '$file' cannot be read"
    # shellcheck disable=SC2046
    check_hosts "hostfile $file" $(sed -e 's/#.*//' "$file" | awk 'NF {print $1}')
  fi
  if [ -n "$list" ]; then
    # shellcheck disable=SC2046
    check_hosts "--host $list" $(tr ',' '\n' <<<"$list" | sed -e 's/:.*//' | awk 'NF')
  fi
  if [ $own = 1 ]; then exec_in host0 mpirun "$@"; fi
  # shellcheck disable=SC2046
  check_hosts "the cluster's hostfile" $(hosts)
  exec_in host0 mpirun --hostfile "$STATE/hostfile" "$@"
}

cmd=${1:-}; shift || true
case $cmd in
  up) up "$@" ;;
  down) down ;;
  shape) reshape "$@" ;;
  status) status ;;
  exec) exec_in "$@" ;;
  mpirun) mpirun_in "$@" ;;
  hostfile) [ -f "$STATE/hostfile" ] || die "no cluster '$NAME' is up"; echo "$STATE/hostfile" ;;
  *) die "usage: cluster.sh up N [--rate R] [--delay D] | shape [--rate R] [--delay D] | down | exec HOST CMD... | mpirun ARGS... | status | hostfile" ;;
esac
