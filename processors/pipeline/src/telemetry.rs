//! Logging and metrics set-up, and the names of the metrics declared in one place.

use crate::config::{LogFormat, LogSettings};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

pub use stocksvr_telemetry::names;

/// Installs the global tracing subscriber. `RUST_LOG` wins over the configured filter.
pub fn init_tracing(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into files or log shippers.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // try_init: a second call (tests, embedded use) keeps the first subscriber.
    let _ = match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// How often the histogram samples recorded since the last drain are folded into their
/// buckets (what the exporter's own upkeep task does, which `build_recorder` does not start).
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The upkeep thread, once [`init_metrics`] started it.
static UPKEEP: std::sync::OnceLock<std::thread::JoinHandle<()>> = std::sync::OnceLock::new();

/// Runs `upkeep` every `every` on a thread of its own (`name`) for the life of the process: no
/// runtime needed, and a sleeping thread costs nothing between rounds.
fn spawn_upkeep(
    name: &str,
    every: std::time::Duration,
    upkeep: impl Fn() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            std::thread::sleep(every);
            upkeep();
        })
}

/// Installs the Prometheus recorder once per process and returns its render handle, and
/// starts the thread that drains its histogram samples ([`UPKEEP_EVERY`]).
pub fn init_metrics() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Every histogram is a latency in seconds: real buckets, so p50/p99 come from
            // histogram_quantile() over any window and across instances.
            let builder = PrometheusBuilder::new();
            let builder = builder
                .set_buckets(stocksvr_telemetry::LATENCY_BUCKETS)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // The recorder keeps every histogram sample until something drains it: a
            // scrape does, and so must this upkeep, or a process nobody scrapes (Prometheus
            // down, a deployment without it) grows by every sample it records. At 2,300 Trys
            // a second that was 0.27 MB a second, without end; one scrape gave 33 MB back.
            let drained = handle.clone();
            match spawn_upkeep("metrics-upkeep", UPKEEP_EVERY, move || {
                drained.run_upkeep()
            }) {
                Ok(thread) => {
                    let _ = UPKEEP.set(thread);
                }
                Err(e) => tracing::warn!(error = %e, "could not start the metrics upkeep thread; histogram samples are drained only by scrapes of /metrics"),
            }
            // Fails only if another recorder is installed; then this handle renders ours
            // without being global, which keeps tests in one process working.
            let _ = metrics::set_global_recorder(recorder);
            // Help text for everything, and every series with known labels at zero.
            stocksvr_telemetry::register();
            metrics::gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            handle
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn the_upkeep_runs_again_and_again_without_a_scrape() {
        let (tx, rx) = mpsc::channel();
        spawn_upkeep("upkeep-test", Duration::from_millis(10), move || {
            let _ = tx.send(());
        })
        .expect("thread");
        for round in 0..3 {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("upkeep round {round} never ran"));
        }
    }

    #[test]
    fn installing_the_recorder_starts_its_upkeep_thread() {
        let _ = init_metrics();
        let thread = UPKEEP.get().expect("init_metrics started no upkeep thread");
        assert_eq!(thread.thread().name(), Some("metrics-upkeep"));
        assert!(!thread.is_finished(), "the upkeep thread ended");
    }
}
