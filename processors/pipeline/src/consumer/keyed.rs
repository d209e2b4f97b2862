//! Records of different keys at once, each key's records in partition order: what a
//! [`RecordHandler`](super::RecordHandler) does with a batch, and what a batch-preparing
//! [`Handler`](super::Handler) calls after its preparation.

use super::{Applied, Failure, Record};
use futures::StreamExt;
use rdkafka::message::Message;
use std::collections::HashMap;

/// What [`RecordHandler`](super::RecordHandler) does with a batch, for a
/// [`Handler`](super::Handler) that prepares the batch first (one query for all its
/// records, say) and then handles record by record: records of different keys `width` at a
/// time, records of one (topic, partition, key) one after another in partition order. The
/// results are in batch order up to the first record whose dependency is unavailable (its
/// result is the last one), as [`Handler::handle`](super::Handler::handle) answers.
pub async fn by_key<'a, F, Fut>(
    batch: &'a [Record],
    width: usize,
    handle_one: F,
) -> Vec<Result<Applied, Failure>>
where
    F: Fn(&'a Record) -> Fut,
    Fut: std::future::Future<Output = Result<Applied, Failure>>,
{
    let width = width.max(1);
    if width == 1 || batch.len() == 1 {
        let mut results = Vec::with_capacity(batch.len());
        for record in batch {
            let result = handle_one(record).await;
            let stop = matches!(result, Err(Failure::Unavailable { .. }));
            results.push(result);
            if stop {
                break;
            }
        }
        return results;
    }
    // One chain of batch positions per (topic, partition, key), in partition order.
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: HashMap<(&str, i32, Option<&[u8]>), usize> = HashMap::new();
    for (i, record) in batch.iter().enumerate() {
        let key = (record.topic(), record.partition(), record.message.key());
        let chain = *chain_of.entry(key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(i);
    }
    let handle_one = &handle_one;
    let outcomes: Vec<Vec<(usize, Result<Applied, Failure>)>> =
        futures::stream::iter(chains.into_iter().map(|chain| async move {
            let mut done = Vec::with_capacity(chain.len());
            for i in chain {
                let result = handle_one(&batch[i]).await;
                let stop = matches!(result, Err(Failure::Unavailable { .. }));
                done.push((i, result));
                if stop {
                    break;
                }
            }
            done
        }))
        .buffer_unordered(width)
        .collect()
        .await;
    let mut slots: Vec<Option<Result<Applied, Failure>>> = batch.iter().map(|_| None).collect();
    for (i, result) in outcomes.into_iter().flatten() {
        slots[i] = Some(result);
    }
    // The results in batch order up to the first record that could not be handled: the
    // loop stores offsets up to there and retries from it.
    let mut results = Vec::with_capacity(batch.len());
    for slot in slots {
        let Some(result) = slot else { break };
        let stop = matches!(result, Err(Failure::Unavailable { .. }));
        results.push(result);
        if stop {
            break;
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Decoded;
    use crate::consumer::{Dependency, Handler, RecordHandler};
    use futures::future::BoxFuture;
    use futures::FutureExt;
    use rdkafka::message::{OwnedMessage, Timestamp};
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::sync::Notify;

    fn record(key: &str, offset: i64) -> Record {
        Record {
            message: OwnedMessage::new(
                None,
                Some(key.as_bytes().to_vec()),
                "orders".into(),
                Timestamp::NotAvailable,
                0,
                offset,
                None,
            ),
            event: Decoded {
                schema_id: 1,
                full_name: "t".into(),
                value: apache_avro::types::Value::Null,
            },
        }
    }

    /// Records `(offset, start|end)`; offset 1 waits until offset 2 (another key) started,
    /// which only happens when keys run at once; offset 4 is unavailable.
    struct Probe {
        width: usize,
        log: Mutex<Vec<(i64, &'static str)>>,
        second_started: Notify,
    }

    impl RecordHandler for Probe {
        fn handle_one<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Applied, Failure>> {
            async move {
                let offset = record.offset();
                self.log.lock().expect("log").push((offset, "start"));
                if offset == 2 {
                    self.second_started.notify_one();
                }
                if offset == 1 && self.width > 1 {
                    self.second_started.notified().await;
                }
                tokio::task::yield_now().await;
                self.log.lock().expect("log").push((offset, "end"));
                if offset == 4 {
                    return Err(Failure::unavailable(Dependency::Mysql, "down"));
                }
                Ok(Applied::Applied)
            }
            .boxed()
        }

        fn concurrency(&self) -> usize {
            self.width
        }
    }

    #[tokio::test]
    async fn keys_run_at_once_each_keys_records_in_order_and_results_stop_at_an_outage() {
        // Key a: offsets 0, 1, 3; key b: 2, 4 (unavailable), 5 (never tried).
        let batch = vec![
            record("a", 0),
            record("a", 1),
            record("b", 2),
            record("a", 3),
            record("b", 4),
            record("b", 5),
        ];
        let probe = Probe {
            width: 8,
            log: Mutex::new(Vec::new()),
            second_started: Notify::new(),
        };
        let results = tokio::time::timeout(Duration::from_secs(10), probe.handle(&batch))
            .await
            .expect("keys ran at once (offset 1 waits for offset 2)")
            .expect("batch");
        // Offsets 0..=4 have results; 4 is the outage, so nothing after it counts, although
        // offset 3 (key a, not blocked) was applied and will simply be handled again.
        assert_eq!(results.len(), 5);
        assert!(results[..4]
            .iter()
            .all(|r| matches!(r, Ok(Applied::Applied))));
        assert!(matches!(results[4], Err(Failure::Unavailable { .. })));
        let log = probe.log.lock().expect("log").clone();
        let started = |o: i64| log.iter().position(|e| *e == (o, "start"));
        let ended = |o: i64| log.iter().position(|e| *e == (o, "end"));
        for (before, after) in [(0, 1), (1, 3), (2, 4)] {
            assert!(
                ended(before) < started(after),
                "{before} must end before {after} starts: {log:?}"
            );
        }
        assert_eq!(started(5), None, "a key stops at its outage: {log:?}");

        // Width 1 is the plain sequence, stopping at the outage.
        let probe = Probe {
            width: 1,
            log: Mutex::new(Vec::new()),
            second_started: Notify::new(),
        };
        let results = probe.handle(&batch).await.expect("batch");
        assert_eq!(results.len(), 5);
        let order: Vec<i64> = probe
            .log
            .lock()
            .expect("log")
            .iter()
            .filter(|e| e.1 == "start")
            .map(|e| e.0)
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }
}
