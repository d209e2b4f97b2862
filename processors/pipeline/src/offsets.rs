//! Committed offsets of a consumer group: read them with the lag of each partition, and
//! move them (`stocksvr offsets`) so an operator can reprocess or skip records.
//!
//! Moving offsets never touches records; it only changes where the group resumes. Reprocessing
//! is safe because every effect is idempotent (inbox + CAS); skipping forward drops the
//! skipped records' effects, which is the operator's call.
//!
//! A reset is planned first ([`plan_reset`], pure arithmetic over one read of the cluster in
//! [`decide`]) and carried out separately ([`execute_reset`]). Carrying out refuses while the
//! group has members: a running member would overwrite the new offsets with its next commit
//! (and the broker rejects a commit from outside the group then anyway). The commit uses a
//! consumer that is *assigned* the partitions, never subscribed, so it never joins the group
//! and triggers no rebalance.

use crate::config::KafkaSettings;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;
use stocksvr_core::retry::RetryPolicy;

#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    #[error("topic {topic} has no partition {partition} (it has {count}: 0..{count})")]
    UnknownPartition {
        topic: String,
        partition: i32,
        count: i32,
    },
    #[error(
        "consumer group {group} has {} active member(s): {}; stop them and retry (nothing changed)",
        members.len(),
        members.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    GroupActive {
        group: String,
        members: Vec<GroupMember>,
    },
    #[error(
        "the committed offset of {topic}/{partition} is {found} but the plan was made at {planned}; \
         plan again (nothing changed)",
        found = show_offset(*found),
        planned = show_offset(*planned)
    )]
    StalePlan {
        topic: String,
        partition: i32,
        planned: Option<i64>,
        found: Option<i64>,
    },
    #[error(
        "committed {topic}/{partition} at {expected} but reading it back gives {found}",
        found = show_offset(*found)
    )]
    NotApplied {
        topic: String,
        partition: i32,
        expected: i64,
        found: Option<i64>,
    },
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

fn show_offset(offset: Option<i64>) -> String {
    offset.map_or_else(|| "none".to_string(), |o| o.to_string())
}

/// One member of a consumer group, as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
}

impl fmt::Display for GroupMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.client_id, self.client_host)
    }
}

/// One partition as the group sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub topic: String,
    pub partition: i32,
    /// The offset the group resumes from; `None` when it never committed one.
    pub committed: Option<i64>,
    /// Low watermark: the first offset still stored.
    pub low: i64,
    /// High watermark: the offset the next record will get.
    pub high: i64,
    /// `high - committed`: records the group has yet to read. `None` without a commit.
    pub lag: Option<i64>,
}

/// Where a reset moves the committed offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    /// The low watermark: reprocess everything still stored.
    Earliest,
    /// The high watermark: skip everything not yet read.
    Latest,
    /// The first record whose timestamp is at or after this many milliseconds since the
    /// epoch; the high watermark when no record is that late.
    Timestamp(i64),
    /// This offset in every selected partition.
    Offset(i64),
    /// The committed offset plus this (negative: back); from the low watermark where the
    /// group has no committed offset.
    ShiftBy(i64),
}

/// What a reset does to one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetPlan {
    pub partition: i32,
    /// The committed offset when the plan was made.
    pub current: Option<i64>,
    /// The offset to commit; always within `[low, high]`.
    pub new: i64,
    pub low: i64,
    pub high: i64,
    /// The offset the target asked for when it lay outside `[low, high]` and `new` is the
    /// nearer end instead.
    pub clamped_from: Option<i64>,
}

impl ResetPlan {
    /// Records the group will read after the reset.
    pub fn lag(&self) -> i64 {
        self.high - self.new
    }

    pub fn changes(&self) -> bool {
        self.current != Some(self.new)
    }
}

