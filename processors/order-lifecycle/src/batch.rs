//! What the handler reads once for a whole batch instead of once per event: each record's
//! decoded event (decoded here, once, and handed to the record's own handling), the inbox
//! keys of the batch's events, the orders with parked events, and the reservations of the
//! batch's orders (one query each, at once).

use crate::{OrderEvent, OrderLifecycle};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::consumer::{Failure, Record};
use stocksvr_reservation::ReservationService;
use stocksvr_store::order_events;
use stocksvr_store::reservations::Reservation;

/// The batch as read at its start. Both sets only ever grow during the batch from what this
/// handler itself writes (an order's events are all handled here, one after another), so
/// they answer as the per-event queries would.
pub(crate) struct BatchState<'a> {
    records: &'a [Record],
    /// Each record's decoded event (or why it is invalid), by batch position, until the
    /// record's handling takes it.
    events: Mutex<Vec<Option<Result<OrderEvent, Failure>>>>,
    /// Inbox keys of the batch's events handled before, and of those handled since.
    handled: Mutex<HashSet<String>>,
    /// The batch's orders with parked events, and those parked since.
    parked: Mutex<HashSet<u64>>,
    /// The reservations of the batch's orders as read with the batch, for each order's first
    /// event (taken by it): one read for the batch instead of one per order. Its later events
    /// read their rows again, as the first may have moved them.
    rows: Mutex<HashMap<u64, Vec<Reservation>>>,
}

impl<'a> BatchState<'a> {
    /// Decodes `records` and reads what they need from the inbox, the parked events and the
    /// reservations, in one query each, at once.
    pub(crate) async fn read(
        records: &'a [Record],
        service: &ReservationService,
        group: &str,
    ) -> Result<Self, Failure> {
        let events: Vec<Result<OrderEvent, Failure>> =
            records.iter().map(OrderLifecycle::decode).collect();
        let mut event_ids = Vec::with_capacity(records.len());
        let mut orders = Vec::with_capacity(records.len());
        // An undecodable record is judged (dead-lettered) when its turn comes.
        for event in events.iter().flatten() {
            if let Ok(order_id) = OrderLifecycle::order_id(event) {
                event_ids.push(event.event_id());
                orders.push(order_id);
            }
        }
        orders.sort_unstable();
        orders.dedup();
        let pool = service.pool();
        let (handled, parked, rows) = futures::try_join!(
            async {
                order_events::handled_many(pool, &event_ids, group)
                    .await
                    .map_err(|e| Failure::from_sqlx(&e))
            },
            async {
                order_events::orders_waiting(pool, group, &orders)
                    .await
                    .map_err(|e| Failure::from_sqlx(&e))
            },
            async { service.list_orders(&orders).await.map_err(|e| e.failure()) },
        )?;
        Ok(BatchState {
            records,
            events: Mutex::new(events.into_iter().map(Some).collect()),
            handled: Mutex::new(handled),
            parked: Mutex::new(parked),
            rows: Mutex::new(rows),
        })
    }

    /// The decoded event of `record`, one of this batch's, taken by its handling. A record
    /// handed over twice (or from elsewhere) is decoded again rather than refused.
    pub(crate) fn take_event(&self, record: &Record) -> Result<OrderEvent, Failure> {
        let at = self.records.iter().position(|r| std::ptr::eq(r, record));
        let decoded = at.and_then(|i| lock(&self.events).get_mut(i).and_then(Option::take));
        decoded.unwrap_or_else(|| OrderLifecycle::decode(record))
    }

    pub(crate) fn handled(&self, event_id: &str) -> bool {
        lock(&self.handled).contains(&order_events::inbox_key(event_id))
    }

    pub(crate) fn note_handled(&self, event_id: &str) {
        lock(&self.handled).insert(order_events::inbox_key(event_id));
    }

    pub(crate) fn has_parked(&self, order_id: u64) -> bool {
        lock(&self.parked).contains(&order_id)
    }

    pub(crate) fn note_parked(&self, order_id: u64) {
        lock(&self.parked).insert(order_id);
    }

    pub(crate) fn take_rows(&self, order_id: u64) -> Option<Vec<Reservation>> {
        lock(&self.rows).remove(&order_id)
    }
}

