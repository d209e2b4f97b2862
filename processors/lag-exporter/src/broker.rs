//! One round of reads from the broker (blocking rdkafka calls; the caller runs them off the
//! async runtime).
//!
//! No client here ever joins a consumer group: the reader has no `group.id` and is only ever
//! `assign()`ed, and the per-group handles carry the group's id solely to ask the group
//! coordinator for committed offsets (OffsetFetch); they never subscribe, poll or commit. So
//! the exporter triggers no rebalance and works the same whether a group has members or not.

use crate::lag::{
    position, records_behind, seconds_behind, GroupSummary, PartitionLag, RecordAt, Scrape,
    TimestampCache,
};
use crate::LagExporterConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::kafka::{client_config, KafkaContext};

/// A consumer whose refusals (a missing ACL, a wrong password) are said once.
type Handle = BaseConsumer<KafkaContext>;

/// The group id of the exporter's record reader: `<group_prefix>.lag-exporter-reader`. It
/// is never joined and never commits, so it never exists on the broker nor shows among the
/// exported groups.
pub fn reader_group(settings: &KafkaSettings) -> String {
    format!("{}.lag-exporter-reader", settings.group_prefix)
}

/// The broker-side state one exporter keeps between rounds.
pub struct Reader {
    settings: KafkaSettings,
    prefix: String,
    timeout: Duration,
    fetch_timeout: Duration,
    /// Metadata, group listing, watermarks and the first unconsumed records.
    reader: Handle,
    /// One committed-offsets handle per group, kept while the group is listed.
    groups: BTreeMap<String, Handle>,
    cache: TimestampCache,
}

