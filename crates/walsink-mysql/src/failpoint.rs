//! Failpoints at the dangerous points of a delivery (feature `failpoints`, for the CLI's
//! kill tests): `WALSINK_MYSQL_FAILPOINT=NAME@N` aborts the process the `N`th time (from 1) a
//! delivery of this process reaches `NAME`:
//!
//! - `after-insert`: the rows are inserted, the transaction is open (before COMMIT or XA END);
//! - `after-prepare`: XA mode, the transaction is prepared (before XA COMMIT);
//! - `after-commit`: the epoch is committed in the target, and walsink's local commit store
//!   does not know yet.
//!
//! Without the feature every call compiles to nothing.

#[cfg(feature = "failpoints")]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    static HITS: AtomicU64 = AtomicU64::new(0);

    fn spec() -> &'static Option<(String, u64)> {
        static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
        SPEC.get_or_init(|| {
            let v = std::env::var("WALSINK_MYSQL_FAILPOINT").ok()?;
            let (name, n) = v.split_once('@').unwrap_or((&v, "1"));
            Some((name.to_string(), n.parse().ok()?))
        })
    }

    pub fn hit(name: &str) {
        if let Some((n, at)) = spec() {
            if n == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *at {
                eprintln!("failpoint {name}@{at}: aborting the process");
                std::process::abort();
            }
        }
    }
}

#[cfg(not(feature = "failpoints"))]
mod imp {
    #[inline(always)]
    pub fn hit(_name: &str) {}
}

pub(crate) use imp::hit;
