//! Flink's write-ahead-sink scenarios (`scenarios.rs` here, one body for both drivers) driven
//! by the committer thread and `deliver_ready`; the async committer runs the same bodies in
//! walsink-tokio's `tests/it/flink_scenarios.rs`.

// The scenario bodies reach the shared helpers as `super::common`, here and in walsink-tokio.
use crate::support as common;
mod scenarios;

use scenarios::{Driver, Running};
use std::sync::Arc;
use walsink::{Committer, MemorySink, Result, WalSink};

struct Thread;

impl Running for Committer {
    fn shutdown(self: Box<Self>) {
        Committer::shutdown(*self)
    }
}

impl Driver for Thread {
    fn deliver_ready(&self, wal: &Arc<WalSink>, sink: &mut MemorySink) -> Result<usize> {
        wal.deliver_ready(sink)
    }
    fn spawn(&self, wal: &Arc<WalSink>, sink: MemorySink) -> Result<Box<dyn Running>> {
        Ok(Box::new(wal.spawn_committer(sink)?))
    }
}

#[test]
fn ideal_circumstances() {
    scenarios::ideal_circumstances(&Thread);
}

#[test]
fn ideal_circumstances_on_real_disk_with_committer_thread() {
    scenarios::ideal_circumstances_on_real_disk_with_committer_thread(&Thread);
}

#[test]
fn missed_notification_is_covered_by_a_later_one() {
    scenarios::missed_notification_is_covered_by_a_later_one(&Thread);
}

#[test]
fn data_after_checkpoint_is_discarded_on_restore() {
    scenarios::data_after_checkpoint_is_discarded_on_restore(&Thread);
}

#[test]
fn restore_voids_sealed_epochs_above_the_restored_id() {
    scenarios::restore_voids_sealed_epochs_above_the_restored_id(&Thread);
}

#[test]
fn failing_is_committed_calls_lose_nothing() {
    scenarios::failing_is_committed_calls_lose_nothing(&Thread);
}

#[test]
fn failing_mark_committed_calls_lose_nothing() {
    scenarios::failing_mark_committed_calls_lose_nothing(&Thread);
}

#[test]
fn sink_failure_retries_with_backoff_without_reordering() {
    scenarios::sink_failure_retries_with_backoff_without_reordering(&Thread);
}

#[test]
fn a_failed_epoch_blocks_later_ones_and_a_high_water_mark_never_hides_it() {
    scenarios::a_failed_epoch_blocks_later_ones_and_a_high_water_mark_never_hides_it(&Thread);
}

#[test]
fn scale_down_one_process_delivers_the_pending_epochs_of_two_subtasks() {
    scenarios::scale_down_one_process_delivers_the_pending_epochs_of_two_subtasks(&Thread);
}

#[test]
fn opening_with_another_identity_is_refused() {
    scenarios::opening_with_another_identity_is_refused(&Thread);
}

#[test]
fn checkpoint_ids_must_strictly_increase() {
    scenarios::checkpoint_ids_must_strictly_increase(&Thread);
}
