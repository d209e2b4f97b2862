//! `stocksvr offsets show|reset`: read and move a consumer group's committed offsets.
//!
//! `reset` is a dry run unless `--execute`: it prints each partition's current and new offset
//! and changes nothing. With `--execute` it refuses (exit 1) while the group has members, so
//! stop the group's processors first. Reprocessing is safe because every effect is
//! idempotent; this command only moves offsets.

use anyhow::Context;
use chrono::{DateTime, FixedOffset};
use clap::{ArgGroup, Subcommand};
use std::process::ExitCode;
use stocksvr::Settings;
use stocksvr_pipeline::offsets::{self, OffsetsError, PartitionOffsets, ResetPlan, ResetTarget};

#[derive(Debug, Subcommand)]
pub enum OffsetsAction {
    /// Print a group's committed offset, the watermarks and the lag of each partition.
    Show {
        /// Consumer group id.
        #[arg(long)]
        group: String,
        /// Only this topic; without it, every topic the group has committed offsets for.
        #[arg(long)]
        topic: Option<String>,
    },
    /// Move a group's committed offsets of one topic. A dry run unless --execute.
    #[command(group(
        ArgGroup::new("target")
            .required(true)
            .multiple(false)
            .args(["to_earliest", "to_latest", "to_datetime", "to_offset", "shift_by"])
    ))]
    Reset {
        /// Consumer group id.
        #[arg(long)]
        group: String,
        /// Topic whose offsets move.
        #[arg(long)]
        topic: String,
        /// To the first offset still stored (reprocess everything).
        #[arg(long)]
        to_earliest: bool,
        /// To the end (skip everything not yet read).
        #[arg(long)]
        to_latest: bool,
        /// To the first record with a timestamp at or after this RFC 3339 time,
        /// e.g. 2024-05-01T08:00:00Z (the end where no record is that late).
        #[arg(long, value_parser = parse_datetime)]
        to_datetime: Option<DateTime<FixedOffset>>,
        /// To this offset in every selected partition.
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        to_offset: Option<i64>,
        /// By this many records from the committed offset; negative goes back.
        #[arg(long, allow_negative_numbers = true)]
        shift_by: Option<i64>,
        /// Only these partitions, e.g. 0,1,2 (default: all).
        #[arg(long, value_delimiter = ',')]
        partitions: Vec<i32>,
        /// Commit the new offsets; without it nothing changes.
        #[arg(long)]
        execute: bool,
    },
}

fn parse_datetime(text: &str) -> Result<DateTime<FixedOffset>, String> {
    DateTime::parse_from_rfc3339(text).map_err(|e| {
        format!("{e}: expected an RFC 3339 time with a zone, e.g. 2024-05-01T08:00:00Z")
    })
}

/// The target the flags select; clap's `target` group guarantees exactly one is set.
fn target(
    to_earliest: bool,
    to_latest: bool,
    to_datetime: Option<DateTime<FixedOffset>>,
    to_offset: Option<i64>,
    shift_by: Option<i64>,
) -> anyhow::Result<ResetTarget> {
    Ok(match (to_datetime, to_offset, shift_by) {
        _ if to_earliest => ResetTarget::Earliest,
        _ if to_latest => ResetTarget::Latest,
        (Some(at), _, _) => ResetTarget::Timestamp(at.timestamp_millis()),
        (_, Some(offset), _) => ResetTarget::Offset(offset),
        (_, _, Some(delta)) => ResetTarget::ShiftBy(delta),
        _ => anyhow::bail!(
            "one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by is required"
        ),
    })
}

