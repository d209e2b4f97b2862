//! The crash points of the reservation service, one per failure window (docs/design.md,
//! failure windows), and how an injected crash surfaces. Inert outside test builds (see
//! `stocksvr-failpoint`).
//!
//! Point names are `<step>.<place>`, step being `try`, `confirm`, `cancel` or `refund` (a
//! partial refund is a `refund`):
//!
//! - `try.before_insert`: the Try dies before its reservation row exists (window 1);
//! - `<step>.before_redis`: the row is in its intermediate status, the Lua step has not
//!   run (window 2 for the Try, window 7 for the others);
//! - `<step>.reply_lost`: the Lua step ran but its reply never arrived, a client timeout
//!   (window 3); it fires once per attempt, so `CrashTimes(1)` loses only the first reply;
//! - `<step>.before_commit`: the Lua step ran, the completing MySQL transaction (status CAS
//!   + outbox rows) never committed (window 4 for the Try, window 7 for the others).

use crate::ServiceError;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_failpoint::Injected;
use stocksvr_store::lua::ExecError;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    BeforeRedis,
    ReplyLost,
    BeforeCommit,
}

fn name(status: ReservationStatus, place: Place) -> Option<&'static str> {
    use Place::*;
    use ReservationStatus::*;
    Some(match (status, place) {
        (Preparing, BeforeRedis) => "try.before_redis",
        (Preparing, ReplyLost) => "try.reply_lost",
        (Preparing, BeforeCommit) => "try.before_commit",
        (Confirming, BeforeRedis) => "confirm.before_redis",
        (Confirming, ReplyLost) => "confirm.reply_lost",
        (Confirming, BeforeCommit) => "confirm.before_commit",
        (Canceling, BeforeRedis) => "cancel.before_redis",
        (Canceling, ReplyLost) => "cancel.reply_lost",
        (Canceling, BeforeCommit) => "cancel.before_commit",
        (Refunding, BeforeRedis) => "refund.before_redis",
        (Refunding, ReplyLost) => "refund.reply_lost",
        (Refunding, BeforeCommit) => "refund.before_commit",
        _ => return None,
    })
}

/// A crashed process is, to its caller, a connection that went away mid-request: the same
/// error a lost MySQL connection gives (retryable, outcome unknown to the caller).
fn crashed(injected: Injected) -> ServiceError {
    ServiceError::Mysql(sqlx::Error::Io(injected.into_io()))
}

/// Fails with an injected crash when a test armed `point`.
pub(crate) fn hit(point: &'static str) -> Result<(), ServiceError> {
    stocksvr_failpoint::hit(point).map_err(crashed)
}

/// Fails with an injected crash when a test armed `place` of the step run in `status`.
pub(crate) fn at(status: ReservationStatus, place: Place) -> Result<(), ServiceError> {
    match name(status, place) {
        Some(point) => hit(point),
        None => Ok(()),
    }
}

/// Turns the reply of a Lua step that did run into a timeout when a test armed
/// `<step>.reply_lost`: Redis has the op record, the caller does not know it.
pub(crate) fn reply_lost<T>(
    status: ReservationStatus,
    operation_id: &str,
    reply: Result<T, ExecError>,
) -> Result<T, ExecError> {
    let Some(point) = name(status, Place::ReplyLost) else {
        return reply;
    };
    let value = reply?;
    stocksvr_failpoint::hit(point).map_err(|injected| ExecError::Unknown {
        operation_id: operation_id.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, injected).into(),
    })?;
    Ok(value)
}
