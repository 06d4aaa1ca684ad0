//! Feeds arbitrary bytes to both decoders as if they came off a socket.
//! The checks live in `tests/decode_checks/mod.rs`, shared with the
//! regression test that replays saved inputs (`tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The target only needs the checks to run; what they return is for the
// regression test to pin.
#[allow(dead_code)]
#[path = "../../tests/decode_checks/mod.rs"]
mod decode_checks;

fuzz_target!(|data: &[u8]| {
    let _ = decode_checks::check_input(data);
});