/// The offset `target` asks for in one partition, clamped into `[low, high]`.
/// `for_time` is the broker's answer to the timestamp lookup (`None`: no record that late).
pub fn decide(
    target: ResetTarget,
    current: Option<i64>,
    low: i64,
    high: i64,
    for_time: Option<i64>,
) -> (i64, Option<i64>) {
    let requested = match target {
        ResetTarget::Earliest => low,
        ResetTarget::Latest => high,
        ResetTarget::Timestamp(_) => for_time.unwrap_or(high),
        ResetTarget::Offset(offset) => offset,
        ResetTarget::ShiftBy(delta) => current.unwrap_or(low).saturating_add(delta),
    };
    let new = requested.clamp(low, high.max(low));
    (new, (new != requested).then_some(requested))
}

/// A consumer carrying the group's id that only ever reads or commits offsets: it is never
/// subscribed, so it never joins the group, and it never commits on its own.
fn offsets_consumer(settings: &KafkaSettings, group: &str) -> Result<GroupHandle, KafkaError> {
    crate::kafka::client_config(settings, "offsets")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create_with_context(crate::kafka::KafkaContext::new(settings, "offsets"))
}

/// A consumer carrying a group's id; its refusals are said once.
type GroupHandle = BaseConsumer<crate::kafka::KafkaContext>;

/// Runs blocking rdkafka calls off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OffsetsError> + Send + 'static,
) -> Result<T, OffsetsError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| OffsetsError::Kafka(KafkaError::Canceled))?
}

/// Partition count of `topic`, from metadata of the whole cluster (asking for one topic by
/// name may create it where the broker auto-creates topics).
fn partition_count(metadata: &Metadata, topic: &str) -> Result<i32, OffsetsError> {
    let unknown = || OffsetsError::UnknownTopic(topic.to_string());
    let found = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(unknown)?;
    match found.error().map(RDKafkaErrorCode::from) {
        None if !found.partitions().is_empty() => Ok(found.partitions().len() as i32),
        None | Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Err(unknown()),
        // Not authorized, leader unavailable, ...: the topic may well exist.
        Some(code) => Err(OffsetsError::Kafka(KafkaError::MetadataFetch(code))),
    }
}

/// Kafka's own topics (`__consumer_offsets`, `__transaction_state`, ...).
fn is_internal(topic: &str) -> bool {
    topic.starts_with("__")
}

/// The group's committed offsets of `partitions` (topic, partition), `None` where it has none.
fn committed(
    consumer: &GroupHandle,
    partitions: &[(String, i32)],
    timeout: Duration,
) -> Result<BTreeMap<(String, i32), Option<i64>>, OffsetsError> {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        tpl.add_partition(topic, *partition);
    }
    let tpl =
        through_a_coordinator_move(timeout, || consumer.committed_offsets(tpl.clone(), timeout))?;
    let mut found = BTreeMap::new();
    for elem in tpl.elements() {
        elem.error()?;
        let offset = match elem.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        };
        found.insert((elem.topic().to_string(), elem.partition()), offset);
    }
    Ok(found)
}

/// Whether the group's coordinator is moving (a leader election of `__consumer_offsets`, a
/// broker fenced by its controller on a loaded host): the broker says so at once instead of
/// answering, and asking again shortly finds the new coordinator.
fn coordinator_is_moving(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}

/// `ask` (a read or commit of a group's offsets) asked again while the group's coordinator
/// moves, within `timeout`: librdkafka hands `NotCoordinator` back to such one-shot calls
/// rather than retrying them.
pub fn through_a_coordinator_move<T>(
    timeout: Duration,
    ask: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let deadline = std::time::Instant::now() + timeout;
    RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(1)).run_blocking(
        ask,
        |e| coordinator_is_moving(e) && std::time::Instant::now() < deadline,
        |e, wait| tracing::debug!(error = %e, ?wait, "the group coordinator is moving; asking again"),
    )
}

fn watermarks(
    consumer: &GroupHandle,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), OffsetsError> {
    Ok(consumer.fetch_watermarks(topic, partition, timeout)?)
}

