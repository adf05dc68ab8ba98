//! Flink's write-ahead-sink scenarios (the core's `tests/it/flink_scenarios/scenarios.rs`, one
//! body for both drivers) driven by the async committer task and async `deliver_ready`.

#[path = "../../../../tests/it/support/logs.rs"]
mod common;
#[path = "../../../../tests/it/flink_scenarios/scenarios.rs"]
mod scenarios;

use scenarios::{Driver, Running};
use std::sync::Arc;
use std::time::Duration;
use walsink::{Epoch, EpochKey, MemorySink, Result, Sink, SinkError, WalSink};
use walsink_tokio::{AsyncCommitter, AsyncSink};

/// The memory sink behind the async trait (its state is shared between clones).
struct Mem(MemorySink);

impl AsyncSink for Mem {
    async fn deliver(&mut self, epoch: &Epoch) -> std::result::Result<(), SinkError> {
        tokio::task::yield_now().await;
        self.0.deliver(epoch)
    }
    fn stores_marker(&self) -> bool {
        self.0.stores_marker()
    }
    async fn is_committed(&mut self, key: &EpochKey) -> std::result::Result<bool, SinkError> {
        self.0.is_committed(key)
    }
}

struct Async(tokio::runtime::Runtime);

impl Async {
    fn new() -> Self {
        Async(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime"),
        )
    }
}

struct RunningTask {
    committer: AsyncCommitter,
    rt: tokio::runtime::Handle,
}

impl Running for RunningTask {
    fn shutdown(self: Box<Self>) {
        let report = self
            .rt
            .block_on(self.committer.shutdown(Duration::from_secs(30)));
        assert!(report.clean, "{report:?}");
    }
}

impl Driver for Async {
    fn deliver_ready(&self, wal: &Arc<WalSink>, sink: &mut MemorySink) -> Result<usize> {
        let mut s = Mem(sink.clone());
        self.0.block_on(walsink_tokio::deliver_ready(wal, &mut s))
    }
    fn spawn(&self, wal: &Arc<WalSink>, sink: MemorySink) -> Result<Box<dyn Running>> {
        let _guard = self.0.enter();
        let committer = walsink_tokio::spawn_committer(wal, Mem(sink))?;
        Ok(Box::new(RunningTask {
            committer,
            rt: self.0.handle().clone(),
        }))
    }
}

#[test]
fn ideal_circumstances() {
    scenarios::ideal_circumstances(&Async::new());
}

#[test]
fn ideal_circumstances_on_real_disk_with_committer_thread() {
    scenarios::ideal_circumstances_on_real_disk_with_committer_thread(&Async::new());
}

#[test]
fn missed_notification_is_covered_by_a_later_one() {
    scenarios::missed_notification_is_covered_by_a_later_one(&Async::new());
}

#[test]
fn data_after_checkpoint_is_discarded_on_restore() {
    scenarios::data_after_checkpoint_is_discarded_on_restore(&Async::new());
}

#[test]
fn restore_voids_sealed_epochs_above_the_restored_id() {
    scenarios::restore_voids_sealed_epochs_above_the_restored_id(&Async::new());
}

#[test]
fn failing_is_committed_calls_lose_nothing() {
    scenarios::failing_is_committed_calls_lose_nothing(&Async::new());
}

#[test]
fn failing_mark_committed_calls_lose_nothing() {
    scenarios::failing_mark_committed_calls_lose_nothing(&Async::new());
}

#[test]
fn sink_failure_retries_with_backoff_without_reordering() {
    scenarios::sink_failure_retries_with_backoff_without_reordering(&Async::new());
}

#[test]
fn a_failed_epoch_blocks_later_ones_and_a_high_water_mark_never_hides_it() {
    scenarios::a_failed_epoch_blocks_later_ones_and_a_high_water_mark_never_hides_it(&Async::new());
}

#[test]
fn scale_down_one_process_delivers_the_pending_epochs_of_two_subtasks() {
    scenarios::scale_down_one_process_delivers_the_pending_epochs_of_two_subtasks(&Async::new());
}

#[test]
fn opening_with_another_identity_is_refused() {
    scenarios::opening_with_another_identity_is_refused(&Async::new());
}

#[test]
fn checkpoint_ids_must_strictly_increase() {
    scenarios::checkpoint_ids_must_strictly_increase(&Async::new());
}
