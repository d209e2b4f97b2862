//! The store's clock: the one "now" every repository writes into its DATETIME(3) columns.

use chrono::{NaiveDateTime, SubsecRound, Utc};

/// Now, to the millisecond the DATETIME(3) columns keep: a row built in memory after a
/// write (the Try's reply) then equals the row read back.
pub fn now() -> NaiveDateTime {
    Utc::now().naive_utc().trunc_subsecs(3)
}