/// Committed offsets, watermarks and lag of every partition of `topic`, or without a topic,
/// of every topic the group has committed offsets for. Sorted by topic and partition.
pub async fn show(
    settings: &KafkaSettings,
    group: &str,
    topic: Option<&str>,
) -> Result<Vec<PartitionOffsets>, OffsetsError> {
    let consumer = offsets_consumer(settings, group)?;
    let timeout = settings.request_timeout();
    let topic = topic.map(str::to_string);
    blocking(move || {
        let metadata = consumer.fetch_metadata(None, timeout)?;
        let mut partitions = Vec::new();
        match &topic {
            Some(name) => {
                for p in 0..partition_count(&metadata, name)? {
                    partitions.push((name.clone(), p));
                }
            }
            None => {
                for t in metadata.topics() {
                    if t.error().is_some() || is_internal(t.name()) {
                        continue;
                    }
                    for p in t.partitions() {
                        partitions.push((t.name().to_string(), p.id()));
                    }
                }
            }
        }
        let committed = committed(&consumer, &partitions, timeout)?;
        // Without a topic, only topics where the group committed at least one partition.
        let shown: Vec<&String> = match &topic {
            Some(name) => vec![name],
            None => {
                let mut names: Vec<&String> = committed
                    .iter()
                    .filter(|(_, offset)| offset.is_some())
                    .map(|((t, _), _)| t)
                    .collect();
                names.dedup();
                names
            }
        };
        let mut rows = Vec::new();
        for ((t, partition), offset) in &committed {
            if !shown.contains(&t) {
                continue;
            }
            let (low, high) = watermarks(&consumer, t, *partition, timeout)?;
            rows.push(PartitionOffsets {
                topic: t.clone(),
                partition: *partition,
                committed: *offset,
                low,
                high,
                lag: offset.map(|o| high - o),
            });
        }
        Ok(rows)
    })
    .await
}

/// What resetting `group`'s offsets of `topic` to `target` would do, per partition (all of
/// them, or `partitions`). Reads the cluster; changes nothing.
pub async fn plan_reset(
    settings: &KafkaSettings,
    group: &str,
    topic: &str,
    target: ResetTarget,
    partitions: Option<Vec<i32>>,
) -> Result<Vec<ResetPlan>, OffsetsError> {
    let consumer = offsets_consumer(settings, group)?;
    let timeout = settings.request_timeout();
    let topic = topic.to_string();
    blocking(move || {
        let metadata = consumer.fetch_metadata(None, timeout)?;
        let count = partition_count(&metadata, &topic)?;
        let mut selected = match partitions {
            Some(list) => list,
            None => (0..count).collect(),
        };
        selected.sort_unstable();
        selected.dedup();
        if let Some(&partition) = selected.iter().find(|p| !(0..count).contains(*p)) {
            return Err(OffsetsError::UnknownPartition {
                topic,
                partition,
                count,
            });
        }
        let keys: Vec<(String, i32)> = selected.iter().map(|p| (topic.clone(), *p)).collect();
        let current = committed(&consumer, &keys, timeout)?;
        let for_time = match target {
            ResetTarget::Timestamp(ms) => {
                offsets_for_time(&consumer, &topic, &selected, ms, timeout)?
            }
            _ => BTreeMap::new(),
        };
        let mut plans = Vec::with_capacity(selected.len());
        for partition in selected {
            let (low, high) = watermarks(&consumer, &topic, partition, timeout)?;
            let current = current.get(&(topic.clone(), partition)).copied().flatten();
            let (new, clamped_from) = decide(
                target,
                current,
                low,
                high,
                for_time.get(&partition).copied().flatten(),
            );
            plans.push(ResetPlan {
                partition,
                current,
                new,
                low,
                high,
                clamped_from,
            });
        }
        Ok(plans)
    })
    .await
}

