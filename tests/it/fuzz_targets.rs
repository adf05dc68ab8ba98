//! The fuzz targets' logic (`walsink::simulation::check_*`), run as ordinary tests over a few
//! fixed and a few hundred random inputs, so CI exercises them without a fuzzer.

use walsink::simulation::{check_decode, check_ops, check_recovery};

fn inputs(n: usize, max: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![vec![], vec![0; 64], vec![0xff; 300]];
    for _ in 0..n {
        let len = rng.usize(0..max);
        v.push((0..len).map(|_| rng.u8(..)).collect());
    }
    v
}

#[test]
fn decode_target() {
    for data in inputs(300, 400, 1) {
        check_decode(&data);
    }
}

/// Inputs the fuzzers found, kept as regression tests.
#[test]
fn found_by_fuzzing() {
    // A truncation that cut a frame's zero padding: the frame verified but did not fit.
    check_recovery(&[0xbb, 0x54, 0x54, 0x45, 0x44, 0xa7]);
}

#[test]
fn recovery_target() {
    for data in inputs(150, 40, 2) {
        check_recovery(&data);
    }
}

#[test]
fn ops_target() {
    for data in inputs(150, 300, 3) {
        if let Err(f) = check_ops(&data) {
            panic!("{f}");
        }
    }
}
