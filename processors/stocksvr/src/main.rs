//! `stocksvr`: one binary for every processor and operator command.
//!
//! `stocksvr all` runs the HTTP listener and every processor in one process; each
//! processor can also run alone. Admin subcommands (`migrate`, `topics`, `schemas`) are
//! idempotent: running one twice changes nothing the second time.

mod admin;
mod connect;
mod offsets_cmd;
mod rebuild_cmd;
mod reconcile_cmd;
mod stock_cmd;
mod token_cmd;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use stocksvr::serve;
use stocksvr::{Roles, Settings};
use stocksvr_pipeline::telemetry;

// jemalloc rather than glibc's malloc: after a burst (a fresh group catching up on a
// backlog, 500 orders/s) glibc kept `stocksvr all` at 130-290 MB for good, fragmented over
// its arenas; jemalloc hands freed pages back and the same bench run idled at 63 MB
// (scripts/bench, README "Benchmark").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// jemalloc keeps freed pages ("dirty") for reuse and hands them back after a decay time
// (default 10 s; its background thread purges them whether or not anything allocates). Under
// overload that cache is most of what is above the live data. `scripts/bench --only http`,
// same binary, quiet machine, decay set through `_RJEM_MALLOC_CONF`: RSS peak at 1,024
// connections / hot Try at 64 connections / stocksvr CPU per Try were 118 MB / 2,683 per s /
// 231 us with 10 s, 100 MB / 2,802 / 239 us with 1 s, 95 MB / 2,856 / 231 us with 300 ms,
// and 85 MB / 2,487 / 298 us with 0 (every freed page handed back at once: a madvise and a
// page fault per reuse). Two arenas, not jemalloc's 4 per CPU (8 on 2 cores): each arena
// keeps its own free pages. Read by jemalloc at its first allocation (the name is the
// prefixed one tikv-jemalloc-sys builds on Linux); `_RJEM_MALLOC_CONF` overrides it.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 52] = b"background_thread:true,narenas:2,dirty_decay_ms:300\0";

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
    /// Run the Try API and the order-lifecycle processor (instances share the partitions).
    OrderLifecycle,
    /// Run scheduled confirms: the time wheel poller, the due-reservation scan and the
    /// schedule processor (instances share the wheel and the partitions).
    Schedule,
    /// Run only the outbox relay (several relays never publish a row twice in normal operation).
    OutboxRelay,
    /// Run only the stock projector (instances share the partitions).
    Projector,
    /// Run only the dead-letter processor: parks every dead letter in MySQL.
    DeadLetter,
    /// Run only the lag exporter: committed offsets, high watermarks and lag (records and
    /// seconds) of every consumer group of this deployment, read from the broker, on /metrics.
    LagExporter,
    /// Parked dead letters: list, show, replay to the original topic, discard.
    Dlq {
        #[command(subcommand)]
        action: stocksvr_dead_letter::DlqAction,
    },
    /// Produce one example payload from schemas/examples to its topic (for demos and smoke tests).
    Produce {
        /// JSON payload file (plain JSON, as in schemas/examples), or `-` for standard input.
        file: PathBuf,
        /// Event name (e.g. OrderCreated); default: the file name up to its first dot.
        #[arg(long)]
        event: Option<String>,
    },
    /// Stock buckets: init, adjust, close, archive, show (through the operation WAL).
    Bucket {
        #[command(subcommand)]
        action: stock_cmd::BucketAction,
    },
    /// Stock operations in the WAL: list them, retry one now.
    Ops {
        #[command(subcommand)]
        action: stock_cmd::OpsAction,
    },
    /// Stuck and dead reservations: list them, retry one now.
    Reservations {
        #[command(subcommand)]
        action: stock_cmd::ReservationsAction,
    },
    /// Show a consumer group's committed offsets and lag, or move them (a dry run unless
    /// --execute; refuses while the group has active members).
    Offsets {
        #[command(subcommand)]
        action: offsets_cmd::OffsetsAction,
    },
    /// Compare every live bucket's Redis numbers with the reservation table and the ledger
    /// (and the snapshot): two passes a few seconds apart, a table of the three views. A
    /// dry run unless --repair. Exit 0 clean, 1 differences or lost buckets, 2 error.
    Reconcile(reconcile_cmd::ReconcileArgs),
    /// Print the effective configuration with secrets masked.
    Config,
    /// Bearer tokens of the API's callers: hash one for http.auth, or make a new one.
    Token {
        #[command(subcommand)]
        action: token_cmd::TokenAction,
    },
    /// The least-privilege Kafka ACLs of this deployment's roles.
    Acls {
        #[command(subcommand)]
        action: AclsAction,
    },
}

