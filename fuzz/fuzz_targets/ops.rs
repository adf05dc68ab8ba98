//! Arbitrary operation sequences with kills, checked against the reference model.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(f) = walsink::simulation::check_ops(data) {
        panic!("{f}");
    }
});
