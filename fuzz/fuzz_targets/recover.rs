//! Opening and recovering a log directory damaged as the input says.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| walsink::simulation::check_recovery(data));
