//! Typed records: [`TypedWal`] appends values of a `serde` type through a [`Codec`], and
//! [`Codec::decode_record`] reads them back on delivery, with a [`DecodeError`] naming the
//! record's position when one does not decode.
//!
//! # Evolving the record type
//! The log keeps records for as long as their checkpoint is pending, so a program may read
//! records written by its previous version.
//! - [`Json`] is self-describing: add fields with `#[serde(default)]`, never change the
//!   meaning of an existing one, and old records keep decoding.
//! - [`Postcard`] is compact and *not* self-describing: a record is only its field values in
//!   order, so adding, removing or reordering fields breaks old records. Use a versioned
//!   envelope: make the record type an enum with one variant per schema version
//!   (`enum Event { V1(EventV1), V2(EventV2) }`) and only ever add variants at the end;
//!   postcard writes the variant index first, so every old record still decodes, into its
//!   own version, and the program upgrades it in one place. A record from a *newer* version
//!   (a rollback) fails with a [`DecodeError`] instead of being misread.
//! - Either way, the checkpoint metadata is a good place for a schema version of the whole
//!   epoch, when a program wants to check it before decoding.

use crate::AsyncWal;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;
use walsink::{Record, RecordPosition, SinkError};

/// How values become record bytes and back.
pub trait Codec: Send + Sync + 'static {
    /// The codec's name, for errors.
    const NAME: &'static str;

    /// Appends the encoding of `value` to `out`.
    fn encode<T: Serialize>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String>;

    /// Decodes one value from a whole record.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String>;

    /// Decodes `record`, naming its position on failure.
    fn decode_record<T: DeserializeOwned>(&self, record: &Record) -> Result<T, DecodeError> {
        self.decode(&record.data).map_err(|message| DecodeError {
            position: record.position,
            codec: Self::NAME,
            message,
        })
    }
}

/// Compact binary records with `postcard` (not self-describing; see the module docs on
/// evolving the type).
#[derive(Debug, Clone, Copy, Default)]
pub struct Postcard;

impl Codec for Postcard {
    const NAME: &'static str = "postcard";

    fn encode<T: Serialize>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        let taken = std::mem::take(out);
        *out = postcard::to_extend(value, taken).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String> {
        let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
        if !rest.is_empty() {
            return Err(format!(
                "{} bytes left over after the value (a record of another type or version?)",
                rest.len()
            ));
        }
        Ok(value)
    }
}

/// JSON records with `serde_json` (self-describing, larger, readable with `walsink dump`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    const NAME: &'static str = "json";

    fn encode<T: Serialize>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        serde_json::to_writer(out, value).map_err(|e| e.to_string())
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// A record that did not decode: where it is and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The record's checkpoint and index in its epoch.
    pub position: RecordPosition,
    /// The codec that failed.
    pub codec: &'static str,
    /// The codec's message.
    pub message: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "record {} of checkpoint {} does not decode as {}: {}",
            self.position.index, self.position.checkpoint, self.codec, self.message
        )
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for SinkError {
    /// A record that does not decode now never will: a permanent error (the epoch stays in
    /// the log until an operator acts).
    fn from(e: DecodeError) -> SinkError {
        SinkError::permanent(e.to_string())
    }
}

/// An [`AsyncWal`] whose records are values of `T`, encoded with codec `C`.
///
/// # Example
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> walsink::Result<()> {
/// use serde::{Deserialize, Serialize};
/// use walsink_tokio::{AsyncWal, Codec, Postcard, TypedWal};
///
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// enum Event {
///     V1 { user: u64, amount: i64 },
/// }
///
/// let dir = tempfile::tempdir().unwrap();
/// let (wal, _) = AsyncWal::open(dir.path(), walsink::Options::new("typed")).await?;
/// let typed = TypedWal::<Event, _>::new(wal.clone(), Postcard);
/// typed.append(&Event::V1 { user: 7, amount: -3 }).await?;
/// wal.checkpoint(1, b"").await?;
/// wal.checkpoint_complete(1)?;
/// let mut sink = walsink::MemorySink::new();
/// wal.blocking().deliver_ready(&mut sink)?;
/// let bytes = &sink.records()[0];
/// assert_eq!(Postcard.decode::<Event>(bytes).unwrap(), Event::V1 { user: 7, amount: -3 });
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TypedWal<T, C> {
    wal: AsyncWal,
    codec: C,
    _t: PhantomData<fn(T)>,
}

impl<T: Serialize, C: Codec> TypedWal<T, C> {
    /// Typed appends to `wal` with `codec`.
    pub fn new(wal: AsyncWal, codec: C) -> Self {
        TypedWal {
            wal,
            codec,
            _t: PhantomData,
        }
    }

    /// The untyped handle (checkpoints, restores, delivery).
    pub fn wal(&self) -> &AsyncWal {
        &self.wal
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// Appends one value; see [`AsyncWal::append`] (and its cancel safety).
    pub async fn append(&self, value: &T) -> walsink::Result<()> {
        self.append_batch(std::slice::from_ref(value)).await
    }

    /// Appends values in order, all or none; see [`AsyncWal::append_batch`] (and its
    /// cancel safety). A value the codec cannot encode fails the batch with
    /// `InvalidOperation` naming its index in the batch.
    pub async fn append_batch(&self, values: &[T]) -> walsink::Result<()> {
        let mut buf = Vec::new();
        let mut ends = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            self.codec.encode(v, &mut buf).map_err(|e| {
                walsink::Error::invalid_op(format!(
                    "value {i} of the batch does not encode as {}: {e}",
                    C::NAME
                ))
            })?;
            ends.push(buf.len());
        }
        let mut start = 0;
        let records: Vec<&[u8]> = ends
            .iter()
            .map(|&end| {
                let r = &buf[start..end];
                start = end;
                r
            })
            .collect();
        self.wal.append_batch(&records).await
    }
}
