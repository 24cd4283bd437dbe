#!/usr/bin/env bash
# Multi-host ring over real network interfaces: two stages, each in its own network namespace
# joined to the host by a veth pair on a host bridge (a private 10.x/24), with the ring secret
# on. The coordinator runs in the host namespace and reaches the stages only by their namespace
# addresses; the stages' activation channel crosses the bridge. Checks:
#   1. greedy token ids of the 2+2 layer ring over the namespaces equal the transformers golden
#      tokens of the llama fixture and those of an embedded one-process ring;
#   2. a stage bound to its namespace address without a secret (and without --insecure) refuses
#      to start, pointing to loopback;
#   3. a stranger's coordinator on another "host" (a third namespace) holding a different secret
#      is refused by the live stages (wrong proof), and the ring still answers with the same
#      tokens afterwards.
# Needs root (or CAP_NET_ADMIN) and kernel netns/veth/bridge support; otherwise it prints
# "SKIP: ..." and exits 77 (CTest's SKIP_RETURN_CODE).
#
# usage: netns_ring_test.sh BUILD_DIR SOURCE_DIR
set -u -o pipefail

BUILD=${1:?usage: netns_ring_test.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: netns_ring_test.sh BUILD_DIR SOURCE_DIR}
STAGE=$BUILD/stage/stage
COORD=$BUILD/coordinator/coordinator
CLIENT=$BUILD/coordinator/ringserve_client
MODEL=$SRC/tests/fixtures/models/llama
WAIT_S=10  # bound on each wait (start-up, one generation, a refusal)

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: network namespaces are not available here: $*"; exit 77; }

for bin in "$STAGE" "$COORD" "$CLIENT"; do
  [[ -x $bin ]] || fail "missing binary $bin (build the stage, coordinator and ringserve_client targets)"
done
[[ -f $MODEL/config.json ]] || fail "missing fixture $MODEL"
command -v ip >/dev/null || skip "the 'ip' tool (iproute2) is not installed"

