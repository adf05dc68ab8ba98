//! Byte buffers kept for reuse.

use bytes::Bytes;
use parking_lot::Mutex;

/// Byte buffers kept for reuse, by the log's reads and by sinks that build large request
/// bodies. A large buffer allocated afresh is a fresh mapping: the kernel zeroes every page on
/// first write and unmaps it again on free, which can cost more than the work done in it. A
/// buffer comes back through [`BufferPool::give_back`] once nothing else refers to its bytes.
#[derive(Debug)]
pub struct BufferPool {
    spare: Mutex<Vec<Vec<u8>>>,
    keep: usize,
    max_capacity: usize,
}

impl BufferPool {
    /// A pool that keeps at most `keep` buffers, each of at most `max_capacity` bytes.
    pub fn new(keep: usize, max_capacity: usize) -> BufferPool {
        BufferPool {
            spare: Mutex::new(Vec::new()),
            keep,
            max_capacity,
        }
    }

    /// A kept buffer, or a new, empty one. A kept buffer still holds its old bytes (its length
    /// is what it was), so a reader that overwrites them need not zero it first; a writer
    /// clears it.
    pub fn take(&self) -> Vec<u8> {
        self.spare.lock().pop().unwrap_or_default()
    }

    /// Keeps `buf`'s memory for a later [`BufferPool::take`] if nothing else refers to its
    /// bytes, it is no larger than the pool keeps, and the pool has room; drops it otherwise.
    pub fn give_back(&self, buf: Bytes) {
        if let Ok(m) = buf.try_into_mut() {
            let mut spare = self.spare.lock();
            if spare.len() < self.keep && m.capacity() <= self.max_capacity {
                spare.push(Vec::from(m));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unshared_buffers_within_the_bounds_come_back() {
        let pool = BufferPool::new(1, 1024);
        let v = vec![7u8; 100];
        let at = v.as_ptr();
        let b = Bytes::from(v);
        let held = b.clone();
        pool.give_back(b);
        assert!(pool.take().is_empty(), "a shared buffer is not taken back");
        pool.give_back(held);
        let again = pool.take();
        assert_eq!(
            (again.as_ptr(), again.len()),
            (at, 100),
            "the same memory, bytes kept"
        );
        pool.give_back(Bytes::from(vec![0u8; 2048]));
        assert_eq!(pool.take().capacity(), 0, "larger than the pool keeps");
        pool.give_back(Bytes::from(vec![1u8; 10]));
        pool.give_back(Bytes::from(vec![2u8; 10]));
        assert_eq!(pool.take(), vec![1u8; 10], "one kept at most");
        assert!(pool.take().is_empty());
    }
}
