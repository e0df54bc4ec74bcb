#!/usr/bin/env bash
# The naive configuration sweep of the seed incident (see README.md), against the
# simulated engine: restart with new flags, sleep a fixed time, poll /v1/models,
# benchmark with curl. It looks reasonable and it is wrong.
#
# Environment (defaults reproduce the incident at 1/100 of its time scale):
#   PYTHON      python with servesweep installed           (python3)
#   PORT        port of the server                        (8000)
#   WORK        directory for the fake GPUs, logs, pid    (./seed-race-run)
#   SLEEP       seconds between stop and start            (0.5; the incident: 8)
#   POLL        /v1/models polls, 0.2 s apart              (10)
#   LOAD        weights load time of the engine, s        (1.5; the incident: ~400)
#   RELEASE     GPU memory release after exit, s          (1.5; longer than SLEEP)
#   DRAIN       old process still answering after SIGTERM (1.0)
set -u
PYTHON=${PYTHON:-python3}
PORT=${PORT:-8000}
WORK=${WORK:-./seed-race-run}
SLEEP=${SLEEP:-0.5}
POLL=${POLL:-10}
LOAD=${LOAD:-1.5}
RELEASE=${RELEASE:-1.5}
DRAIN=${DRAIN:-1.0}

mkdir -p "$WORK"
# One fake 1 GiB GPU: one instance (700 MiB) fits, two do not.
"$PYTHON" -m servesweep.fakegpu init "$WORK/gpus" --count 1 --memory 1GiB >/dev/null

reconfig() {  # budget topk window
    if [ -f "$WORK/server.pid" ]; then
        kill "$(cat "$WORK/server.pid")" 2>/dev/null   # like `systemctl stop`: no wait
    fi
    sleep "$SLEEP"
    "$PYTHON" -m servesweep.sim --port "$PORT" --fake-gpus "$WORK/gpus" \
        --mem-per-gpu 700MiB --load-time "$LOAD" --release-delay "$RELEASE" \
        --shutdown-delay "$DRAIN" --ttft-ms 20 --step-ms 5 \
        --budget "$1" --topk "$2" --window "$3" \
        >"$WORK/server-$1-$2-$3.log" 2>&1 &
    echo $! >"$WORK/server.pid"
    echo "config budget=$1 topk=$2 window=$3: started pid $!"
    for _ in $(seq "$POLL"); do
        if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}

bench() {  # budget topk window
    local headers="$WORK/headers" body
    body=$(curl -s -D "$headers" -o /dev/null -w '%{http_code} %{time_total}' \
        "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "benchmark me", "max_tokens": 64, "ignore_eos": true}')
    local instance
    instance=$(tr -d '\r' <"$headers" | awk -F': ' 'tolower($1)=="x-sim-instance"{print $2}')
    echo "config budget=$1 topk=$2 window=$3: benchmark status/time ${body}s answered by ${instance%%-*}"
}

for config in "8 4 2048" "16 4 2048" "4 4 2048" "12 6 2048"; do
    # shellcheck disable=SC2086
    set -- $config
    if reconfig "$@"; then
        bench "$@"
    else
        echo "config budget=$1 topk=$2 window=$3: failed to start"
    fi
done
if [ -f "$WORK/server.pid" ]; then
    kill "$(cat "$WORK/server.pid")" 2>/dev/null
fi
