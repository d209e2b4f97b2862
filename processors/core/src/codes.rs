//! Every code that MariaDB or Redis stores, declared once.
//!
//! A status column holds a TINYINT and a Redis hash holds a name; when the same number is
//! also spelled in SQL or compared by hand somewhere else, the two drift apart silently. So
//! each stored code is an enum here, with `code()`/`from_code()` (and `name()`/`from_name()`
//! where a name is what is stored or shown), and SQL binds the codes through
//! [`placeholders`] and [`StoredCode::codes`] instead of spelling them. A test of the
//! repository (`processors/stocksvr/tests/tree.rs`) fails when a literal code reappears in
//! SQL.
//!
//! The behaviour that belongs to a code (the state machine's edges, what a bucket state
//! accepts) stays with its domain module; this module only says what is stored.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A code stored in a database column or a Redis field.
pub trait StoredCode: Copy + Eq + 'static {
    /// The stored form: an integer for a TINYINT column, a `&str` for a Redis field.
    type Code: Copy + Eq + fmt::Debug;
    /// Where it is stored, for error messages (`inventory_reservation.status`).
    const STORED_IN: &'static str;
    /// Every value, in code order.
    const ALL: &'static [Self];

    fn stored(self) -> Self::Code;

    /// The value stored as `code`, if any.
    fn from_stored(code: Self::Code) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.stored() == code)
    }

    /// The codes of `values` in order, for binding after [`placeholders`]`(values.len())`.
    fn codes(values: &[Self]) -> Vec<Self::Code> {
        values.iter().map(|v| v.stored()).collect()
    }
}

/// `?, ?, ?` for an `IN (...)` of `n` bound codes. Panics on `n == 0` (an empty `IN ()` is
/// a syntax error, and a caller passing no codes is a bug).
pub fn placeholders(n: usize) -> String {
    assert!(n > 0, "an IN list needs at least one code");
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// A code that is not one of its column's: the row was written by another version or by
/// hand. Carried by the readers that refuse such a row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown code {code} in {stored_in}")]
pub struct UnknownCode {
    pub stored_in: &'static str,
    pub code: String,
}

/// `from_code` that names the column when the code is unknown.
pub fn decode<T: StoredCode>(code: T::Code) -> Result<T, UnknownCode> {
    T::from_stored(code).ok_or_else(|| UnknownCode {
        stored_in: T::STORED_IN,
        code: format!("{code:?}"),
    })
}

/// Serde reads and writes a code by its `name()`, so JSON shows what logs and operators see.
macro_rules! serde_by_name {
    ($name:ident) => {
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::from_name(&name).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "unknown {} {name:?}",
                        <$name as StoredCode>::STORED_IN
                    ))
                })
            }
        }
    };
}

/// Declares an enum stored as a TINYINT: `code()`/`from_code()`, the upper-case `name()`
/// (what logs, the CLI and the admin API show) and `from_name()`, `ALL` and `Display`.
macro_rules! int_codes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident in $stored:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal => $label:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        // The discriminant is the code, so an `as` cast anywhere still gives the stored value.
        #[repr($repr)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $code, )+
        }

        impl $name {
            pub const ALL: [$name; [$($code),+].len()] = [$($name::$variant),+];

            pub const fn code(self) -> $repr {
                match self { $( $name::$variant => $code, )+ }
            }

            pub const fn from_code(code: $repr) -> Option<Self> {
                match code { $( $code => Some($name::$variant), )+ _ => None }
            }

            pub const fn name(self) -> &'static str {
                match self { $( $name::$variant => $label, )+ }
            }

            /// The value named exactly `name`.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|v| v.name() == name)
            }

            /// The value named `name` in any case, as operators type it (`--status dead`).
            pub fn parse(name: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|v| v.name().eq_ignore_ascii_case(name))
            }
        }

        impl StoredCode for $name {
            type Code = $repr;
            const STORED_IN: &'static str = $stored;
            const ALL: &'static [Self] = &$name::ALL;
            fn stored(self) -> $repr {
                self.code()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        serde_by_name!($name);

        /// Operator input (`--status dead`): any case; the error lists the names.
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::parse(s).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                    format!("unknown status {s:?} ({})", names.join(", "))
                })
            }
        }
    };
}

