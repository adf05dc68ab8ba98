//! XA transaction ids: deterministic, so a restarted sink finds its prepared transactions in
//! `XA RECOVER` again and tells which epoch each holds.
//!
//! An xid is `(gtrid, bqual, formatID)`:
//! - `gtrid` = `walsink:{h}:{subtask}:{checkpoint}`, where `h` is the xxh3 hash of the sink id
//!   in 16 hex digits (a gtrid holds at most 64 bytes, and a sink id may be longer);
//! - `bqual` = the epoch's [`fingerprint`] in 16 hex digits, which tells a prepared
//!   transaction of this very epoch from one of an earlier epoch that had the same
//!   checkpoint id (a log that lost its checkpoints and numbered new ones the same way);
//! - `formatID` = [`FORMAT_ID`], so walsink's xids are told from other programs' at once.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::fmt;
use walsink::{Epoch, EpochKey};

/// The `formatID` of walsink's xids (`0x5753`, "WS").
pub const FORMAT_ID: u32 = 0x5753;

/// The fingerprint of an epoch: xxh3 of its metadata, record count and byte count.
pub fn fingerprint(epoch: &Epoch) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(epoch.metadata());
    h.update(&epoch.len().to_le_bytes());
    h.update(&epoch.bytes().to_le_bytes());
    h.digest()
}

/// The gtrid prefix of the XA transactions of `(sink_id, subtask)`.
pub fn gtrid_prefix(sink_id: &str, subtask: u32) -> String {
    format!(
        "walsink:{:016x}:{subtask}:",
        xxhash_rust::xxh3::xxh3_64(sink_id.as_bytes())
    )
}

/// One of walsink's XA transaction ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// The global transaction id (`walsink:{hash}:{subtask}:{checkpoint}`).
    pub gtrid: String,
    /// The branch qualifier (the fingerprint in hex).
    pub bqual: String,
    /// The checkpoint it holds.
    pub checkpoint: u64,
    /// The fingerprint of the epoch it holds.
    pub fingerprint: u64,
}

impl Xid {
    /// The xid of epoch `key` with fingerprint `fp`.
    pub fn new(key: &EpochKey, fp: u64) -> Xid {
        Xid {
            gtrid: format!(
                "{}{}",
                gtrid_prefix(&key.sink_id, key.subtask),
                key.checkpoint
            ),
            bqual: format!("{fp:016x}"),
            checkpoint: key.checkpoint,
            fingerprint: fp,
        }
    }

    /// The xid as the XA statements take it: `'gtrid','bqual',formatID`.
    pub fn sql(&self) -> String {
        // Both parts are ASCII letters, digits and ':' only: no quoting needed beyond '…'.
        format!("'{}','{}',{FORMAT_ID}", self.gtrid, self.bqual)
    }

    /// Whether this xid is one of `(sink_id, subtask)`'s.
    pub fn belongs_to(&self, sink_id: &str, subtask: u32) -> bool {
        self.gtrid.starts_with(&gtrid_prefix(sink_id, subtask))
    }

    /// An xid from one row of `XA RECOVER`, if it is walsink's.
    fn from_recover(format_id: i64, gtrid_len: usize, data: &[u8]) -> Option<Xid> {
        if format_id != i64::from(FORMAT_ID) || gtrid_len > data.len() {
            return None;
        }
        let gtrid = std::str::from_utf8(&data[..gtrid_len]).ok()?;
        let bqual = std::str::from_utf8(&data[gtrid_len..]).ok()?;
        let rest = gtrid.strip_prefix("walsink:")?;
        let checkpoint = rest.rsplit(':').next()?.parse().ok()?;
        let fingerprint = u64::from_str_radix(bqual, 16).ok()?;
        Some(Xid {
            gtrid: gtrid.to_string(),
            bqual: bqual.to_string(),
            checkpoint,
            fingerprint,
        })
    }
}

impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}','{}',{FORMAT_ID}", self.gtrid, self.bqual)
    }
}

/// Every prepared XA transaction of walsink's on the server (`XA RECOVER`), any sink's.
pub(crate) async fn recover(c: &mut Conn) -> Result<Vec<Xid>, mysql_async::Error> {
    let rows: Vec<(i64, i64, i64, Vec<u8>)> = c.query("XA RECOVER").await?;
    Ok(rows
        .into_iter()
        .filter_map(|(f, g, _b, data)| Xid::from_recover(f, usize::try_from(g).ok()?, &data))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_are_deterministic_short_and_parse_back() {
        let key = EpochKey {
            sink_id: "a-sink-id-that-is-much-longer-than-sixty-four-bytes-of-gtrid-would-hold"
                .into(),
            subtask: 4_000_000_000,
            checkpoint: u64::MAX,
        };
        let x = Xid::new(&key, 0xdead_beef);
        assert_eq!(x, Xid::new(&key, 0xdead_beef));
        assert!(x.gtrid.len() <= 64, "{}", x.gtrid);
        assert!(x.belongs_to(&key.sink_id, key.subtask));
        assert!(!x.belongs_to(&key.sink_id, 1));
        assert!(!x.belongs_to("other", key.subtask));
        let mut data = x.gtrid.clone().into_bytes();
        data.extend_from_slice(x.bqual.as_bytes());
        let back = Xid::from_recover(i64::from(FORMAT_ID), x.gtrid.len(), &data).unwrap();
        assert_eq!(back, x);
        assert!(Xid::from_recover(1, x.gtrid.len(), &data).is_none());
        assert!(Xid::from_recover(i64::from(FORMAT_ID), 3, b"abcdef").is_none());
    }
}
