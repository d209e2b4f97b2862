//! `stocksvr dlq list|show|replay|discard`: the operator's view of parked dead letters.
//!
//! Exit status: 0 done (a repeated discard included), 1 when the id does not exist or the
//! action was refused (the reason goes to stderr); errors leave through `main` as usual.

use crate::preview::{as_text, hex_preview};
use crate::store::{self, DlqError, Filter, Parked, ParkedSummary, Status};
use crate::{replay, DiscardOutcome};
use anyhow::Context;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::InfraSettings;
use stocksvr_pipeline::deadletter::headers;
use stocksvr_pipeline::json::avro_to_json;

/// Bytes of key and value shown by `show`.
const PREVIEW_BYTES: usize = 256;
/// Characters of the error shown per `list` line.
const ERROR_CHARS: usize = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusArg {
    Parked,
    Replayed,
    Discarded,
    All,
}

impl StatusArg {
    fn status(self) -> Option<Status> {
        match self {
            StatusArg::Parked => Some(Status::Parked),
            StatusArg::Replayed => Some(Status::Replayed),
            StatusArg::Discarded => Some(Status::Discarded),
            StatusArg::All => None,
        }
    }
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DlqAction {
    /// List dead letters, oldest first.
    List {
        /// Which dead letters to list.
        #[arg(long, value_enum, default_value = "parked")]
        status: StatusArg,
        /// Only dead letters of this original topic.
        #[arg(long)]
        topic: Option<String>,
        /// Page size (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only ids above this one: the last id of the previous page.
        #[arg(long)]
        after: Option<u64>,
    },
    /// Show one dead letter: origin, error, key and value bytes, the decoded value.
    Show { id: u64 },
    /// Produce the dead letter's key and bytes to its original topic and partition.
    Replay {
        id: u64,
        /// Replay even if it was replayed or discarded before.
        #[arg(long)]
        force: bool,
    },
    /// Mark a parked dead letter as never to be applied.
    Discard {
        id: u64,
        /// Why; written to the log with the id.
        #[arg(long)]
        reason: String,
    },
}

pub async fn run_cli(settings: &InfraSettings, action: DlqAction) -> anyhow::Result<ExitCode> {
    // One connection: a command does one thing at a time.
    let pool = stocksvr_store::mysql_pool(
        settings.mysql.url.expose(),
        1,
        Duration::from_millis(settings.mysql.acquire_timeout_ms),
    )?;
    match action {
        DlqAction::List {
            status,
            topic,
            limit,
            after,
        } => {
            let filter = Filter {
                status: status.status(),
                original_topic: topic,
                limit,
                after_id: after,
            };
            let rows = store::list(&pool, &filter)
                .await
                .context("listing dead letters")?;
            if rows.is_empty() {
                println!("no dead letters match");
            } else {
                print!("{}", summary_table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqAction::Show { id } => {
            let Some(parked) = store::show(&pool, id)
                .await
                .context("reading dead letter")?
            else {
                return refused(DlqError::NotFound(id));
            };
            let codec = AvroCodec::new(
                &settings.registry,
                Arc::new(Catalog::for_deployment(&settings.kafka)?),
            )?;
            print!("{}", describe(&parked));
            println!("decoded:");
            println!(
                "{}",
                indent(&decoded(&codec, parked.value.as_deref()).await)
            );
            Ok(ExitCode::SUCCESS)
        }
        DlqAction::Replay { id, force } => {
            let producer = replay::replay_producer(&settings.kafka)?;
            match replay::replay(&pool, &producer, id, force).await {
                Ok(done) => {
                    println!(
                        "replayed dead letter {id} to {}/{}@{} (was {})",
                        done.topic, done.partition, done.offset, done.previous
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => outcome_error(e),
            }
        }
        DlqAction::Discard { id, reason } => match store::discard(&pool, id, &reason).await {
            Ok(DiscardOutcome { changed: true, .. }) => {
                println!("discarded dead letter {id}");
                Ok(ExitCode::SUCCESS)
            }
            Ok(DiscardOutcome { changed: false, .. }) => {
                println!("dead letter {id} was already discarded");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => outcome_error(e),
        },
    }
}

/// An answer about the dead letter (missing, refused) exits 1 with the reason; an
/// infrastructure failure is an error for `main` to report.
fn outcome_error(e: DlqError) -> anyhow::Result<ExitCode> {
    match e {
        DlqError::NotFound(_)
        | DlqError::ReplayRefused { .. }
        | DlqError::DiscardRefused { .. }
        | DlqError::NotReplayable { .. } => refused(e),
        other => Err(other.into()),
    }
}

fn refused(e: DlqError) -> anyhow::Result<ExitCode> {
    eprintln!("stocksvr: {e}");
    Ok(ExitCode::FAILURE)
}

/// Control characters (newlines in a stack trace, terminal escapes) would break the table.
fn one_line(text: &str, max_chars: usize) -> String {
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max_chars)
        .collect();
    if text.chars().count() > max_chars {
        line.push('…');
    }
    line
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn summary_table(rows: &[ParkedSummary]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                r.status.to_string(),
                r.original_topic.clone(),
                r.original_partition.to_string(),
                r.original_offset.to_string(),
                r.error_class.clone(),
                one_line(&r.error_message, ERROR_CHARS),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "PARKED AT (UTC)",
            "STATUS",
            "ORIGINAL TOPIC",
            "PARTITION",
            "OFFSET",
            "ERROR CLASS",
            "ERROR",
        ],
        &cells,
    )
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn bytes_section(name: &str, bytes: Option<&[u8]>) -> String {
    match bytes {
        None => format!("{name}: none\n"),
        Some(b) => {
            let mut out = format!("{name}: {} bytes\n", b.len());
            if let Some(text) = as_text(&b[..b.len().min(PREVIEW_BYTES)]) {
                out.push_str(&format!("  utf8: {}\n", one_line(text, PREVIEW_BYTES)));
            }
            out.push_str(&indent(&hex_preview(b, PREVIEW_BYTES)));
            out.push('\n');
            out
        }
    }
}

/// Everything `show` prints except the decoded value. Pure, so it is unit-tested.
fn describe(p: &Parked) -> String {
    let s = &p.summary;
    let original_timestamp = p
        .original_timestamp_ms
        .map(|ms| {
            chrono::DateTime::from_timestamp_millis(ms)
                .map(|t| format!("{ms} ({})", t.format("%Y-%m-%d %H:%M:%S%.3f UTC")))
                .unwrap_or_else(|| ms.to_string())
        })
        .unwrap_or_else(|| "none".into());
    let mut out = format!(
        "dead letter {}: {}\n\
         parked at:    {}\n\
         updated at:   {}\n\
         dead letter:  {}/{}@{}\n\
         headers:\n",
        s.id,
        s.status,
        s.created_at.format("%Y-%m-%d %H:%M:%S%.3f UTC"),
        s.updated_at.format("%Y-%m-%d %H:%M:%S%.3f UTC"),
        s.dlt_topic,
        s.dlt_partition,
        s.dlt_offset,
    );
    let offset = if s.original_offset < 0 {
        "unknown".to_string()
    } else {
        s.original_offset.to_string()
    };
    for (name, value) in [
        (headers::ORIGINAL_TOPIC, s.original_topic.clone()),
        (
            headers::ORIGINAL_PARTITION,
            s.original_partition.to_string(),
        ),
        (headers::ORIGINAL_OFFSET, offset),
        (headers::ORIGINAL_TIMESTAMP, original_timestamp),
        (headers::CONSUMER_GROUP, p.consumer_group.clone()),
        (headers::ERROR_CLASS, s.error_class.clone()),
        (headers::ERROR_MESSAGE, s.error_message.clone()),
    ] {
        // Continuation lines (a stack trace) stay under the value; other control
        // characters could drive the terminal, so they are shown as spaces.
        let value = value
            .lines()
            .map(|l| one_line(l, usize::MAX))
            .collect::<Vec<_>>()
            .join(&format!("\n  {:32} ", ""));
        out.push_str(&format!("  {name:<32} {value}\n"));
    }
    out.push_str(&bytes_section("key", p.key.as_deref()));
    out.push_str(&bytes_section("value", p.value.as_deref()));
    out
}

/// The value as JSON if the registry knows its schema, else why not.
async fn decoded(codec: &AvroCodec, value: Option<&[u8]>) -> String {
    match codec.decode(value).await {
        Ok(d) => {
            let json = serde_json::to_string_pretty(&avro_to_json(&d.value))
                .unwrap_or_else(|e| format!("(not printable: {e})"));
            format!("{} (schema id {})\n{json}", d.full_name, d.schema_id)
        }
        Err(e) => format!("not decodable: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn summary(id: u64, error: &str) -> ParkedSummary {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 29, 8, 0, 0)
            .single()
            .expect("valid");
        ParkedSummary {
            id,
            status: Status::Parked,
            dlt_topic: "order.lifecycle.v1.dlt".into(),
            dlt_partition: 2,
            dlt_offset: 9,
            original_topic: "order.lifecycle.v1".into(),
            original_partition: 2,
            original_offset: 1234,
            error_class: "invalid".into(),
            error_message: error.into(),
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn list_table_is_aligned_and_cuts_the_error() {
        let long = format!("line one\nline two {}", "x".repeat(100));
        let out = summary_table(&[summary(7, "short"), summary(1234, &long)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        let column = |l: &str| l.find("2026").expect("date");
        assert_eq!(column(lines[1]), column(lines[2]));
        assert_eq!(lines[0].find("PARKED"), Some(column(lines[1])));
        assert!(lines[2].contains("line one line two"));
        let error = &lines[2][lines[2].find("line one").expect("error")..];
        assert_eq!(error.chars().count(), ERROR_CHARS + 1, "80 chars and …");
    }

    #[test]
    fn show_prints_headers_and_byte_previews() {
        let parked = Parked {
            summary: summary(7, "wrong magic byte 0x7b\n  at line 2\x1b[2J"),
            original_timestamp_ms: Some(1_700_000_000_123),
            consumer_group: "stocksvr.order-lifecycle".into(),
            key: Some(b"order-1".to_vec()),
            value: Some(b"{\"not\":\"avro\"}".to_vec()),
        };
        let out = describe(&parked);
        for expected in [
            "dead letter 7: parked",
            "stocksvr.dlt.original-offset     1234",
            "stocksvr.dlt.original-timestamp  1700000000123 (2023-11-14 22:13:20.123 UTC)",
            "stocksvr.dlt.consumer-group      stocksvr.order-lifecycle",
            "stocksvr.dlt.error-message       wrong magic byte 0x7b\n                                     at line 2 [2J\n",
            "key: 7 bytes",
            "utf8: order-1",
            "00000000  6f 72 64 65 72 2d 31",
            "value: 14 bytes",
        ] {
            assert!(out.contains(expected), "{expected:?} missing in:\n{out}");
        }
        let tombstone = Parked {
            key: None,
            value: None,
            ..parked
        };
        assert!(describe(&tombstone).contains("key: none\nvalue: none\n"));
    }
}