/// Declares an enum stored (or returned by a script) as a string: `name()`/`from_name()`.
macro_rules! name_codes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $stored:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $label:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            pub const ALL: [$name; [$($label),+].len()] = [$($name::$variant),+];

            pub const fn name(self) -> &'static str {
                match self { $( $name::$variant => $label, )+ }
            }

            /// Exact match: these names are written by code (scripts, this crate), not typed.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|v| v.name() == name)
            }
        }

        impl StoredCode for $name {
            type Code = &'static str;
            const STORED_IN: &'static str = $stored;
            const ALL: &'static [Self] = &$name::ALL;
            fn stored(self) -> &'static str {
                self.name()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        serde_by_name!($name);
    };
}

// ---- MariaDB: TINYINT columns ---------------------------------------------------------------

int_codes! {
    /// `inventory_reservation.status` (and `resume_status`). The edges between them are the
    /// state machine of [`crate::reservation`].
    pub enum ReservationStatus: u8 in "inventory_reservation.status" {
        /// Row inserted, Try not known to have run in Redis.
        Preparing = 10 => "PREPARING",
        Reserved = 20 => "RESERVED",
        /// Scheduled order created; stock stays reserved until `processing_time`. No Cancel.
        CreatedReserved = 25 => "CREATED_RESERVED",
        Confirming = 30 => "CONFIRMING",
        /// Not terminal: a created order can still be refunded.
        Confirmed = 40 => "CONFIRMED",
        Canceling = 50 => "CANCELING",
        Canceled = 60 => "CANCELED",
        Rejected = 70 => "REJECTED",
        Refunding = 80 => "REFUNDING",
        Refunded = 90 => "REFUNDED",
    }
}

int_codes! {
    /// `inventory_reservation.sync_status`: has the MySQL projection caught up with the Redis
    /// version this reservation's last step produced?
    pub enum SyncStatus: u8 in "inventory_reservation.sync_status" {
        /// A step finished in Redis; its stock-change event is not booked yet.
        Pending = 10 => "PENDING",
        /// The projector booked the version the row expects.
        Synced = 20 => "SYNCED",
        Retry = 30 => "RETRY",
        Dead = 40 => "DEAD",
    }
}

int_codes! {
    /// `inventory_refund.status`: one refund request's progress.
    pub enum RefundStatus: u8 in "inventory_refund.status" {
        InProgress = 10 => "IN_PROGRESS",
        Done = 20 => "DONE",
        /// Refused by Redis as more than held; nothing moved.
        Refused = 30 => "REFUSED",
    }
}

int_codes! {
    /// `dish_stock_baseline.bucket_status`: OPEN -> CLOSED -> ARCHIVED (docs/design.md,
    /// bucket lifecycle). The name is also the `state` field of the Redis stock hash.
    pub enum BucketState: u8 in "dish_stock_baseline.bucket_status" {
        /// Takes new Trys; existing reservations complete.
        Open = 10 => "OPEN",
        /// The day is over: no new Try, but existing reservations still Confirm, Cancel, Refund.
        Closed = 20 => "CLOSED",
        /// No unfinished reservation is left; the Redis keys are on their way out.
        Archived = 30 => "ARCHIVED",
    }
}

int_codes! {
    /// `dish_stock_baseline.stock_status`: a merchant can switch a dish's stock off for the
    /// day; a disabled bucket refuses Trys.
    pub enum StockStatus: i8 in "dish_stock_baseline.stock_status" {
        Enabled = 1 => "ENABLED",
        Disabled = 2 => "DISABLED",
    }
}

int_codes! {
    /// `inventory_operation_wal.action`: the stock operations that touch Redis without a
    /// reservation.
    pub enum WalAction: i8 in "inventory_operation_wal.action" {
        InitBucket = 1 => "INIT_BUCKET",
        Adjust = 2 => "ADJUST",
        /// A versioned repair by the reconciler.
        Repair = 3 => "REPAIR",
        Close = 4 => "CLOSE",
        Archive = 5 => "ARCHIVE",
        /// Recreate a lost bucket from MySQL.
        Rebuild = 6 => "REBUILD",
    }
}

