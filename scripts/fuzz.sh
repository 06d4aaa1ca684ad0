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
# The corpus is kept in protocol/fuzz/corpus/TARGET between runs; crashes are
# written to protocol/fuzz/artifacts/TARGET and make the script exit non-zero.
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

cd "$fuzz_dir"
mkdir -p "corpus/$target"
cargo fuzz build --sanitizer "$sanitizer" "$target"
cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" -- \
    -max_total_time="$duration" -print_final_stats=1
