#!/usr/bin/env bash
# Runs the fixture by hand and records what a Eureka client of it sees: starts the server and two
# apps (app-a plain, app-b with metadata version=zlt) on free loopback ports, drives them through
# the changes below and writes every JSON body it reads to samples/ (verbatim), printing the
# command lines and timings on stdout. Every process it starts is stopped at the end.
#
#   scripts/build-eureka.sh && tests/sources/eureka/record-samples.sh [OUT_DIR]
#
# Steps: both apps start together; app-b read alone; app-a stopped with SIGTERM; app-a started
# again; app-b set OUT_OF_SERVICE and back; app-a killed with SIGKILL; then the delta is watched
# until its changes leave the recent-changes queue.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$here/samples}"
server_jar="$root/target/eureka/eureka-server.jar"
app_jar="$root/target/eureka/eureka-app.jar"
logs="$(mktemp -d "${TMPDIR:-/tmp}/rota-eureka-samples.XXXXXX")"
mkdir -p "$out"
[[ -f "$server_jar" && -f "$app_jar" ]] || { echo "record-samples.sh: run scripts/build-eureka.sh first" >&2; exit 1; }

# The JVM flags the test harness uses: C1 only, the default CDS archive, a small heap, serial GC.
jvm=(-XX:TieredStopAtLevel=1 -Xshare:auto -Xms64m -Xmx256m -XX:+UseSerialGC)

# Each JVM runs directly (its pid is the JVM's, so SIGTERM and SIGKILL reach it) and has a
# watchdog that kills it after 10 minutes whatever happens to this script.
pids=() watchdogs=()
spawn() {  # LOG CMD...; sets $last_pid
  local log="$1"; shift
  "$@" >"$log" 2>&1 &
  last_pid=$!
  pids+=("$last_pid")
  (sleep 600 & s=$!; trap 'kill $s 2>/dev/null; exit 0' TERM; wait $s; kill -KILL "$last_pid" 2>/dev/null) \
    >/dev/null 2>&1 &
  watchdogs+=($!)
}
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for pid in "${watchdogs[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

read -r S A B < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
base="http://127.0.0.1:$S/eureka"

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
get() { curl -sS --max-time 5 -H 'Accept: application/json' "$base/$1"; }
save() { get "$1" >"$out/$2"; echo "  saved GET /eureka/$1 -> samples/$2"; }
# "NAME=STATUS" for each app NAME given (STATUS comma-separated per instance, or "absent"), as
# GET /eureka/apps shows them.
status_of() {
  get apps | python3 -c '
import json, sys
apps = json.load(sys.stdin)["applications"]["application"]
print(" ".join(n + "=" + (",".join(i["status"] for a in apps if a["name"] == n for i in a["instance"]) or "absent") for n in sys.argv[1:]))' "$@"
}
# Polls every 50 ms (at most LIMIT s) until each app of NAMES ("APP-A APP-B") has status WANT,
# printing each change with the time since T0.
watch_until() {
  local names="$1" want="$2" limit="$3" t0="$4" last="" st expect="" n deadline
  for n in $names; do expect+="${expect:+ }$n=$want"; done
  deadline=$(python3 -c "print($(now) + $limit)")
  while :; do
    # shellcheck disable=SC2086
    st="$(status_of $names 2>/dev/null || echo unreachable)"
    if [[ "$st" != "$last" ]]; then echo "  +$(since "$t0") s: $st"; last="$st"; fi
    [[ "$st" == "$expect" ]] && return 0
    python3 -c "import sys; sys.exit(0 if $(now) < $deadline else 1)" || { echo "  not $expect within $limit s" >&2; return 1; }
    sleep 0.05
  done
}
# The delta's entries as ID=ACTION.
delta_entries() {
  get apps/delta | python3 -c '
import json, sys
apps = json.load(sys.stdin)["applications"]["application"]
print(" ".join(i["instanceId"] + "=" + i["actionType"] for a in apps for i in a["instance"]) or "empty")'
}

start_app() {  # NAME PORT [EXTRA ARGS...]; sets $last_pid
  local name="$1" port="$2"; shift 2
  local cmd=(java "${jvm[@]}" -jar "$app_jar" "--server.port=$port"
    "--eureka.client.service-url.defaultZone=http://127.0.0.1:$S/eureka/"
    "--spring.application.name=$name" "$@")
  echo "  \$ ${cmd[*]}"
  spawn "$logs/$name.log" "${cmd[@]}"
}

