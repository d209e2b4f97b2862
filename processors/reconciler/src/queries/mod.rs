//! The MySQL statements only the reconciler runs: the live buckets it walks, the held
//! reservations whose Redis records a full check reads, the shard leases of scheduled passes,
//! the differences they remember, and the inbox purge beside them. The views of a bucket that
//! a repair and a rebuild read too live in `stocksvr_store::bucket_views`.
//!
//! Every read takes a chunk of buckets at once (`IN (...)` with bound parameters), so a pass
//! costs a few statements per chunk, not per bucket.

pub mod buckets;
pub mod differences;
pub mod guards;
pub mod inbox;
pub mod shards;

pub use buckets::{BucketFilter, LiveBucket};

use sqlx::{MySql, QueryBuilder};
use stocksvr_store::one_off::in_list_of;

fn in_list<'a>(q: &mut QueryBuilder<'a, MySql>, buckets: &'a [String]) {
    in_list_of(q, buckets.iter().map(String::as_str));
}