pub async fn run(settings: &Settings, action: OffsetsAction) -> anyhow::Result<ExitCode> {
    match action {
        OffsetsAction::Show { group, topic } => show(settings, &group, topic.as_deref()).await,
        OffsetsAction::Reset {
            group,
            topic,
            to_earliest,
            to_latest,
            to_datetime,
            to_offset,
            shift_by,
            partitions,
            execute,
        } => {
            let target = target(to_earliest, to_latest, to_datetime, to_offset, shift_by)?;
            let partitions = (!partitions.is_empty()).then_some(partitions);
            reset(settings, &group, &topic, target, partitions, execute).await
        }
    }
}

async fn show(settings: &Settings, group: &str, topic: Option<&str>) -> anyhow::Result<ExitCode> {
    let rows = offsets::show(&settings.kafka, group, topic)
        .await
        .with_context(|| format!("reading offsets of group {group}"))?;
    if rows.is_empty() {
        println!("offsets show: group {group} has no committed offsets");
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", show_table(&rows));
    let mut topics: Vec<&str> = rows.iter().map(|r| r.topic.as_str()).collect();
    topics.dedup();
    let total: i64 = rows.iter().filter_map(|r| r.lag).sum();
    let uncommitted = rows.iter().filter(|r| r.committed.is_none()).count();
    println!(
        "offsets show: group {group}, {} partitions of {} topic(s), total lag {total}{}",
        rows.len(),
        topics.len(),
        if uncommitted > 0 {
            format!(", {uncommitted} without a committed offset")
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}

async fn reset(
    settings: &Settings,
    group: &str,
    topic: &str,
    target: ResetTarget,
    partitions: Option<Vec<i32>>,
    execute: bool,
) -> anyhow::Result<ExitCode> {
    let plans = offsets::plan_reset(&settings.kafka, group, topic, target, partitions)
        .await
        .with_context(|| format!("planning the reset of group {group} on {topic}"))?;
    print!("{}", reset_table(topic, &plans));
    for plan in &plans {
        if let Some(requested) = plan.clamped_from {
            println!(
                "note: {topic}/{}: offset {requested} is outside [{}, {}]; using {}",
                plan.partition, plan.low, plan.high, plan.new
            );
        }
    }
    let changing = plans.iter().filter(|p| p.changes()).count();
    if !execute {
        let members = offsets::active_members(&settings.kafka, group)
            .await
            .with_context(|| format!("describing group {group}"))?;
        if !members.is_empty() {
            println!(
                "note: group {group} has active members ({}); --execute will refuse until they stop",
                client_ids(&members)
            );
        }
        println!(
            "offsets reset: group {group}, topic {topic}: {} partitions, {changing} would change",
            plans.len()
        );
        println!("dry run: nothing changed; add --execute to apply");
        return Ok(ExitCode::SUCCESS);
    }
    match offsets::execute_reset(&settings.kafka, group, topic, &plans).await {
        Ok(()) => {
            println!(
                "offsets reset: group {group}, topic {topic}: {} partitions committed, {changing} changed",
                plans.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(OffsetsError::GroupActive { group, members }) => {
            eprintln!(
                "stocksvr: refusing to reset: consumer group {group} has {} active member(s), client ids: {}; stop them and retry. Nothing changed.",
                members.len(),
                client_ids(&members)
            );
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e).with_context(|| format!("resetting offsets of group {group} on {topic}")),
    }
}

fn client_ids(members: &[offsets::GroupMember]) -> String {
    members
        .iter()
        .map(|m| m.client_id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn or_dash(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn show_table(rows: &[PartitionOffsets]) -> String {
    table(
        &["TOPIC", "PARTITION", "COMMITTED", "LOW", "HIGH", "LAG"],
        rows.iter()
            .map(|r| {
                vec![
                    r.topic.clone(),
                    r.partition.to_string(),
                    or_dash(r.committed),
                    r.low.to_string(),
                    r.high.to_string(),
                    or_dash(r.lag),
                ]
            })
            .collect(),
    )
}

fn reset_table(topic: &str, plans: &[ResetPlan]) -> String {
    table(
        &["TOPIC", "PARTITION", "CURRENT", "NEW", "LAG"],
        plans
            .iter()
            .map(|p| {
                vec![
                    topic.to_string(),
                    p.partition.to_string(),
                    or_dash(p.current),
                    p.new.to_string(),
                    p.lag().to_string(),
                ]
            })
            .collect(),
    )
}

/// Left-aligned columns two spaces apart, no trailing spaces.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        action: OffsetsAction,
    }

    fn parse(args: &[&str]) -> Result<OffsetsAction, clap::Error> {
        Cli::try_parse_from(std::iter::once("offsets").chain(args.iter().copied()))
            .map(|c| c.action)
    }

    fn reset_target(args: &[&str]) -> ResetTarget {
        let base = ["reset", "--group", "g", "--topic", "t"];
        let all: Vec<&str> = base.iter().chain(args).copied().collect();
        match parse(&all).expect("parses") {
            OffsetsAction::Reset {
                to_earliest,
                to_latest,
                to_datetime,
                to_offset,
                shift_by,
                ..
            } => target(to_earliest, to_latest, to_datetime, to_offset, shift_by).expect("target"),
            OffsetsAction::Show { .. } => panic!("parsed as show"),
        }
    }

    #[test]
    fn each_flag_selects_its_target() {
        assert_eq!(reset_target(&["--to-earliest"]), ResetTarget::Earliest);
        assert_eq!(reset_target(&["--to-latest"]), ResetTarget::Latest);
        assert_eq!(reset_target(&["--to-offset", "5"]), ResetTarget::Offset(5));
        assert_eq!(
            reset_target(&["--shift-by", "-3"]),
            ResetTarget::ShiftBy(-3)
        );
        assert_eq!(reset_target(&["--shift-by=4"]), ResetTarget::ShiftBy(4));
        assert_eq!(
            reset_target(&["--to-datetime", "2024-05-01T08:00:00.250+02:00"]),
            ResetTarget::Timestamp(1_714_543_200_250)
        );
    }

    #[test]
    fn exactly_one_target_is_required() {
        let base = ["reset", "--group", "g", "--topic", "t"];
        let none = parse(&base).expect_err("no target");
        assert_eq!(none.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let two: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--to-earliest", "--shift-by", "1"])
            .collect();
        assert_eq!(
            parse(&two).expect_err("two targets").kind(),
            clap::error::ErrorKind::ArgumentConflict
        );
    }

    #[test]
    fn bad_values_are_rejected() {
        let base = ["reset", "--group", "g", "--topic", "t"];
        for bad in [
            &["--to-datetime", "2024-05-01 08:00"][..],
            &["--to-datetime", "2024-05-01T08:00:00"],
            &["--to-offset", "-1"],
            &["--to-earliest", "--partitions", "0,x"],
        ] {
            let args: Vec<&str> = base.iter().chain(bad).copied().collect();
            assert!(parse(&args).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn partitions_and_execute_parse() {
        let action = parse(&[
            "reset",
            "--group",
            "g",
            "--topic",
            "t",
            "--to-earliest",
            "--partitions",
            "0,2",
            "--execute",
        ])
        .expect("parses");
        let OffsetsAction::Reset {
            partitions,
            execute,
            ..
        } = action
        else {
            panic!("not reset");
        };
        assert_eq!(partitions, vec![0, 2]);
        assert!(execute);
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            PartitionOffsets {
                topic: "orders".into(),
                partition: 0,
                committed: Some(7),
                low: 0,
                high: 10,
                lag: Some(3),
            },
            PartitionOffsets {
                topic: "orders".into(),
                partition: 11,
                committed: None,
                low: 0,
                high: 1234,
                lag: None,
            },
        ];
        assert_eq!(
            show_table(&rows),
            "TOPIC   PARTITION  COMMITTED  LOW  HIGH  LAG\n\
             orders  0          7          0    10    3\n\
             orders  11         -          0    1234  -\n"
        );
    }
}