# Unique per run: names (interface names <= 15 characters) and the subnet.
TAG="rs$$"
NS1="${TAG}a"
NS2="${TAG}b"
NS3="${TAG}c"  # the no-secret refusal check
BR="${TAG}br"
NET="10.$((200 + $$ % 50)).$((($$ / 50) % 250))"
HOST_IP=$NET.1
IP1=$NET.2
IP2=$NET.3
IP3=$NET.4
WORK=$(mktemp -d "${TMPDIR:-/tmp}/netns_ring.XXXXXX") || fail "mktemp"
PIDS=()
NAMESPACES=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  local ns
  for ns in "${NAMESPACES[@]}"; do
    ip link del "${ns}h" 2>/dev/null  # the veth pair (also dropped with its namespace, later)
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "$BR" 2>/dev/null
  if [[ ${KEEP_WORK:-0} != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the network: a bridge in the host namespace, one veth pair per namespace -------------
if ! err=$(ip netns add "$NS1" 2>&1); then skip "ip netns add: $err"; fi
NAMESPACES+=("$NS1")
if ! err=$(ip link add "$BR" type bridge 2>&1); then skip "ip link add type bridge: $err"; fi
ip addr add "$HOST_IP/24" dev "$BR" || fail "address on $BR"
ip link set "$BR" up || fail "bridge up"
join() {  # join NS IP: a veth pair from the bridge into NS, NS's end at IP/24
  local ns=$1 addr=$2 host_end="${1}h"
  [[ $ns == "$NS1" ]] || { ip netns add "$ns" || fail "ip netns add $ns"; NAMESPACES+=("$ns"); }
  if ! err=$(ip link add "$host_end" type veth peer name eth0 netns "$ns" 2>&1); then
    skip "ip link add type veth: $err"
  fi
  ip link set "$host_end" master "$BR" up || fail "enslave $host_end"
  ip -n "$ns" addr add "$addr/24" dev eth0 || fail "address in $ns"
  ip -n "$ns" link set eth0 up || fail "eth0 up in $ns"
  ip -n "$ns" link set lo up || fail "lo up in $ns"
}
join "$NS1" "$IP1"
join "$NS2" "$IP2"
join "$NS3" "$IP3"

# wait_ready FILE PID WHAT: until FILE (the process's --ready_fd) has a line; echoes it.
wait_ready() {
  local file=$1 pid=$2 what=$3
  for _ in $(seq $((WAIT_S * 20))); do
    if [[ -s $file ]] && grep -q . "$file"; then head -n1 "$file"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "$what exited before serving; its log:" >&2; cat "$WORK/$what.log" >&2; return 1; }
    sleep 0.05
  done
  echo "$what not serving after ${WAIT_S}s; its log:" >&2
  cat "$WORK/$what.log" >&2
  return 1
}

T0=$SECONDS

# --- 2. no secret, non-loopback address: the stage must refuse ---------------------------
rc=0
timeout "$WAIT_S" ip netns exec "$NS3" "$STAGE" --listen "$IP3:7001" >"$WORK/refuse.log" 2>&1 || rc=$?
if [[ $rc -eq 0 || $rc -eq 124 ]]; then
  cat "$WORK/refuse.log" >&2
  fail "a stage listening on $IP3 without a ring secret started (rc $rc); it must refuse"
fi
if ! grep -qi "without a ring secret" "$WORK/refuse.log" || ! grep -q "127.0.0.1" "$WORK/refuse.log"; then
  cat "$WORK/refuse.log" >&2
  fail "the refusal does not say: no ring secret, listen on loopback (127.0.0.1)"
fi
echo "ok: a stage on $IP3 without a secret refuses (rc $rc)"

# --- the ring secret: 32 random bytes (hex), owner-only ------------------------------------
SECRET=$WORK/ring.secret
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SECRET") || fail "secret"
chmod 600 "$SECRET"

# --- 1a. stages inside the namespaces ----------------------------------------------------
start_stage() {  # start_stage NS IP NAME
  local ns=$1 addr=$2 name=$3
  : >"$WORK/$name.ready"
  ip netns exec "$ns" "$STAGE" --listen "$addr:7001" --ring_secret "$SECRET" \
    --model_root "$SRC/tests/fixtures" --ready_fd 3 3>"$WORK/$name.ready" >"$WORK/$name.log" 2>&1 &
  echo $!
}
S1=$(start_stage "$NS1" "$IP1" stage1)
S2=$(start_stage "$NS2" "$IP2" stage2)
# start_stage ran in a subshell: record the pids here.
PIDS+=("$S1" "$S2")
a1=$(wait_ready "$WORK/stage1.ready" "$S1" stage1) || fail "stage 1 in $NS1"
a2=$(wait_ready "$WORK/stage2.ready" "$S2" stage2) || fail "stage 2 in $NS2"
echo "ok: stages serving at $a1 ($NS1) and $a2 ($NS2)"
# Plain TCP reachability first (host -> stage, stage -> stage over the bridge), so that a host
# firewall on bridged traffic (br_netfilter with a FORWARD policy of DROP, as Docker sets up)
# is reported as such rather than as a ring failure.
probe() { timeout 3 ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/7001" 2>/dev/null; }
timeout 3 bash -c "exec 3<>/dev/tcp/$IP1/7001" 2>/dev/null ||
  skip "the host namespace cannot reach $IP1:7001 over bridge $BR (a host firewall?)"
probe "$NS1" "$IP2" ||
  skip "namespace $NS1 cannot reach $IP2:7001 over bridge $BR (bridged traffic filtered: br_netfilter with FORWARD DROP?)"

cat >"$WORK/hosts.yaml" <<YAML
model: $MODEL
ring_secret: $SECRET
api:
  grpc: 127.0.0.1:0
stages:
  - {host: $IP1, port: 7001, device: cpu, layers: 2}
  - {host: $IP2, port: 7001, device: cpu, layers: 2}
YAML

: >"$WORK/coord.ready"
"$COORD" --stages "$WORK/hosts.yaml" --listen 127.0.0.1:0 --ready_fd 3 \
  3>"$WORK/coord.ready" >"$WORK/coord.log" 2>&1 &
C1=$!
PIDS+=("$C1")
api=$(wait_ready "$WORK/coord.ready" "$C1" coord) || fail "coordinator over the namespaces"
echo "ok: coordinator over the namespace ring serving at $api"

# --- 1b. the same request on the embedded one-process ring -------------------------------
: >"$WORK/embedded.ready"
"$COORD" --model "$MODEL" --num_stages 1 --listen 127.0.0.1:0 --ready_fd 3 \
  3>"$WORK/embedded.ready" >"$WORK/embedded.log" 2>&1 &
C2=$!
PIDS+=("$C2")
api2=$(wait_ready "$WORK/embedded.ready" "$C2" embedded) || fail "embedded coordinator"

# The fixture's third golden prompt (its greedy continuation is not one repeated token).
read -r PROMPT GOLDEN < <(python3 - "$MODEL/golden.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["prompts"][2]
print(",".join(map(str, p["token_ids"])), " ".join(map(str, p["greedy_token_ids"][:16])))
PY
) || fail "reading golden.json"
[[ -n $PROMPT ]] || fail "no prompt in golden.json"

generate() {  # generate TARGET -> token ids, space-separated
  timeout "$WAIT_S" "$CLIENT" --target "$1" --prompt_ids "$PROMPT" --max_tokens 16 --ignore_eos \
    --print_ids 2>>"$WORK/client.log" >"$WORK/client.out" || return 1
  # "[token ids: 1 2 3]" -> "1 2 3"
  grep -oE 'token ids:[0-9 ,]*' "$WORK/client.out" | grep -oE '[0-9]+' | paste -sd' ' -
}
got=$(generate "$api") || { cat "$WORK/client.log" "$WORK/coord.log" >&2; fail "generation over the namespaces"; }
ref=$(generate "$api2") || { cat "$WORK/client.log" "$WORK/embedded.log" >&2; fail "generation on the embedded ring"; }
echo "namespace ring: $got"
echo "embedded ring:  $ref"
echo "golden:         $GOLDEN"
[[ -n $got ]] || fail "no tokens from the namespace ring"
[[ $got == "$ref" ]] || fail "the namespace ring's tokens differ from the embedded ring's"
[[ $got == "$GOLDEN" ]] || fail "the namespace ring's tokens differ from the golden tokens"
echo "ok: tokens over the namespaces equal the embedded ring's and the golden ones"

# --- 3. a stranger on the network with another secret is refused ---------------------------
STRANGER_SECRET=$WORK/stranger.secret
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STRANGER_SECRET") || fail "secret"
sed "s|^ring_secret: .*|ring_secret: $STRANGER_SECRET|" "$WORK/hosts.yaml" >"$WORK/stranger.yaml"
rc=0
timeout "$WAIT_S" ip netns exec "$NS3" "$COORD" --stages "$WORK/stranger.yaml" \
  --listen 127.0.0.1:0 >"$WORK/stranger.log" 2>&1 || rc=$?
if [[ $rc -eq 0 || $rc -eq 124 ]]; then
  cat "$WORK/stranger.log" >&2
  fail "a coordinator with another secret was not refused by the stages (rc $rc)"
fi
grep -qi "secret" "$WORK/stranger.log" || { cat "$WORK/stranger.log" >&2; fail "the stranger's refusal does not name the secret"; }
echo "ok: a stranger's coordinator in $NS3 is refused (rc $rc): $(grep -i -m1 secret "$WORK/stranger.log")"
again=$(generate "$api") || { cat "$WORK/client.log" "$WORK/coord.log" >&2; fail "generation after the stranger"; }
[[ $again == "$got" ]] || fail "after the stranger the ring answers $again, before $got"
echo "ok: the ring still answers the same tokens"
echo "PASS: 2-stage ring over network namespaces with the ring secret: golden tokens, refusals ($((SECONDS - T0))s)"
