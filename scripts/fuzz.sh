#!/usr/bin/env bash
# Runs a short fuzzing session against the protocol decoder.
#
#   scripts/fuzz.sh [SECONDS] [TARGET]     defaults: 60 decode
#
# Works on the stable toolchain. By default the target is built without a
# sanitizer (`-s none`): the protocol crate forbids `unsafe`, so AddressSanitizer
# has little to find, and without it no unstable compiler flag is needed and
# the fuzzer runs many times faster. Set FUZZ_SANITIZER=address to build with
# ASan anyway; on a stable toolchain that needs RUSTC_BOOTSTRAP=1, which this
# script then sets for the build only.
#
# The corpus is kept in protocol/fuzz/corpus/TARGET between runs (it is not
# committed); crashes are written to protocol/fuzz/artifacts/TARGET and make
# the script exit non-zero. For each new crash the script prints how to
# minimize it with `cargo fuzz tmin`. A minimized `decode` crasher belongs in
# protocol/tests/fuzz_regressions/ under a name saying what it is (say
# `length-prefix-4GiB.bin`): `cargo test -p tether-protocol --test
# fuzz_regressions` replays every file there through the same checks, so the
# bug stays fixed without a fuzzer. The files keep the fuzzer's input format
# (first byte: how the stream is split into reads; the rest: the stream).
set -euo pipefail

duration="${1:-60}"
target="${2:-decode}"
sanitizer="${FUZZ_SANITIZER:-none}"

if ! [[ "$duration" =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz.sh: duration must be a whole number of seconds, got '$duration'" >&2
    exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fuzz_dir="$repo_root/protocol/fuzz"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz passes -Zsanitizer=... for any sanitizer but `none`; stable rustc
# accepts -Z flags only with RUSTC_BOOTSTRAP set. Cargo caches rustc's answers
# (failures included) without regard to RUSTC_BOOTSTRAP, so one earlier
# attempt without it would keep failing; CARGO_CACHE_RUSTC_INFO=0 skips that
# cache.
if [[ "$sanitizer" != "none" ]]; then
    export RUSTC_BOOTSTRAP=1 CARGO_CACHE_RUSTC_INFO=0
fi

# Tells how to turn each crash the run left behind into a regression test.
report_crashes() {
    local artifact found=0 env_prefix=""
    # The same build settings as this run, or tmin rebuilds the target
    # differently (and, with a sanitizer, fails on a stable toolchain).
    if [[ "$sanitizer" != "none" ]]; then
        env_prefix="RUSTC_BOOTSTRAP=1 CARGO_CACHE_RUSTC_INFO=0 "
    fi
    for artifact in "artifacts/$target"/*; do
        # Only crashes this run found: older ones were reported before, and
        # tmin's own outputs are not crashes of their own.
        if [[ ! -f "$artifact" || -n "${before[$artifact]:-}" ]]; then
            continue
        fi
        case "$(basename "$artifact")" in
            minimized-from-*) continue ;;
        esac
        found=1
        echo "fuzz.sh: $target failed on $fuzz_dir/$artifact" >&2
        echo "  minimize it: (cd $fuzz_dir && ${env_prefix}cargo fuzz tmin --sanitizer $sanitizer $target $artifact)" >&2
    done
    [[ "$found" == 1 ]] || return 0
    if [[ "$target" == "decode" ]]; then
        echo "  then copy the minimized input (the artifacts/decode/minimized-from-* file tmin names) to" >&2
        echo "  $repo_root/protocol/tests/fuzz_regressions/NAME.bin, NAME saying what the input is, so that" >&2
        echo "  'cargo test -p tether-protocol --test fuzz_regressions' replays it from now on." >&2
    else
        echo "  then reproduce it with: (cd $fuzz_dir && ${env_prefix}cargo fuzz run --sanitizer $sanitizer $target FILE)" >&2
    fi
}

cd "$fuzz_dir"
mkdir -p "corpus/$target" "artifacts/$target"
declare -A before=()
for artifact in "artifacts/$target"/*; do
    if [[ -f "$artifact" ]]; then
        before[$artifact]=1
    fi
done
cargo fuzz build --sanitizer "$sanitizer" "$target"
status=0
cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" -- \
    -max_total_time="$duration" -print_final_stats=1 || status=$?
if [[ "$status" != 0 ]]; then
    report_crashes
    exit "$status"
fi
