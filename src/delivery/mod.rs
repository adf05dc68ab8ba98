//! Delivery: the epoch catalog, the sink contract, the commit store, and the committer that
//! drives sinks in checkpoint order.

pub(crate) mod catalog;
pub(crate) mod commit_store;
pub(crate) mod committer;
pub(crate) mod dead_letter;
pub(crate) mod deliverer;
pub(crate) mod log;
pub(crate) mod owner;
pub(crate) mod sink;
