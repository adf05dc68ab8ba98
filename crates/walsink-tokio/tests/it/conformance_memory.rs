//! The conformance suite run against in-memory async sinks, with and without a marker: the
//! suite itself must pass on a correct sink before target crates rely on it.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use walsink::{Epoch, EpochKey, SinkError};
use walsink_tokio::conformance::{run_all, Harness};
use walsink_tokio::{AsyncChunks, AsyncSink};

type Store = Arc<Mutex<Vec<(EpochKey, Vec<Vec<u8>>)>>>;

/// An in-memory target: a list of delivered batches, shared by every sink of the harness.
#[derive(Clone)]
struct MemoryAsyncSink {
    store: Store,
    marker: bool,
    /// A broken sink for the suite's own test: claims a marker but never finds one.
    forgetful: bool,
}

impl AsyncSink for MemoryAsyncSink {
    async fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut records = Vec::new();
        let mut chunks = AsyncChunks::new(epoch);
        while let Some(c) = chunks.next().await {
            let c = c.map_err(|e| SinkError::retryable(e.to_string()))?;
            records.extend(c.records().map(|r| r.data.to_vec()));
        }
        tokio::task::yield_now().await;
        self.store.lock().push((epoch.key().clone(), records));
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        self.marker
    }

    async fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(self.marker && !self.forgetful && self.store.lock().iter().any(|(k, _)| k == key))
    }
}

struct Memory {
    store: Store,
    marker: bool,
    forgetful: bool,
}

impl Harness for Memory {
    type Sink = MemoryAsyncSink;

    async fn sink(&self, _sink_id: &str) -> MemoryAsyncSink {
        MemoryAsyncSink {
            store: self.store.clone(),
            marker: self.marker,
            forgetful: self.forgetful,
        }
    }

    async fn read_back(&self, sink_id: &str, subtask: u32) -> Vec<Vec<u8>> {
        let store = self.store.lock();
        let mine = store
            .iter()
            .filter(|(k, _)| &*k.sink_id == sink_id && k.subtask == subtask);
        if self.marker {
            // A marker target holds what was applied, duplicates included.
            return mine.flat_map(|(_, r)| r.clone()).collect();
        }
        // Deduplicated by epoch key, as a target that keys writes by position would be.
        let mut by_key = BTreeMap::new();
        for (k, recs) in mine {
            by_key.entry(k.checkpoint).or_insert_with(|| recs.clone());
        }
        by_key.into_values().flatten().collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_marker_keeping_memory_sink_conforms() {
    run_all(&Memory {
        store: Default::default(),
        marker: true,
        forgetful: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotent_memory_sink_conforms() {
    run_all(&Memory {
        store: Default::default(),
        marker: false,
        forgetful: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[should_panic(expected = "a marker sink must report a delivered epoch as committed")]
async fn a_sink_that_loses_its_marker_fails_the_suite() {
    walsink_tokio::conformance::a_replay_after_a_crash_is_not_applied_twice(&Memory {
        store: Default::default(),
        marker: true,
        forgetful: true,
    })
    .await;
}
