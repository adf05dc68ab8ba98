//! Frame, segment header and small-file decoding from arbitrary bytes.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| walsink::simulation::check_decode(data));
