//! The log itself: the on-disk format, segments and how they are written, scanning and
//! recovering a directory, reading epochs back, and the read-only checks (`verify`, `dump`).

pub(crate) mod files;
pub mod format;
pub(crate) mod halves;
pub(crate) mod layout;
pub(crate) mod reader;
pub(crate) mod recover;
pub(crate) mod scan;
pub(crate) mod segment;
pub(crate) mod segment_dump;
pub(crate) mod verify;
pub(crate) mod window;
