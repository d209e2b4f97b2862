//! The reservation service (docs/design.md, flows and failure windows): Try, Confirm, Cancel and
//! Refund as library operations with one set of guarantees, used by the HTTP Try API, the order
//! processors and the recovery worker alike.
//!
//! Every operation follows the same shape: read the row,
//! [`decide`](stocksvr_core::reservation::decide) what the intent means in its status, CAS into the
//! intermediate status with the step's operation id, run the Lua step, and complete with one MySQL
//! transaction (status CAS + outbox rows). A crash or an UNKNOWN Redis outcome anywhere leaves a
//! persisted intermediate status that [`ReservationService::resume`] continues with the same
//! operation id.

pub mod cache;
mod error;
mod failpoint;
#[cfg(test)]
mod fixture;
pub mod gauges;
pub mod operations;
mod outbox;
pub mod recovery;
mod service;
pub mod settings;
pub mod stale;
pub mod view;

pub use error::ServiceError;
pub use operations::{OpsConfig, OpsError, StockOps};
/// Group commit without a timer, for other processors' batched writes (the order-lifecycle
/// inbox, say).
pub use service::group::Coalescer;
pub use service::{
    IntentOutcome, ReservationService, ServiceConfig, Target, TryReply, TryRequest,
    REJECTED_ORDER_FAILED,
};
