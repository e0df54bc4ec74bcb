#!/usr/bin/env bash
# A private Docker engine for servesweep's docker-launcher tests.
#
#   dev/dockerd.sh start DIR   start dockerd with all its state under DIR; prints
#                              `export DOCKER_HOST=unix://DIR/docker.sock` on stdout
#   dev/dockerd.sh stop DIR    stop it (by the PID in DIR/dockerd.pid), remove its
#                              containers first; safe to run twice
#   dev/dockerd.sh status DIR  exit 0 when it answers
#
# The engine touches nothing shared: its own --data-root, --exec-root, socket,
# pidfile and config file under DIR; no bridge, no iptables, no IP forwarding or
# masquerading (containers use --network host or none); container cgroups nest
# under the caller's own cgroups (a relative --cgroup-parent). Images come only
# from `docker import` (dev/docker-image.sh); nothing is pulled.
#
# Needs: the apt packages docker.io (dockerd, containerd, runc) and a docker CLI.
# Storage driver: overlay2 when DIR's filesystem supports it, else vfs
# (override with SERVESWEEP_DOCKERD_STORAGE=vfs|overlay2).
set -euo pipefail

die() { echo "dockerd.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 start|stop|status DIR"
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
sock="$dir/docker.sock"
pidfile="$dir/dockerd.pid"
log="$dir/dockerd.log"
docker=(docker -H "unix://$sock")
# Container cgroups go under <caller's cgroup>/$cgparent in every hierarchy (a relative
# --cgroup-parent); one name per DIR, so `stop` removes only its own folders.
cgparent="servesweep-dockerd-$(printf '%s' "$dir" | sha256sum | cut -c1-8)"
# Keep the socket path under the 108-byte limit of unix sockets.
[ ${#sock} -lt 100 ] || die "DIR path too long for a unix socket: $sock (use a shorter DIR)"

answers() { timeout 5 "${docker[@]}" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

daemon_pid() {
    # The PID from the pidfile, only if that process really is our dockerd.
    local pid
    [ -f "$pidfile" ] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--pidfile $pidfile" || return 1
    echo "$pid"
}

start() {
    if pid=$(daemon_pid); then
        die "a dockerd for $dir already runs (pid $pid); run: $0 stop $dir"
    fi
    command -v dockerd >/dev/null || die "dockerd not found: apt-get install docker.io"
    command -v docker >/dev/null || die "docker CLI not found: apt-get install docker.io"
    mkdir -p "$dir/data" "$dir/exec"
    echo '{}' >"$dir/daemon.json"
    local driver=${SERVESWEEP_DOCKERD_STORAGE:-}
    if [ -z "$driver" ]; then
        driver=vfs
        if grep -qw overlay /proc/filesystems; then
            # Probe a real overlay mount on DIR's filesystem.
            local probe="$dir/.overlay-probe"
            mkdir -p "$probe"/{lower,upper,work,merged}
            if mount -t overlay overlay \
                -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
                "$probe/merged" 2>/dev/null; then
                umount "$probe/merged"
                driver=overlay2
            fi
            rm -rf "$probe"
        fi
    fi
    rm -f "$sock" "$pidfile"
    # setsid: the daemon outlives this script and is stopped by PID, never by name.
    setsid dockerd \
        --config-file "$dir/daemon.json" \
        --data-root "$dir/data" \
        --exec-root "$dir/exec" \
        --host "unix://$sock" \
        --pidfile "$pidfile" \
        --storage-driver "$driver" \
        --bridge none \
        --iptables=false \
        --ip-forward=false \
        --ip-masq=false \
        --cgroup-parent "$cgparent" \
        --log-level warn \
        </dev/null >"$log" 2>&1 &
    local launched=$!
    echo "$launched" >"$dir/launcher.pid"
    local i
    for i in $(seq 1 300); do
        if answers; then
            echo "dockerd.sh: dockerd pid $(cat "$pidfile") answers on $sock (storage $driver)" >&2
            echo "export DOCKER_HOST=unix://$sock"
            return 0
        fi
        if ! kill -0 "$launched" 2>/dev/null; then
            echo "dockerd.sh: dockerd exited; last lines of $log:" >&2
            tail -n 20 "$log" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    echo "dockerd.sh: dockerd did not answer within 30 s; last lines of $log:" >&2
    tail -n 20 "$log" >&2 || true
    stop
    exit 1
}

stop() {
    local pid
    if ! pid=$(daemon_pid); then
        # Maybe it died before writing the pidfile: the process we launched.
        if [ -f "$dir/launcher.pid" ]; then
            pid=$(cat "$dir/launcher.pid")
            if ! { [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--pidfile $pidfile"; }; then
                pid=""
            fi
        fi
    fi
    if [ -z "${pid:-}" ]; then
        echo "dockerd.sh: no dockerd running for $dir" >&2
        unmount_all
        remove_cgroups
        return 0
    fi
    if answers; then
        local ids
        ids=$(timeout 20 "${docker[@]}" ps -aq 2>/dev/null || true)
        if [ -n "$ids" ]; then
            # shellcheck disable=SC2086
            timeout 60 "${docker[@]}" rm -f $ids >/dev/null 2>&1 || true
        fi
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "dockerd.sh: dockerd pid $pid ignored SIGTERM for 15 s; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    unmount_all
    remove_cgroups
    rm -f "$pidfile" "$dir/launcher.pid" "$sock"
    echo "dockerd.sh: dockerd pid $pid stopped" >&2
}

remove_cgroups() {
    # The (now empty) parent cgroup folders of our containers; rmdir refuses a folder
    # that still has processes or children, so nothing in use is touched.
    local d
    find /sys/fs/cgroup -maxdepth 6 -type d -name "$cgparent" 2>/dev/null | sort -r | while read -r d; do
        rmdir "$d" 2>/dev/null || echo "dockerd.sh: cgroup $d not empty, left" >&2
    done
}

unmount_all() {
    # Mounts the daemon may leave under DIR (overlay layers, netns, shm), deepest first.
    local m
    awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}

case $cmd in
    start) start ;;
    stop) stop ;;
    status) answers ;;
    *) die "unknown command $cmd (start|stop|status)" ;;
esac
