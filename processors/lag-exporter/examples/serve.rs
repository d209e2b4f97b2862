//! The lag exporter alone with a bare `/metrics` endpoint, until `stocksvr lag-exporter`
//! exists: used by tests/observability/live.sh for its real run.
//!
//!     cargo run -p stocksvr-lag-exporter --example serve -- 127.0.0.1:9309 stocksvr. [interval_secs]
//!
//! Kafka settings come from `STOCKSVR__KAFKA__...` like the binary's. Stops on SIGTERM/Ctrl-C.

use stocksvr_lag_exporter::LagExporterConfig;
use stocksvr_pipeline::config::Settings;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let listen = args.get(1).map_or("127.0.0.1:9309", String::as_str);
    let config = LagExporterConfig {
        group_prefix: args.get(2).cloned().unwrap_or_default(),
        interval_secs: args.get(3).map_or(Ok(5), |s| s.parse())?,
        ..LagExporterConfig::default()
    };
    let settings = Settings::load(None)?;
    stocksvr_pipeline::telemetry::init_tracing(&settings.log);
    let metrics = stocksvr_pipeline::telemetry::init_metrics();
    let listener = TcpListener::bind(listen).await?;
    eprintln!("lag exporter example: /metrics on http://{listen}");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let exporter =
        tokio::spawn(
            async move { stocksvr_lag_exporter::run(&settings.kafka, config, stop_rx).await },
        );
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.render() }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let _ = stop_tx.send(true);
    server.abort();
    exporter.await??;
    Ok(())
}