int_codes! {
    /// `inventory_operation_wal.status`.
    pub enum WalStatus: i8 in "inventory_operation_wal.status" {
        /// Written, not started.
        Init = 10 => "INIT",
        /// A worker holds the lease and runs (or ran) the Lua step.
        Executing = 20 => "EXECUTING",
        Succeeded = 30 => "SUCCEEDED",
        /// Failed; due again at `next_retry_at`.
        Retry = 40 => "RETRY",
        /// Retries exhausted or a permanent refusal: alerted, waits for an operator.
        Dead = 50 => "DEAD",
    }
}

int_codes! {
    /// `inventory_outbox.status`.
    pub enum OutboxStatus: i8 in "inventory_outbox.status" {
        /// Written by the local transaction. Stays so when the leader's scan publishes it: the
        /// row is sent once its id is at or below the relay's high-water mark.
        Pending = 10 => "PENDING",
        /// Claimed by the retry path until `next_retry_at` (the lease expiry).
        Sending = 20 => "SENDING",
        /// Acknowledged by the broker after a retry (the scan does not write this).
        Sent = 30 => "SENT",
        /// A publish failed; tried again from `next_retry_at`.
        Retry = 40 => "RETRY",
    }
}

int_codes! {
    /// `inventory_dead_letter.status`: where a parked dead letter stands.
    /// The names are lower case: that is how the admin API and `stocksvr dlq` show them.
    pub enum DeadLetterStatus: i8 in "inventory_dead_letter.status" {
        Parked = 10 => "parked",
        Replayed = 20 => "replayed",
        Discarded = 30 => "discarded",
    }
}

int_codes! {
    /// `inventory_deferred_event.status`: an order event parked until it can apply.
    pub enum DeferredStatus: u8 in "inventory_deferred_event.status" {
        Waiting = 10 => "WAITING",
        Applied = 20 => "APPLIED",
        /// Settled by a conflict report instead of a change (it can never apply now).
        Reported = 30 => "REPORTED",
    }
}

int_codes! {
    /// `inventory_reconcile_difference.status`.
    pub enum DifferenceStatus: i8 in "inventory_reconcile_difference.status" {
        /// Seen once; a second pass must see it again before it is believed.
        Suspected = 10 => "SUSPECTED",
        Confirmed = 20 => "CONFIRMED",
        Resolved = 30 => "RESOLVED",
    }
}

int_codes! {
    /// `inventory_ledger.action`: what booked the row.
    pub enum LedgerAction: i8 in "inventory_ledger.action" {
        Init = 1 => "INIT",
        Try = 2 => "TRY",
        Confirm = 3 => "CONFIRM",
        Cancel = 4 => "CANCEL",
        Adjust = 5 => "ADJUST",
        Refund = 6 => "REFUND",
        /// A versioned repair by the reconciler.
        Repair = 7 => "REPAIR",
        /// A lost bucket recreated from MySQL.
        Rebuild = 8 => "REBUILD",
    }
}

impl From<crate::events::StockAction> for LedgerAction {
    fn from(action: crate::events::StockAction) -> Self {
        use crate::events::StockAction;
        match action {
            StockAction::Try => LedgerAction::Try,
            StockAction::Confirm => LedgerAction::Confirm,
            StockAction::Cancel => LedgerAction::Cancel,
            StockAction::Refund => LedgerAction::Refund,
        }
    }
}

// ---- Redis: strings the scripts store or return ---------------------------------------------