/// The rows an event is decided on from the batch's read (`read`, None when another event
/// of the order took them), or None when they must be read again ([`batch_read_usable`]).
pub(crate) fn usable_batch_rows<T>(
    read: Option<Vec<T>>,
    status: impl Fn(&T) -> Option<ReservationStatus>,
) -> Option<Vec<T>> {
    read.filter(|rows| batch_read_usable(rows.iter().map(status)))
}

/// Whether an order's rows as the batch read them (their statuses) may be decided on: not
/// when there were none yet, nor while a Try was still PREPARING (its RESERVED may have
/// landed since, and deciding on the old row would park the event for nothing).
fn batch_read_usable(statuses: impl IntoIterator<Item = Option<ReservationStatus>>) -> bool {
    let mut any = false;
    for status in statuses {
        if status == Some(ReservationStatus::Preparing) {
            return false;
        }
        any = true;
    }
    any
}

/// The sets are only touched between awaits, so a poisoned lock (a panic in another order's
/// task, which fails the batch anyway) still holds consistent data.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(rows: HashMap<u64, Vec<Reservation>>) -> BatchState<'static> {
        BatchState {
            records: &[],
            events: Mutex::new(Vec::new()),
            handled: Mutex::new(HashSet::new()),
            parked: Mutex::new(HashSet::new()),
            rows: Mutex::new(rows),
        }
    }

    #[test]
    fn an_order_decides_on_the_batch_read_only_with_rows_and_none_preparing() {
        use ReservationStatus::*;
        assert!(!batch_read_usable([]), "no row yet: read again");
        assert!(batch_read_usable([Some(Reserved)]));
        assert!(batch_read_usable([
            Some(Reserved),
            Some(CreatedReserved),
            Some(Confirmed)
        ]));
        assert!(!batch_read_usable([Some(Reserved), Some(Preparing)]));
        assert!(!batch_read_usable([Some(Preparing)]));
    }

    #[test]
    fn an_event_reads_again_unless_the_batch_read_rows_none_preparing() {
        use ReservationStatus::*;
        let status = |s: &ReservationStatus| Some(*s);
        assert_eq!(
            usable_batch_rows(Some(vec![Reserved, Confirmed]), status),
            Some(vec![Reserved, Confirmed])
        );
        assert_eq!(
            usable_batch_rows(Some(vec![Reserved, Preparing]), status),
            None
        );
        assert_eq!(usable_batch_rows(Some(Vec::new()), status), None);
        assert_eq!(
            usable_batch_rows(None, status),
            None,
            "taken by another event"
        );
    }

    #[test]
    fn each_record_is_handed_the_event_decoded_at_its_position_once() {
        use stocksvr_core::events::topics;
        use stocksvr_pipeline::codec::fuzz::{self, Preloaded};
        let preloaded = Preloaded::embedded();
        let example = fuzz::examples(&preloaded)
            .into_iter()
            .find(|e| e.file.starts_with("OrderCreated."))
            .expect("an OrderCreated example");
        let record = || {
            let decoded = preloaded
                .decode(Some(&example.framed))
                .expect("the example decodes");
            fuzz::record(topics::ORDER_LIFECYCLE, &example.framed, decoded)
        };
        let records = [record(), record()];
        // Markers no decode would give: what the batch read hands over, it did not decode again.
        let stored = |i: usize| Some(Err(Failure::Invalid(format!("decoded at {i}"))));
        let state = BatchState {
            records: &records,
            events: Mutex::new(vec![stored(0), stored(1)]),
            ..state(HashMap::new())
        };
        let is = |got: Result<OrderEvent, Failure>, want: &str| matches!(got, Err(Failure::Invalid(reason)) if reason == want);
        assert!(is(state.take_event(&records[1]), "decoded at 1"));
        assert!(is(state.take_event(&records[0]), "decoded at 0"));
        assert!(
            matches!(state.take_event(&records[0]), Ok(OrderEvent::Created(_))),
            "taken twice: decoded again"
        );
    }

    #[test]
    fn only_the_first_event_of_an_order_takes_the_rows_the_batch_read() {
        let state = state(HashMap::from([(7, Vec::new()), (8, Vec::new())]));
        assert!(state.take_rows(7).is_some());
        assert!(state.take_rows(7).is_none(), "a later event reads afresh");
        assert!(state.take_rows(8).is_some(), "another order keeps its own");
        assert!(state.take_rows(9).is_none());
    }
}