#[derive(Subcommand)]
enum AclsAction {
    /// Print them as `kafka-acls` commands (the form `scripts/stack acls apply` reads).
    Print {
        /// The role whose ACLs to print.
        #[arg(long, value_enum, default_value = "all")]
        role: stocksvr::acls::Role,
        /// The principal's name (`User:<name>`) instead of the role's default; not with
        /// `--role all`.
        #[arg(long)]
        principal: Option<String>,
    },
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

/// `stocksvr acls print`.
fn acls(settings: &Settings, action: AclsAction) -> anyhow::Result<std::process::ExitCode> {
    let AclsAction::Print { role, principal } = action;
    if principal.is_some() && role == stocksvr::acls::Role::All {
        anyhow::bail!("--principal names one role's principal: give --role too");
    }
    let text = stocksvr::acls::print(role, &settings.kafka, principal.as_deref())?;
    print!("{text}");
    Ok(std::process::ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Before any TLS client exists: the one rustls provider (see stocksvr_pipeline::tls).
    stocksvr_pipeline::tls::install_crypto_provider();
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stocksvr: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    telemetry::init_tracing(&settings.log);
    stocksvr_store::deadline::set_statement_deadline(std::time::Duration::from_millis(
        settings.mysql.statement_timeout_ms,
    ));
    match run(cli.command, settings).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stocksvr: {}", chain_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: ` between them, as anyhow's `{:#}` writes them but without
/// a cause the text before it already ends with: sqlx's and redis' errors print their
/// source inside their own message, so `{:#}` said `1045 (28000): Access denied …` three
/// times in a row.
fn chain_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
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
        Command::All => serve::run_until_signal(settings, Roles::ALL)
            .await
            .map(|_| ExitCode::SUCCESS),
        Command::Dlq { action } => stocksvr_dead_letter::run_cli(&settings.infra(), action).await,
        Command::DeadLetter => serve::run_until_signal(
            settings,
            Roles {
                dead_letter: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::LagExporter => serve::run_until_signal(
            settings,
            Roles {
                lag_exporter: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::Projector => serve::run_until_signal(
            settings,
            Roles {
                projector: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::Schedule => serve::run_until_signal(
            settings,
            Roles {
                schedule: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::OutboxRelay => serve::run_until_signal(
            settings,
            Roles {
                relay: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::OrderLifecycle => serve::run_until_signal(
            settings,
            Roles {
                reservations: true,
                ..Roles::NONE
            },
        )
        .await
        .map(|_| ExitCode::SUCCESS),
        Command::Bucket { action } => stock_cmd::bucket(&settings, action).await,
        Command::Reconcile(args) => match reconcile_cmd::reconcile(&settings, args).await {
            Ok(code) => Ok(code),
            Err(e) => {
                eprintln!("stocksvr reconcile: {e:#}");
                Ok(ExitCode::from(2))
            }
        },
        Command::Ops { action } => stock_cmd::operations(&settings, action).await,
        Command::Reservations { action } => stock_cmd::reservations(&settings, action).await,
        Command::Produce { file, event } => {
            admin::produce_example(&settings, &file, event.as_deref())
                .await
                .with_context(|| format!("producing {}", file.display()))
                .map(|_| ExitCode::SUCCESS)
        }
        Command::Offsets { action } => offsets_cmd::run(&settings, action).await,
        Command::Token { action } => token_cmd::run(action),
        Command::Acls { action } => acls(&settings, action),
        Command::Config => {
            println!("{}", serde_json::to_string_pretty(&settings)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chain_text;

    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("1045: Access denied")
        }
    }
    impl std::error::Error for Inner {}

    /// An error that prints its source inside its own message, as sqlx's do.
    #[derive(Debug)]
    struct Outer(Inner);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "mysql: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let e = anyhow::Error::new(Outer(Inner)).context("connecting to mysql://u:***@h/db");
        assert_eq!(
            chain_text(&e),
            "connecting to mysql://u:***@h/db: mysql: 1045: Access denied"
        );
        assert_eq!(
            format!("{e:#}"),
            "connecting to mysql://u:***@h/db: mysql: 1045: Access denied: 1045: Access denied",
            "what anyhow alone writes"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(chain_text(&plain), "outer: inner");
    }
}