impl Reader {
    pub fn new(settings: &KafkaSettings, config: &LagExporterConfig) -> Result<Self, KafkaError> {
        let reader = client_config(settings, "lag-exporter")
            // librdkafka refuses assign() without a group id. This one is never subscribed,
            // never commits and so never exists on the broker; librdkafka still asks for its
            // coordinator, so it lives under the group prefix, where the ACLs of the
            // deployment's groups already reach (`stocksvr acls print`).
            .set("group.id", reader_group(settings))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("allow.auto.create.topics", "false")
            // A committed offset below the low watermark (deleted by retention) reads from the
            // first record kept, exactly where the group itself would resume.
            .set("auto.offset.reset", "earliest")
            // One record per partition is all a round needs: small fetches, no prefetching.
            .set("fetch.wait.max.ms", "100")
            .set("max.partition.fetch.bytes", "65536")
            .set("queued.min.messages", "1")
            .create_with_context(KafkaContext::new(settings, "lag-exporter"))?;
        Ok(Self {
            settings: settings.clone(),
            prefix: config.effective_prefix(settings),
            timeout: settings.request_timeout(),
            fetch_timeout: config.fetch_timeout(),
            reader,
            groups: BTreeMap::new(),
            cache: TimestampCache::default(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Timestamps currently cached (one per lagging group and partition at most).
    pub fn cached_timestamps(&self) -> usize {
        self.cache.len()
    }

    /// One round. Fails only when the cluster cannot be listed at all; a group or partition
    /// that cannot be read is skipped and named in [`Scrape::problems`].
    pub fn scrape(&mut self) -> Result<Scrape, KafkaError> {
        let started = Instant::now();
        let mut scrape = Scrape::default();
        self.list_groups(&mut scrape)?;
        let partitions = self.topic_partitions()?;
        let listed_in = started.elapsed();
        let committed = self.committed_offsets(&mut scrape, &partitions);
        let committed_in = started.elapsed();
        let (wanted, watermarks) = self.watermarks(&mut scrape, &committed);
        let watermarks_in = started.elapsed();
        // Lag in records; the first unconsumed record of every lagging partition.
        let (rows, lagging) = lag_rows(&committed, &watermarks);
        let missing = self.cache.missing(&lagging);
        if !missing.is_empty() {
            let (found, problems) = self.first_records(&missing);
            for (at, ts) in found {
                self.cache.insert(at, ts);
            }
            scrape.problems.extend(problems);
        }
        let now = now_ms();
        for (mut row, at) in rows {
            if row.lag > 0 {
                row.lag_seconds = self
                    .cache
                    .get(&(row.topic.clone(), row.partition, at))
                    .map(|ts| seconds_behind(now, ts));
            }
            scrape.partitions.push(row);
        }
        self.cache.retain(&lagging);
        if scrape.problems.is_empty() {
            // Every group and partition was read: nothing refuses the exporter any more.
            self.reader.context().fetched();
        }
        // Where a round's time goes, for an operator who sees the broker busy every interval.
        tracing::debug!(
            groups = scrape.groups.len(),
            partitions = wanted.len(),
            lagging = lagging.len(),
            first_records_read = missing.len(),
            listed_ms = listed_in.as_millis() as u64,
            committed_ms = (committed_in - listed_in).as_millis() as u64,
            watermarks_ms = (watermarks_in - committed_in).as_millis() as u64,
            first_records_ms = (started.elapsed() - watermarks_in).as_millis() as u64,
            "lag exporter round"
        );
        Ok(scrape)
    }

    /// The groups of this deployment (by prefix), sorted; the handles of groups no longer
    /// listed are dropped.
    fn list_groups(&mut self, scrape: &mut Scrape) -> Result<(), KafkaError> {
        let list = self.reader.fetch_group_list(None, self.timeout)?;
        for g in list.groups() {
            if g.name().starts_with(&self.prefix) {
                scrape.groups.push(GroupSummary {
                    group: g.name().to_string(),
                    state: g.state().to_string(),
                    members: g.members().len(),
                });
            }
        }
        scrape.groups.sort_by(|a, b| a.group.cmp(&b.group));
        let listed: BTreeSet<&str> = scrape.groups.iter().map(|g| g.group.as_str()).collect();
        self.groups.retain(|name, _| listed.contains(name.as_str()));
        Ok(())
    }

    /// The partition ids of every topic, Kafka's own topics and topics the broker reports
    /// an error for left out.
    fn topic_partitions(&self) -> Result<BTreeMap<String, Vec<i32>>, KafkaError> {
        let metadata = self.reader.fetch_metadata(None, self.timeout)?;
        let mut partitions: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for t in metadata.topics() {
            if t.name().starts_with("__") || t.error().is_some() || t.partitions().is_empty() {
                continue;
            }
            let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            ids.sort_unstable();
            partitions.insert(t.name().to_string(), ids);
        }
        Ok(partitions)
    }

    /// Committed offsets of every listed group, on the topics where it committed at least
    /// once; a group that cannot be read is named unread.
    fn committed_offsets(
        &mut self,
        scrape: &mut Scrape,
        partitions: &BTreeMap<String, Vec<i32>>,
    ) -> Committed {
        let mut committed = Committed::new();
        let names: Vec<String> = scrape.groups.iter().map(|g| g.group.clone()).collect();
        for group in names {
            match self.committed(&group, partitions) {
                Ok(offsets) => {
                    committed.insert(group, offsets);
                }
                Err(e) => {
                    scrape.unread_groups.insert(group.clone());
                    scrape
                        .problems
                        .push(format!("committed offsets of {group}: {e}"));
                }
            }
        }
        committed
    }

    /// Watermarks once per partition any group reads, and those partitions. A group that
    /// reads a partition whose watermarks cannot be read is named unread.
    fn watermarks(
        &self,
        scrape: &mut Scrape,
        committed: &Committed,
    ) -> (BTreeSet<(String, i32)>, Watermarks) {
        let wanted: BTreeSet<(String, i32)> = committed
            .values()
            .flat_map(|offsets| offsets.keys().cloned())
            .collect();
        let mut watermarks = Watermarks::new();
        for (topic, partition) in &wanted {
            match self
                .reader
                .fetch_watermarks(topic, *partition, self.timeout)
            {
                Ok(w) => {
                    watermarks.insert((topic.clone(), *partition), w);
                }
                Err(e) => {
                    scrape
                        .problems
                        .push(format!("watermarks of {topic}/{partition}: {e}"));
                    for (group, offsets) in committed {
                        if offsets.contains_key(&(topic.clone(), *partition)) {
                            scrape.unread_groups.insert(group.clone());
                        }
                    }
                }
            }
        }
        (wanted, watermarks)
    }

    /// The group's committed offsets of every partition of every topic where it committed at
    /// least one; `None` for a partition of such a topic without a commit.
    fn committed(
        &mut self,
        group: &str,
        partitions: &BTreeMap<String, Vec<i32>>,
    ) -> Result<BTreeMap<(String, i32), Option<i64>>, KafkaError> {
        if !self.groups.contains_key(group) {
            let handle: Handle = client_config(&self.settings, "lag-exporter")
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .create_with_context(self.reader.context().as_ref().clone())?;
            self.groups.insert(group.to_string(), handle);
        }
        let Some(handle) = self.groups.get(group) else {
            return Ok(BTreeMap::new());
        };
        let mut tpl = TopicPartitionList::new();
        for (topic, ids) in partitions {
            for id in ids {
                tpl.add_partition(topic, *id);
            }
        }
        if tpl.count() == 0 {
            return Ok(BTreeMap::new());
        }
        let tpl = handle.committed_offsets(tpl, self.timeout)?;
        let mut all: BTreeMap<(String, i32), Option<i64>> = BTreeMap::new();
        for elem in tpl.elements() {
            elem.error()?;
            let offset = match elem.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            all.insert((elem.topic().to_string(), elem.partition()), offset);
        }
        let read: BTreeSet<String> = all
            .iter()
            .filter(|(_, offset)| offset.is_some())
            .map(|((topic, _), _)| topic.clone())
            .collect();
        all.retain(|(topic, _), _| read.contains(topic));
        Ok(all)
    }

    /// Timestamps of the first record at or after each position, read by the assign()-ed
    /// reader within the fetch timeout. Positions on the same partition are read one after
    /// another (seek), so a far-behind group costs one record, not the records in between.
    fn first_records(&self, positions: &[RecordAt]) -> (Vec<(RecordAt, i64)>, Vec<String>) {
        let mut pending: Pending = BTreeMap::new();
        for (topic, partition, offset) in positions {
            pending
                .entry((topic.clone(), *partition))
                .or_default()
                .push(*offset);
        }
        for offsets in pending.values_mut() {
            offsets.sort_unstable();
            offsets.dedup();
        }
        let mut found = Vec::new();
        let mut problems = Vec::new();
        if !self.assign_at_first(&pending, &mut problems) {
            return (found, problems);
        }
        let deadline = Instant::now() + self.fetch_timeout;
        while !pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let answered = match self.reader.poll(left) {
                None => None,
                Some(Err(e)) => {
                    // A refusal (a missing Read ACL) is also said once, for /readyz.
                    self.reader.context().refused(&e, &e.to_string(), "");
                    problems.push(format!("reading first unconsumed records: {e}"));
                    None
                }
                // The record is dropped before the reader seeks past it.
                Some(Ok(message)) => answer(&message, &mut pending, &mut found, &mut problems),
            };
            if let Some((key, next)) = answered {
                self.move_on(key, next, &mut pending, &mut problems);
            }
        }
        for ((topic, partition), offsets) in &pending {
            for offset in offsets {
                problems.push(format!(
                    "{topic}/{partition}: no record at or after offset {offset} within {:?}",
                    self.fetch_timeout
                ));
            }
        }
        // Stop fetching until the next round; a failure here is repaired by the next assign.
        let _ = self.reader.unassign();
        (found, problems)
    }

    /// Assigns every pending partition at its first pending position; false when the
    /// assignment itself failed (nothing can be read this round).
    fn assign_at_first(&self, pending: &Pending, problems: &mut Vec<String>) -> bool {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offsets) in pending {
            if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(offsets[0]))
            {
                problems.push(format!("{topic}/{partition}: {e}"));
            }
        }
        if let Err(e) = self.reader.assign(&tpl) {
            problems.push(format!("assigning {} partitions: {e}", tpl.count()));
            return false;
        }
        // librdkafka keeps a partition's pause across unassign/assign: an earlier round
        // paused the partitions it had answered.
        if let Err(e) = self.reader.resume(&tpl) {
            problems.push(format!("resuming {} partitions: {e}", tpl.count()));
        }
        true
    }

    /// After a record answered the positions of `key` up to its own: seeks to the next
    /// pending position, or stops fetching a partition with none left.
    fn move_on(
        &self,
        key: (String, i32),
        next: Option<i64>,
        pending: &mut Pending,
        problems: &mut Vec<String>,
    ) {
        match next {
            Some(offset) => {
                if let Err(e) =
                    self.reader
                        .seek(&key.0, key.1, Offset::Offset(offset), self.timeout)
                {
                    problems.push(format!("{}/{}: seek to {offset}: {e}", key.0, key.1));
                    pending.remove(&key);
                }
            }
            None => {
                pending.remove(&key);
                let mut done = TopicPartitionList::new();
                done.add_partition(&key.0, key.1);
                // Stops fetching a partition already answered; failing only wastes reads.
                let _ = self.reader.pause(&done);
            }
        }
    }
}

/// One record read: its timestamp answers every pending position of its partition up to
/// its offset. Returns the partition and its next pending position when it answered any,
/// for [`Reader::move_on`]; a record without a timestamp gives its partition up.
fn answer(
    message: &BorrowedMessage<'_>,
    pending: &mut Pending,
    found: &mut Vec<(RecordAt, i64)>,
    problems: &mut Vec<String>,
) -> Option<((String, i32), Option<i64>)> {
    let key = (message.topic().to_string(), message.partition());
    let offsets = pending.get_mut(&key)?;
    // Prefetched records from before a seek lie below the position asked for.
    if message.offset() < offsets[0] {
        return None;
    }
    let Some(ts) = message.timestamp().to_millis() else {
        problems.push(format!(
            "{}/{} offset {} has no timestamp",
            key.0,
            key.1,
            message.offset()
        ));
        pending.remove(&key);
        return None;
    };
    // This record is the first at or after every pending position up to its own offset:
    // nothing lies between them.
    while let Some(&first) = offsets.first() {
        if first > message.offset() {
            break;
        }
        found.push(((key.0.clone(), key.1, first), ts));
        offsets.remove(0);
    }
    let next = offsets.first().copied();
    Some((key, next))
}

/// Committed offsets per group, per (topic, partition); `None` where the group has not
/// committed on a partition of a topic it reads.
type Committed = BTreeMap<String, BTreeMap<(String, i32), Option<i64>>>;

/// (low, high) watermarks per (topic, partition).
type Watermarks = BTreeMap<(String, i32), (i64, i64)>;

/// Positions still to read, per (topic, partition), ascending.
type Pending = BTreeMap<(String, i32), Vec<i64>>;

/// Every group's lag per partition it reads (with the position its first unconsumed record
/// is at), and the positions of the partitions that lag.
fn lag_rows(
    committed: &Committed,
    watermarks: &Watermarks,
) -> (Vec<(PartitionLag, i64)>, BTreeSet<RecordAt>) {
    let mut rows = Vec::new();
    let mut lagging: BTreeSet<RecordAt> = BTreeSet::new();
    for (group, offsets) in committed {
        for ((topic, partition), offset) in offsets {
            let Some(&(low, high)) = watermarks.get(&(topic.clone(), *partition)) else {
                continue;
            };
            let at = position(*offset, low);
            let lag = records_behind(at, high);
            if lag > 0 {
                lagging.insert((topic.clone(), *partition, at));
            }
            let row = PartitionLag {
                group: group.clone(),
                topic: topic.clone(),
                partition: *partition,
                committed: *offset,
                low_watermark: low,
                high_watermark: high,
                lag,
                lag_seconds: (lag == 0).then_some(0.0),
            };
            rows.push((row, at));
        }
    }
    (rows, lagging)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        // A clock before 1970 makes every lag 0 rather than failing the round.
        .unwrap_or(0)
}
