//! The shared conformance suite against the local Redis, once per mode: list (RPUSH),
//! stream (XADD) and hash (HSET of `FIELD<TAB>VALUE` records).

use crate::common::RedisHarness;
use walsink_redis::Mode;
use walsink_tokio::conformance::run_all;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn list_mode_conforms() {
    run_all(&RedisHarness(Mode::List)).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn stream_mode_conforms() {
    run_all(&RedisHarness(Mode::Stream)).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(servers),
    ignore = "needs WALSINK_TEST_SERVERS=1 and a local Redis"
)]
async fn hash_mode_conforms() {
    run_all(&RedisHarness(Mode::Hash)).await;
}
