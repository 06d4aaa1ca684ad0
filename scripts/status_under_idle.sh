#!/usr/bin/env bash
# Times the owner's `tether status` while two other local users hold 5,000
# idle connections each: a reader (who passes the peer check and meets the
# per-uid cap) and a stranger (refused at once). Needs root, to run the
# helpers as those users; it makes the users the tests use if missing.
#
#   scripts/status_under_idle.sh [RUNS]      default 10
#
# Uses the release build (built first) in $CARGO_TARGET_DIR or target/.
set -euo pipefail
RUNS=${1:-10}
N=5000
cd "$(dirname "$0")/.."
cargo build --release --quiet -p tetherd -p tether -p tether-tests --bins
BIN=${CARGO_TARGET_DIR:-target}/release

getent group tether-it-readers >/dev/null || groupadd tether-it-readers
id tether-it-reader >/dev/null 2>&1 || useradd -M -N -G tether-it-readers tether-it-reader
id tether-it-stranger >/dev/null 2>&1 || useradd -M -N tether-it-stranger

# Each connection is a descriptor, in the daemon and in the helpers.
ulimit -n "$(ulimit -Hn)"
DIR=$(mktemp -d /tmp/ttfig.XXXX)
chmod 0711 "$DIR"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait
    rm -rf "$DIR"
}
trap cleanup EXIT

TETHER_READERS_GROUP=tether-it-readers TETHER_SOCKET_MODE=666 \
    "$BIN/tetherd" --socket "$DIR/s" --state-dir "$DIR/state" 2>"$DIR/tetherd.err" &
PIDS+=($!)
until "$BIN/tether" --socket "$DIR/s" status >/dev/null 2>&1; do sleep 0.1; done

time_status() {
    for _ in $(seq "$RUNS"); do
        local start end
        start=$(date +%s%N)
        "$BIN/tether" --socket "$DIR/s" status >/dev/null
        end=$(date +%s%N)
        printf '%.1fms ' "$(( (end - start) / 1000 ))e-3"
    done
    echo
}

echo -n "status, no other connections:      "
time_status

# The helpers hold their connections until their stdin ends: a fifo kept
# open here.
mkfifo "$DIR/hold"
exec 3<>"$DIR/hold"
as() { setpriv --reuid="$1" --regid="$(id -g "$1")" --init-groups "${@:2}"; }
as tether-it-reader "$BIN/tether-it-idle" "$DIR/s" "$N" --hello <"$DIR/hold" >"$DIR/reader.out" &
PIDS+=($!)
as tether-it-stranger "$BIN/tether-it-idle" "$DIR/s" "$N" --listen <"$DIR/hold" >"$DIR/stranger.out" &
PIDS+=($!)
until grep -q holding "$DIR/reader.out" 2>/dev/null &&
    grep -q holding "$DIR/stranger.out" 2>/dev/null; do
    sleep 0.05
done
echo "reader:   $(sed 's/:.*//' "$DIR/reader.out" | grep -v holding | paste -sd, -)"
echo "stranger: $(sed 's/:.*//' "$DIR/stranger.out" | grep -v holding | paste -sd, -)"
echo -n "status, 2 x $N connections held:  "
time_status
"$BIN/tether" --socket "$DIR/s" status | grep connections