name_codes! {
    /// Result code of one Lua step, as the scripts return it and record it under the
    /// operation id.
    pub enum OpCode in "Lua reply code" {
        Succeeded => "SUCCEEDED",
        /// Try only: fewer units available than asked; nothing held, no fence written.
        Insufficient => "INSUFFICIENT",
        /// Try only: the fence is already CANCELED/CONFIRMED/REFUNDED (anti-hanging).
        Fenced => "FENCED",
        /// The fence is in a phase this step cannot leave (e.g. Cancel after CONFIRMED).
        Conflict => "CONFLICT",
        /// Refund only: more units than the reservation still holds; nothing moved.
        OverRefund => "OVER_REFUND",
        /// Arguments the script refuses (zero quantity, negative total). Never recorded, like a
        /// script error, so a corrected call with the same id is not locked out.
        Invalid => "INVALID",
        /// The bucket's stock hash does not exist. Not recorded: the same operation works after
        /// the (lazy) init.
        BucketMissing => "BUCKET_MISSING",
        /// A Try on a bucket that is not OPEN, or an adjust of an ARCHIVED one. Not recorded.
        BucketClosed => "BUCKET_CLOSED",
    }
}

name_codes! {
    /// Phase of the per-reservation fence `inv:{tag}:reservation:<id>`.
    pub enum FencePhase in "reservation fence phase" {
        /// No fence key: the Try never reached Redis (or was refused as INSUFFICIENT).
        None => "NONE",
        Reserved => "RESERVED",
        Confirmed => "CONFIRMED",
        Canceled => "CANCELED",
        Refunded => "REFUNDED",
    }
}

name_codes! {
    /// `inventory_operation_wal.result_payload` `$.effect` of an init, a repair or a rebuild:
    /// what the step did, read back by the reconciler and the operator views.
    pub enum WalEffect in "inventory_operation_wal.result_payload.effect" {
        /// An init created the bucket in Redis: its event books it (the reconciler counts
        /// only these as built).
        Initialized => "INITIALIZED",
        /// An init found the bucket already in Redis: nothing written, nothing to book.
        Unchanged => "UNCHANGED",
        /// The repair script moved the numbers to the target at the expected version.
        Repaired => "REPAIRED",
        /// Something ran since the numbers were computed: nothing written.
        VersionChanged => "VERSION_CHANGED",
        BucketMissing => "BUCKET_MISSING",
        /// A lost bucket was recreated from MySQL.
        Rebuilt => "REBUILT",
    }
}

name_codes! {
    /// `inventory_reservation.reject_reason`: why a Try was REJECTED, also the
    /// InventoryRejected event's `reason_code`.
    pub enum RejectReason in "inventory_reservation.reject_reason" {
        /// Redis had fewer units available than the Try asked for.
        InsufficientStock => "INSUFFICIENT_STOCK",
        /// The bucket's day was closed for new Trys before the Try ran.
        BucketClosed => "BUCKET_CLOSED",
        /// The order failed (OrderCreatedFailed) before its Try reached MySQL.
        OrderFailed => "ORDER_FAILED",
    }
}

