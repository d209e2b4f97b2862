//! Shared fixtures: a fresh database per test, example payloads encoded through the real
//! registry on a topic of the test's own, and readers of the projected tables.

#![allow(dead_code, unused_imports)] // each test binary uses its own subset

use anyhow::{Context, Result};
use rdkafka::message::{OwnedMessage, Timestamp};
use serde_json::{json, Value as Json};
use sqlx::MySqlPool;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::InfraSettings;
use stocksvr_pipeline::consumer::Record;
use stocksvr_pipeline::json::json_to_avro;

pub const NAMESPACE: &str = "io.stocksvr.inventory";

pub use stocksvr_test_support::{example, unique, TestDb};

pub fn settings() -> Result<InfraSettings> {
    Ok(stocksvr_test_support::infra())
}

/// A database of its own, migrated, dropped with the returned guard.
pub async fn fresh_pool(_settings: &InfraSettings) -> Result<TestDb> {
    Ok(TestDb::migrated().await)
}

/// A database of its own, empty (no migrations), dropped with the returned guard.
pub async fn fresh_database(_settings: &InfraSettings) -> Result<TestDb> {
    Ok(TestDb::empty().await)
}

pub fn codec(settings: &InfraSettings) -> Result<AvroCodec> {
    Ok(AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::embedded()?),
    )?)
}

/// A stock-change event from an example with the fields a test varies.
pub fn change(
    file: &str,
    event_id: &str,
    operation_id: &str,
    version: i64,
    after: [i64; 4],
) -> Json {
    let mut json = example(file);
    json["event_id"] = json!(event_id);
    json["data"]["operation_id"] = json!(operation_id);
    json["data"]["redis_version"] = json!(version);
    json["data"]["after"] = json!({
        "total": after[0], "available": after[1], "reserved": after[2], "sold": after[3]
    });
    json
}

/// Encodes `json` with the schema of `name` on `topic` (its own registry subject, so tests
/// never touch the real topic's) and builds the [`Record`] the loop would hand over.
pub struct Encoder {
    pub codec: AvroCodec,
    pub topic: String,
    catalog: Catalog,
    offset: AtomicI64,
}

impl Encoder {
    pub fn new(codec: AvroCodec, topic: String) -> Result<Self> {
        Ok(Self {
            codec,
            topic,
            catalog: Catalog::embedded()?,
            offset: AtomicI64::new(0),
        })
    }

    pub async fn bytes(&self, name: &str, json: &Json) -> Result<Vec<u8>> {
        let full_name = format!("{NAMESPACE}.{name}");
        let schema = self
            .catalog
            .by_name(&full_name)
            .with_context(|| format!("{full_name} not in catalog"))?;
        let value = json_to_avro(json, &schema.parsed)?;
        Ok(self
            .codec
            .encode_value_on(&self.topic, &full_name, schema.raw, value)
            .await?)
    }

    pub async fn record(&self, name: &str, json: &Json) -> Result<Record> {
        let bytes = self.bytes(name, json).await?;
        let event = self.codec.decode(Some(&bytes)).await?;
        let key = json["partition_key"]
            .as_str()
            .unwrap_or_default()
            .as_bytes();
        let message = OwnedMessage::new(
            Some(bytes),
            Some(key.to_vec()),
            self.topic.clone(),
            Timestamp::NotAvailable,
            0,
            self.offset.fetch_add(1, Ordering::Relaxed),
            None,
        );
        Ok(Record { message, event })
    }
}

/// `dish_stock_snapshot` as (total, available, reserved, sold, deficit, redis_version).
pub type Snapshot = (i64, i64, i64, i64, i64, u64);

pub async fn snapshot(pool: &MySqlPool, bucket: &str) -> Result<Option<Snapshot>> {
    Ok(sqlx::query_as(
        "SELECT total_stock, available_stock, reserved_stock, sold_stock, deficit_stock, \
         redis_version FROM dish_stock_snapshot WHERE stock_bucket_id = ?",
    )
    .bind(bucket)
    .fetch_optional(pool)
    .await?)
}

/// `inventory_ledger` of one operation as (action, quantity, available, reserved, sold,
/// total deltas, redis_version).
pub type Ledger = (i8, u32, i64, i64, i64, i64, Option<u64>);

pub async fn ledger(pool: &MySqlPool, operation_id: &str) -> Result<Vec<Ledger>> {
    Ok(sqlx::query_as(
        "SELECT action, quantity, available_delta, reserved_delta, sold_delta, total_delta, \
         redis_version FROM inventory_ledger WHERE operation_id = ?",
    )
    .bind(operation_id)
    .fetch_all(pool)
    .await?)
}

pub async fn count(pool: &MySqlPool, table: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await?)
}

/// A reservation row as the reservation service leaves it after a Redis step.
pub async fn insert_reservation(
    pool: &MySqlPool,
    id: u64,
    bucket: &str,
    expected_redis_version: Option<u64>,
) -> Result<()> {
    let now = chrono::Utc::now().naive_utc();
    sqlx::query(
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, order_type, expire_at, status, \
         current_operation_id, next_retry_at, sync_status, expected_redis_version, \
         created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(id + 1)
    .bind(id + 2)
    .bind(10_001u64)
    .bind(90_001u64)
    .bind(bucket)
    .bind(chrono::NaiveDate::from_ymd_opt(2026, 7, 26))
    .bind(2u32)
    .bind(1i8)
    .bind(now)
    .bind(20i8)
    .bind(format!("op_try_{id}"))
    .bind(now)
    .bind(10i8)
    .bind(expected_redis_version)
    .bind(now)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

/// (synced_redis_version, sync_status) of a reservation.
pub async fn sync_of(pool: &MySqlPool, id: u64) -> Result<(u64, i8)> {
    Ok(sqlx::query_as(
        "SELECT synced_redis_version, sync_status FROM inventory_reservation WHERE id = ?",
    )
    .bind(id)
    .fetch_one(pool)
    .await?)
}

pub async fn set_expected(pool: &MySqlPool, id: u64, expected: u64) -> Result<()> {
    sqlx::query(
        "UPDATE inventory_reservation SET expected_redis_version = ?, sync_status = 10 WHERE id = ?",
    )
    .bind(expected)
    .bind(id)
    .execute(pool)
    .await?;
    Ok(())
}
