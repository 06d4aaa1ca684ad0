//! Link flags for a Node addon (symbols resolved by the node process).

fn main() {
    napi_build::setup();
}
