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

/// Installs the Prometheus recorder once per process and returns its render handle.
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
