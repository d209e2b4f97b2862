//! `stocksvr`: one binary for every processor and operator command.
//!
//! `stocksvr all` runs the HTTP listener and every processor in one process; each
//! processor can also run alone. Admin subcommands (`migrate`, `topics`, `schemas`) are
//! idempotent: running one twice changes nothing the second time.

mod admin;
mod event_log;
mod probes;
mod reservation_boot;
mod serve;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use stocksvr_pipeline::config::Settings;
use stocksvr_pipeline::telemetry;

#[derive(Parser)]
#[command(
    name = "stocksvr",
    version,
    about = "Dish inventory service: Redis Lua + MySQL state machine + Kafka"
)]
struct Cli {
    /// TOML configuration file; `STOCKSVR__SECTION__FIELD` variables override it.
    #[arg(long, global = true, env = "STOCKSVR_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the embedded MySQL migrations (a no-op when up to date).
    Migrate,
    /// Compare topics.yaml with the cluster, or apply it.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Register the embedded Avro schemas, or check them against the registry.
    Schemas {
        #[command(subcommand)]
        action: SchemasAction,
    },
    /// Run the HTTP listener and every processor in one process.
    All,
    /// Run only the event log processor: decodes and logs every inbound event,
    /// dead-letters records that cannot be decoded.
    EventLog,
    /// Produce one example payload from schemas/examples to its topic (for demos and smoke tests).
    Produce {
        /// Path of an example JSON payload, e.g. schemas/examples/OrderCreated.json.
        file: PathBuf,
    },
    /// Print the effective configuration with secrets masked.
    Config,
}

#[derive(Subcommand)]
enum TopicsAction {
    /// Create missing topics, raise partition counts, update configs; never delete.
    Apply,
    /// Show the differences between topics.yaml and the cluster; exits 1 on drift.
    Describe,
}

#[derive(Subcommand)]
enum SchemasAction {
    /// Register every schema under its subject and set BACKWARD compatibility.
    Register,
    /// Report what `register` would do; exits 1 if any schema is incompatible.
    Check,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stocksvr: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    telemetry::init_tracing(&settings.log);
    match run(cli.command, settings).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stocksvr: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match command {
        Command::Migrate => admin::migrate(&settings).await.map(|_| ExitCode::SUCCESS),
        Command::Topics {
            action: TopicsAction::Apply,
        } => admin::topics_apply(&settings).await,
        Command::Topics {
            action: TopicsAction::Describe,
        } => admin::topics_describe(&settings).await,
        Command::Schemas {
            action: SchemasAction::Register,
        } => admin::schemas_register(&settings).await,
        Command::Schemas {
            action: SchemasAction::Check,
        } => admin::schemas_check(&settings).await,
        Command::All => serve::run(settings, serve::Processors::All)
            .await
            .map(|_| ExitCode::SUCCESS),
        Command::EventLog => serve::run(settings, serve::Processors::EventLogOnly)
            .await
            .map(|_| ExitCode::SUCCESS),
        Command::Produce { file } => admin::produce_example(&settings, &file)
            .await
            .with_context(|| format!("producing {}", file.display()))
            .map(|_| ExitCode::SUCCESS),
        Command::Config => {
            println!("{}", serde_json::to_string_pretty(&settings)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
