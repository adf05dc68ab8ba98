//! An in-memory sink for tests and examples.

use crate::{Epoch, EpochKey, Sink, SinkError};
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Debug, Default)]
struct Inner {
    batches: Vec<(EpochKey, Vec<Vec<u8>>)>,
    fail_next: u32,
    fail_forever: bool,
    stores_marker: bool,
    deliveries: u64,
}

/// Keeps delivered epochs in memory. Clones share the same contents, so a test can keep one
/// clone while the committer owns another.
///
/// It can be told to fail ([`MemorySink::fail_next`], [`MemorySink::set_failing`]) and to act
/// as a sink that stores its own commit marker ([`MemorySink::with_marker`]).
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    inner: Arc<Mutex<Inner>>,
}

impl MemorySink {
    /// An empty sink without its own marker (at-least-once).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty sink that stores the commit marker with the data (exactly-once).
    pub fn with_marker() -> Self {
        let s = Self::default();
        s.inner.lock().stores_marker = true;
        s
    }

    /// Makes the next `n` deliveries fail with a retryable error.
    pub fn fail_next(&self, n: u32) {
        self.inner.lock().fail_next = n;
    }

    /// Makes every delivery fail until called with `false`.
    pub fn set_failing(&self, failing: bool) {
        self.inner.lock().fail_forever = failing;
    }

    /// All delivered records, in delivery order (duplicates included).
    pub fn records(&self) -> Vec<Vec<u8>> {
        self.inner
            .lock()
            .batches
            .iter()
            .flat_map(|(_, r)| r.iter().cloned())
            .collect()
    }

    /// Checkpoint ids of the delivered epochs, in delivery order.
    pub fn checkpoints(&self) -> Vec<u64> {
        self.inner
            .lock()
            .batches
            .iter()
            .map(|(k, _)| k.checkpoint)
            .collect()
    }

    /// Delivered epochs with their keys.
    pub fn batches(&self) -> Vec<(EpochKey, Vec<Vec<u8>>)> {
        self.inner.lock().batches.clone()
    }

    /// Number of `deliver` calls, failed ones included.
    pub fn deliveries(&self) -> u64 {
        self.inner.lock().deliveries
    }
}

impl Sink for MemorySink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let mut s = self.inner.lock();
        s.deliveries += 1;
        if s.fail_forever {
            return Err(SinkError::retryable("memory sink told to fail"));
        }
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err(SinkError::retryable("memory sink told to fail"));
        }
        let records = epoch
            .records()
            .map(|r| r.map(|r| r.data.to_vec()))
            .collect::<crate::Result<_>>()?;
        s.batches.push((epoch.key().clone(), records));
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        self.inner.lock().stores_marker
    }

    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        Ok(self.inner.lock().batches.iter().any(|(k, _)| k == key))
    }
}