echo "== server"
cmd=(java "${jvm[@]}" -jar "$server_jar" "--server.port=$S")
echo "  \$ ${cmd[*]}"
t0=$(now)
spawn "$logs/server.log" "${cmd[@]}"
until [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 -H 'Accept: application/json' "$base/apps")" == 200 ]]; do
  python3 -c "import sys; sys.exit(0 if $(since "$t0") < 60 else 1)" || { echo "server not up in 60 s" >&2; cat "$logs/server.log" >&2; exit 1; }
  sleep 0.1
done
echo "  +$(since "$t0") s: GET /eureka/apps answers 200"
save apps apps-empty.json

echo "== app-a and app-b started together"
t0=$(now)
start_app app-a "$A"; pid_a=$last_pid
start_app app-b "$B" --eureka.instance.metadata-map.version=zlt; pid_b=$last_pid
watch_until "APP-A APP-B" UP 60 "$t0"
echo "  GET http://127.0.0.1:$A/ -> $(curl -sS --max-time 5 "http://127.0.0.1:$A/")"
echo "  GET http://127.0.0.1:$B/ -> $(curl -sS --max-time 5 "http://127.0.0.1:$B/")"
save apps apps-two-up.json
save apps/delta delta-two-started.json
save apps/APP-B app-b.json
id_b="127.0.0.1:app-b:$B"
save "apps/APP-B/$id_b" app-b-instance.json

echo "== app-a stopped with SIGTERM"
t0=$(now)
kill -TERM "$pid_a"
watch_until APP-A absent 30 "$t0"
wait "$pid_a" 2>/dev/null || true
echo "  +$(since "$t0") s: app-a's JVM exited"
save apps apps-after-a-stopped.json
save apps/delta delta-after-a-stopped.json
echo "  GET /eureka/apps/APP-A -> $(curl -s -o /dev/null -w '%{http_code}' -H 'Accept: application/json' "$base/apps/APP-A")"

echo "== app-a started again (alone)"
t0=$(now)
start_app app-a "$A"; pid_a=$last_pid
watch_until APP-A UP 60 "$t0"
save apps apps-after-a-restarted.json
save apps/delta delta-after-a-restarted.json

echo "== app-b set OUT_OF_SERVICE, then back"
echo "  PUT /eureka/apps/APP-B/$id_b/status?value=OUT_OF_SERVICE -> $(curl -s -o /dev/null -w '%{http_code}' -X PUT "$base/apps/APP-B/$id_b/status?value=OUT_OF_SERVICE")"
save apps/APP-B app-b-out-of-service.json
save apps/delta delta-b-out-of-service.json
save apps apps-b-out-of-service.json
sleep 3
echo "  after 3 s of app-b's renewals: $(status_of APP-B)"
echo "  DELETE /eureka/apps/APP-B/$id_b/status?value=UP -> $(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$base/apps/APP-B/$id_b/status?value=UP")"
save apps/APP-B app-b-back-up.json
save apps/delta delta-b-back-up.json

echo "== app-a killed with SIGKILL"
t0=$(now)
kill -KILL "$pid_a"
wait "$pid_a" 2>/dev/null || true
watch_until APP-A absent 60 "$t0"
save apps apps-after-a-killed.json
save apps/delta delta-after-a-killed.json
t_change=$t0

echo "== delta watched until empty (no change since the kill)"
last=""
while :; do
  d="$(delta_entries)"
  if [[ "$d" != "$last" ]]; then echo "  +$(since "$t_change") s: delta: $d"; last="$d"; fi
  [[ "$d" == empty ]] && break
  python3 -c "import sys; sys.exit(0 if $(since "$t_change") < 240 else 1)" || { echo "  delta not empty in 240 s" >&2; break; }
  sleep 1
done
save apps/delta delta-empty.json
save apps apps-b-only.json

echo "== app-b and the server stopped with SIGTERM"
kill -TERM "$pid_b"; wait "$pid_b" 2>/dev/null || true
kill -TERM "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
echo "  logs in $logs"
