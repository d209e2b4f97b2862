//! The consumer's rebalance callbacks: commit finished work on revoke, keep partitions
//! assigned during an outage paused.

use crate::kafka::{context, KafkaContext};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Commits finished work before partitions move to another instance, and keeps partitions
/// assigned during an outage paused. (Consumer lag is measured at the broker by the lag
/// exporter, which keeps reporting while this process is dead or stuck.)
pub(super) struct LoopContext {
    pub(super) name: &'static str,
    /// True while the loop waits out an outage: newly assigned partitions start paused.
    pub(super) paused: Arc<AtomicBool>,
    /// Names what refuses the consumer (a wrong password, a missing ACL), once.
    pub(super) kafka: KafkaContext,
}

impl ClientContext for LoopContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        context::log_line(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        context::report_error(&self.kafka, &error, reason);
    }
}

impl ConsumerContext for LoopContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            // Records are handled between polls, so every stored offset is finished work.
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => {
                    tracing::warn!(processor = self.name, error = %e, "commit on revoke failed")
                }
            }
            tracing::info!(
                processor = self.name,
                partitions = partitions.count(),
                "partitions revoked"
            );
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            self.kafka.joined();
            if self.paused.load(Ordering::SeqCst) {
                // The outage goes on: nothing may be fetched behind the waiting record.
                if let Err(e) = consumer.pause(partitions) {
                    tracing::warn!(processor = self.name, error = %e, "pausing new partitions failed");
                }
            } else if let Err(e) = consumer.resume(partitions) {
                // librdkafka keeps a partition paused across an unassign and a new assign.
                tracing::warn!(processor = self.name, error = %e, "resuming new partitions failed");
            }
            tracing::info!(
                processor = self.name,
                partitions = partitions.count(),
                "partitions assigned"
            );
        }
    }
}