/// Every integer code as `(column, [(name, code)])`, in declaration order: what
/// `processors/core/stored-codes.json` holds for the harnesses (Python), so they read the one
/// table instead of copying the numbers (a test keeps the file equal to this).
pub fn integer_table() -> Vec<(&'static str, Vec<(&'static str, i64)>)> {
    fn of<T: StoredCode>(
        names: impl Fn(T) -> &'static str,
    ) -> (&'static str, Vec<(&'static str, i64)>)
    where
        T::Code: Into<i64>,
    {
        (
            T::STORED_IN,
            T::ALL
                .iter()
                .map(|v| (names(*v), v.stored().into()))
                .collect(),
        )
    }
    vec![
        of::<ReservationStatus>(ReservationStatus::name),
        of::<SyncStatus>(SyncStatus::name),
        of::<RefundStatus>(RefundStatus::name),
        of::<BucketState>(BucketState::name),
        of::<StockStatus>(StockStatus::name),
        of::<WalAction>(WalAction::name),
        of::<WalStatus>(WalStatus::name),
        of::<OutboxStatus>(OutboxStatus::name),
        of::<DeadLetterStatus>(DeadLetterStatus::name),
        of::<DeferredStatus>(DeferredStatus::name),
        of::<DifferenceStatus>(DifferenceStatus::name),
        of::<LedgerAction>(LedgerAction::name),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: StoredCode + fmt::Debug>() {
        let mut seen = Vec::new();
        for v in T::ALL {
            assert_eq!(T::from_stored(v.stored()), Some(*v), "{}", T::STORED_IN);
            assert!(
                !seen.contains(&v.stored()),
                "{}: duplicate code",
                T::STORED_IN
            );
            seen.push(v.stored());
        }
    }

    #[test]
    fn every_code_round_trips_and_is_unique_in_its_column() {
        round_trips::<ReservationStatus>();
        round_trips::<SyncStatus>();
        round_trips::<RefundStatus>();
        round_trips::<BucketState>();
        round_trips::<StockStatus>();
        round_trips::<WalAction>();
        round_trips::<WalStatus>();
        round_trips::<OutboxStatus>();
        round_trips::<DeadLetterStatus>();
        round_trips::<DeferredStatus>();
        round_trips::<DifferenceStatus>();
        round_trips::<LedgerAction>();
        round_trips::<OpCode>();
        round_trips::<FencePhase>();
        round_trips::<WalEffect>();
        round_trips::<RejectReason>();
    }

    #[test]
    fn codes_match_the_migrations_comments() {
        // The numbers are the stored data: changing one is a migration, not a refactor.
        assert_eq!(
            ReservationStatus::codes(&ReservationStatus::ALL),
            [10, 20, 25, 30, 40, 50, 60, 70, 80, 90]
        );
        assert_eq!(WalStatus::Succeeded.code(), 30);
        assert_eq!(WalAction::Rebuild.code(), 6);
        assert_eq!(OutboxStatus::codes(&OutboxStatus::ALL), [10, 20, 30, 40]);
        assert_eq!(LedgerAction::Rebuild.code(), 8);
        assert_eq!(StockStatus::Enabled.code(), 1);
        assert_eq!(BucketState::Archived.code(), 30);
    }

    #[test]
    fn operators_names_parse_in_any_case_stored_names_exactly() {
        assert_eq!(WalStatus::parse("dead"), Some(WalStatus::Dead));
        assert_eq!(WalStatus::from_name("dead"), None);
        assert_eq!(OpCode::from_name("SUCCEEDED"), Some(OpCode::Succeeded));
        assert_eq!(OpCode::from_name("succeeded"), None);
    }

    #[test]
    fn placeholders_match_the_bound_codes() {
        assert_eq!(placeholders(1), "?");
        assert_eq!(placeholders(3), "?, ?, ?");
        let holding = [
            ReservationStatus::Reserved,
            ReservationStatus::CreatedReserved,
        ];
        assert_eq!(
            placeholders(holding.len()).matches('?').count(),
            ReservationStatus::codes(&holding).len()
        );
    }

    /// `STOCKSVR_UPDATE_CODES=1 cargo test -p stocksvr-core` rewrites the file.
    #[test]
    fn the_harnesses_json_is_the_table() {
        let mut out = String::from("{\n");
        let table = integer_table();
        for (i, (column, codes)) in table.iter().enumerate() {
            let items: Vec<String> = codes
                .iter()
                .map(|(name, code)| format!("\"{name}\": {code}"))
                .collect();
            let comma = if i + 1 < table.len() { "," } else { "" };
            out.push_str(&format!(
                "  \"{column}\": {{{}}}{comma}\n",
                items.join(", ")
            ));
        }
        out.push_str("}\n");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stored-codes.json");
        if std::env::var_os("STOCKSVR_UPDATE_CODES").is_some() {
            std::fs::write(&path, &out).expect("write stored-codes.json");
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == out,
            "processors/core/stored-codes.json differs from the table: \
             STOCKSVR_UPDATE_CODES=1 cargo test -p stocksvr-core"
        );
        let columns: Vec<_> = table.iter().map(|(c, _)| *c).collect();
        let unique: std::collections::BTreeSet<_> = columns.iter().collect();
        assert_eq!(unique.len(), columns.len(), "one entry per column");
    }

    #[test]
    fn an_unknown_code_names_its_column() {
        let e = decode::<WalStatus>(99).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown code 99 in inventory_operation_wal.status"
        );
    }
}
