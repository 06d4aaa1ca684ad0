//! Placeholder: the example agent is being written.

fn main() {}
