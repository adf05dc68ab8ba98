//! Property test: random operation sequences (append, checkpoint, complete, restore, sink
//! failure, reopen, kills at sync points and between operations, failed syncs, disk damage,
//! checkpoint ids near `u64::MAX`) against the reference model
//! of `walsink::simulation`. proptest shrinks a failure to a minimal sequence.

use proptest::prelude::*;
use walsink::simulation::{run_ops, Op};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..=4, 0u16..400).prop_map(|(count, pad)| Op::Append { count, pad }),
        3 => (0u8..3, 0u8..20).prop_map(|(skip, meta)| Op::Checkpoint { skip, meta }),
        2 => any::<bool>().prop_map(|older| Op::Complete { older }),
        2 => proptest::option::of(0u8..4).prop_map(|fail_at| Op::Deliver { fail_at }),
        1 => Just(Op::Restore),
        1 => Just(Op::Reopen),
        1 => (0u8..6).prop_map(Op::KillAtSync),
        1 => (0u8..40).prop_map(Op::KillAfter),
        1 => any::<u8>().prop_map(Op::FailSync),
        1 => (any::<u8>(), any::<u16>()).prop_map(|(kind, at)| Op::Damage { kind, at }),
        1 => any::<u8>().prop_map(Op::JumpIds),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES raises it for long runs.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        // Shrunk failures are saved beside this file, to be committed as regressions.
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))),
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_operation_sequences_match_the_model(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..120)) {
        if let Err(f) = run_ops(seed, &ops) {
            prop_assert!(false, "{}", f);
        }
    }
}

#[test]
fn fuzzer_byte_decoding_covers_every_operation() {
    let mut kinds = std::collections::HashSet::new();
    for b in 0..=255u8 {
        let op = Op::from_bytes([b, 3, 7]);
        kinds.insert(std::mem::discriminant(&op));
    }
    // Every kind but the unbounded kill used only by the every-sync-point runner.
    assert_eq!(kinds.len(), 11);
}
