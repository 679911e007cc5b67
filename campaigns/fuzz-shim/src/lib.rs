//! A stand-in for `libfuzzer-sys` on stable Rust. `fuzz_target!(|data: &[u8]|
//! body)` here defines `pub fn run(data: &[u8])` with that body, so a fuzz
//! target's file, included as a module (`#[path = ...] mod target;`), can be
//! called with chosen inputs by an ordinary test. Under `cargo fuzz` the
//! same file uses the real crate and libFuzzer.

#[macro_export]
macro_rules! fuzz_target {
    (|$data:ident: &[u8]| $body:block) => {
        /// The fuzz target's body.
        pub fn run($data: &[u8]) $body
    };
}
