//! A recorder that keeps every value in memory, for tests that assert what a part emitted.
//!
//! Install it for one test with `metrics::set_default_local_recorder(&capture)` (a guard,
//! for async tests on the default current-thread runtime: every task then records on the
//! test's thread) or `metrics::with_local_recorder`. Tests of different parts then never
//! see each other's values, unlike with the process-wide Prometheus recorder.
//!
//! ```
//! let capture = stocksvr_telemetry::testing::Capture::default();
//! metrics::with_local_recorder(&capture, || {
//!     metrics::counter!("stocksvr_x_total", "topic" => "t").increment(2);
//!     metrics::histogram!("stocksvr_y_seconds").record(0.5);
//! });
//! assert_eq!(capture.counter("stocksvr_x_total", &[("topic", "t")]), Some(2));
//! assert_eq!(capture.histogram("stocksvr_y_seconds", &[]), vec![0.5]);
//! ```

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Labels as sorted (name, value) pairs: the identity of a series with its name.
pub type LabelSet = Vec<(String, String)>;

#[derive(Debug, Default)]
struct Cell {
    counter: Mutex<u64>,
    gauge: Mutex<f64>,
    samples: Mutex<Vec<f64>>,
}

/// A panic in another test thread must not hide this one's values.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        *lock(&self.counter) += value;
    }
    fn absolute(&self, value: u64) {
        let mut c = lock(&self.counter);
        *c = (*c).max(value);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        *lock(&self.gauge) += value;
    }
    fn decrement(&self, value: f64) {
        *lock(&self.gauge) -= value;
    }
    fn set(&self, value: f64) {
        *lock(&self.gauge) = value;
    }
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        lock(&self.samples).push(value);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One series: its type, name and labels.
type SeriesKey = (Kind, String, LabelSet);

/// The in-memory recorder. Cloning shares the values.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    cells: Arc<Mutex<BTreeMap<SeriesKey, Arc<Cell>>>>,
}

fn label_set(labels: &[(&str, &str)]) -> LabelSet {
    let mut set: LabelSet = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    set.sort();
    set
}

impl Capture {
    fn cell(&self, kind: Kind, key: &Key) -> Arc<Cell> {
        let mut labels: LabelSet = key
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        labels.sort();
        lock(&self.cells)
            .entry((kind, key.name().to_string(), labels))
            .or_default()
            .clone()
    }

    fn get(&self, kind: Kind, name: &str, labels: &[(&str, &str)]) -> Option<Arc<Cell>> {
        lock(&self.cells)
            .get(&(kind, name.to_string(), label_set(labels)))
            .cloned()
    }

    /// The counter with exactly these labels, if it was ever touched.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        self.get(Kind::Counter, name, labels)
            .map(|c| *lock(&c.counter))
    }

    /// The gauge with exactly these labels, if it was ever touched.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.get(Kind::Gauge, name, labels).map(|c| *lock(&c.gauge))
    }

    /// Every value recorded into the histogram with exactly these labels, in order.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.get(Kind::Histogram, name, labels)
            .map(|c| lock(&c.samples).clone())
            .unwrap_or_default()
    }

    /// The label sets `name` was touched with, whatever its kind.
    pub fn label_sets(&self, name: &str) -> Vec<LabelSet> {
        lock(&self.cells)
            .keys()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, labels)| labels.clone())
            .collect()
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(Kind::Counter, key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(Kind::Gauge, key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(Kind::Histogram, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_each_series_apart_and_labels_in_any_order() {
        let capture = Capture::default();
        metrics::with_local_recorder(&capture, || {
            metrics::counter!("c_total", "a" => "1", "b" => "2").increment(1);
            metrics::counter!("c_total", "b" => "2", "a" => "1").increment(2);
            metrics::counter!("c_total", "a" => "x", "b" => "2").increment(5);
            metrics::gauge!("g").set(3.0);
            metrics::gauge!("g").decrement(1.0);
        });
        assert_eq!(
            capture.counter("c_total", &[("b", "2"), ("a", "1")]),
            Some(3)
        );
        assert_eq!(
            capture.counter("c_total", &[("a", "x"), ("b", "2")]),
            Some(5)
        );
        assert_eq!(capture.counter("c_total", &[]), None);
        assert_eq!(capture.gauge("g", &[]), Some(2.0));
        assert_eq!(capture.label_sets("c_total").len(), 2);
    }
}