/// The offset of the first record at or after `ms` in each partition; `None` where no record
/// is that late (the broker answers "end").
fn offsets_for_time(
    consumer: &GroupHandle,
    topic: &str,
    partitions: &[i32],
    ms: i64,
    timeout: Duration,
) -> Result<BTreeMap<i32, Option<i64>>, OffsetsError> {
    // ListOffsets reads -1 and -2 as "latest" and "earliest"; no record has a timestamp
    // before the epoch, so any earlier time means the first record.
    let ms = ms.max(0);
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for partition in partitions {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(ms))?;
    }
    let tpl = consumer.offsets_for_times(tpl, timeout)?;
    let mut found = BTreeMap::new();
    for elem in tpl.elements() {
        elem.error()?;
        let offset = match elem.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        };
        found.insert(elem.partition(), offset);
    }
    Ok(found)
}

/// Members of `group`; empty when it has none (or does not exist).
pub async fn active_members(
    settings: &KafkaSettings,
    group: &str,
) -> Result<Vec<GroupMember>, OffsetsError> {
    let consumer = offsets_consumer(settings, group)?;
    let timeout = settings.request_timeout();
    let group = group.to_string();
    blocking(move || members(&consumer, &group, timeout)).await
}

fn members(
    consumer: &GroupHandle,
    group: &str,
    timeout: Duration,
) -> Result<Vec<GroupMember>, OffsetsError> {
    let list = consumer.fetch_group_list(Some(group), timeout)?;
    Ok(list
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .flat_map(|g| g.members())
        .map(|m| GroupMember {
            member_id: m.id().to_string(),
            client_id: m.client_id().to_string(),
            client_host: m.client_host().to_string(),
        })
        .collect())
}

/// Commits `plans` for `group` on `topic`, then reads the offsets back to confirm them.
///
/// Refuses with [`OffsetsError::GroupActive`] while the group has members, and with
/// [`OffsetsError::StalePlan`] when a committed offset moved since the plan was made; in
/// both cases nothing is committed.
pub async fn execute_reset(
    settings: &KafkaSettings,
    group: &str,
    topic: &str,
    plans: &[ResetPlan],
) -> Result<(), OffsetsError> {
    if plans.is_empty() {
        return Ok(());
    }
    let consumer = offsets_consumer(settings, group)?;
    let timeout = settings.request_timeout();
    let group = group.to_string();
    let topic = topic.to_string();
    let plans = plans.to_vec();
    blocking(move || {
        let active = members(&consumer, &group, timeout)?;
        if !active.is_empty() {
            return Err(OffsetsError::GroupActive {
                group,
                members: active,
            });
        }
        let keys: Vec<(String, i32)> = plans.iter().map(|p| (topic.clone(), p.partition)).collect();
        let before = committed(&consumer, &keys, timeout)?;
        for plan in &plans {
            let found = before
                .get(&(topic.clone(), plan.partition))
                .copied()
                .flatten();
            if found != plan.current {
                return Err(OffsetsError::StalePlan {
                    topic,
                    partition: plan.partition,
                    planned: plan.current,
                    found,
                });
            }
        }
        let mut tpl = TopicPartitionList::with_capacity(plans.len());
        for plan in &plans {
            tpl.add_partition_offset(&topic, plan.partition, Offset::Offset(plan.new))?;
        }
        // `assign`, not `subscribe`: the consumer stays outside the group. The broker accepts
        // a commit from outside only while the group is empty, so a member that joined since
        // the check above makes this fail instead of racing it.
        consumer.assign(&tpl)?;
        let result =
            through_a_coordinator_move(timeout, || consumer.commit(&tpl, CommitMode::Sync));
        consumer.unassign()?;
        if let Err(KafkaError::ConsumerCommit(code)) = &result {
            if matches!(
                code,
                RDKafkaErrorCode::UnknownMemberId
                    | RDKafkaErrorCode::IllegalGeneration
                    | RDKafkaErrorCode::RebalanceInProgress
            ) {
                let members = members(&consumer, &group, timeout)?;
                return Err(OffsetsError::GroupActive { group, members });
            }
        }
        result?;
        let after = committed(&consumer, &keys, timeout)?;
        for plan in &plans {
            let found = after
                .get(&(topic.clone(), plan.partition))
                .copied()
                .flatten();
            if found != Some(plan.new) {
                return Err(OffsetsError::NotApplied {
                    topic,
                    partition: plan.partition,
                    expected: plan.new,
                    found,
                });
            }
        }
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_moving_coordinator_is_asked_again() {
        let fetch = |code| KafkaError::MetadataFetch(code);
        assert!(coordinator_is_moving(&fetch(
            RDKafkaErrorCode::NotCoordinator
        )));
        assert!(coordinator_is_moving(&fetch(
            RDKafkaErrorCode::CoordinatorLoadInProgress
        )));
        assert!(!coordinator_is_moving(&fetch(
            RDKafkaErrorCode::GroupAuthorizationFailed
        )));
        assert!(!coordinator_is_moving(&fetch(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
    }

    #[test]
    fn earliest_and_latest_are_the_watermarks() {
        assert_eq!(
            decide(ResetTarget::Earliest, Some(7), 2, 10, None),
            (2, None)
        );
        assert_eq!(
            decide(ResetTarget::Latest, Some(7), 2, 10, None),
            (10, None)
        );
        assert_eq!(decide(ResetTarget::Earliest, None, 0, 0, None), (0, None));
    }

    #[test]
    fn shift_moves_from_the_committed_offset_or_the_low_watermark() {
        assert_eq!(
            decide(ResetTarget::ShiftBy(-3), Some(7), 0, 10, None),
            (4, None)
        );
        assert_eq!(
            decide(ResetTarget::ShiftBy(2), Some(7), 0, 10, None),
            (9, None)
        );
        assert_eq!(
            decide(ResetTarget::ShiftBy(3), None, 5, 10, None),
            (8, None)
        );
    }

    #[test]
    fn requests_outside_the_watermarks_are_clamped_and_say_so() {
        assert_eq!(
            decide(ResetTarget::ShiftBy(-9), Some(7), 0, 10, None),
            (0, Some(-2))
        );
        assert_eq!(
            decide(ResetTarget::ShiftBy(5), Some(7), 0, 10, None),
            (10, Some(12))
        );
        assert_eq!(
            decide(ResetTarget::Offset(3), None, 5, 10, None),
            (5, Some(3))
        );
        assert_eq!(
            decide(ResetTarget::Offset(99), None, 5, 10, None),
            (10, Some(99))
        );
        assert_eq!(
            decide(ResetTarget::ShiftBy(i64::MAX), Some(7), 0, 10, None),
            (10, Some(i64::MAX))
        );
        // A committed offset past a truncated log still lands inside it.
        assert_eq!(
            decide(ResetTarget::ShiftBy(0), Some(50), 0, 10, None),
            (10, Some(50))
        );
    }

    #[test]
    fn a_timestamp_past_the_end_means_the_high_watermark() {
        assert_eq!(
            decide(ResetTarget::Timestamp(1), Some(1), 0, 10, Some(4)),
            (4, None)
        );
        assert_eq!(
            decide(ResetTarget::Timestamp(1), Some(1), 0, 10, None),
            (10, None)
        );
    }

    #[test]
    fn plan_lag_counts_what_will_be_read_again() {
        let plan = ResetPlan {
            partition: 0,
            current: Some(7),
            new: 4,
            low: 0,
            high: 10,
            clamped_from: None,
        };
        assert_eq!(plan.lag(), 6);
        assert!(plan.changes());
        assert!(!ResetPlan {
            new: 7,
            ..plan.clone()
        }
        .changes());
    }

    #[test]
    fn group_active_names_the_members() {
        let err = OffsetsError::GroupActive {
            group: "g".into(),
            members: vec![GroupMember {
                member_id: "m-1".into(),
                client_id: "stocksvr-event-log".into(),
                client_host: "/10.0.0.1".into(),
            }],
        };
        let text = err.to_string();
        assert!(
            text.contains("1 active member(s): stocksvr-event-log (/10.0.0.1)"),
            "{text}"
        );
        assert!(text.contains("nothing changed"), "{text}");
    }
}
