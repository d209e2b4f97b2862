//! Plain reads of what the scripts store (no script runs): the stock hash, a fence, an op
//! record, and the reconciler's pipelined reads of many buckets and guards.

use super::{reply, ExecError, LuaExecutor};
use redis::Value;
use std::collections::HashMap;
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::model::{Fence, FencePhase, OpResult};

/// The stock hash as stored (a plain read, not part of any script).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub version: u64,
    pub state: BucketState,
    pub baseline_version: u64,
    pub deficit: i64,
    pub updated_at_ms: i64,
}

/// The reservation fence as stored: the [`Fence`] plus the operations that moved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRecord {
    pub fence: Fence,
    pub try_op: Option<String>,
    pub confirm_op: Option<String>,
    pub cancel_op: Option<String>,
    pub last_refund_op: Option<String>,
    /// Bucket version when the fence was last written (0 if the bucket did not exist).
    pub version: u64,
    pub updated_at_ms: i64,
}

impl LuaExecutor {
    /// The stock hashes of `buckets` in one pipelined round trip (the reconciler's read).
    pub async fn read_buckets(
        &self,
        buckets: &[BucketKey],
    ) -> Result<Vec<Option<StockNumbers>>, ExecError> {
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        // Buckets are different hash tags: in cluster mode one pipeline per slot.
        let cmds = buckets
            .iter()
            .map(|bucket| {
                let key = bucket.stock_key();
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(&key);
                (key, cmd)
            })
            .collect();
        let replies = self
            .conn
            .pipeline_by_slot(cmds)
            .await
            .map_err(|e| ExecError::from_redis("", e))?;
        let maps = replies
            .into_iter()
            .map(redis::from_redis_value::<HashMap<String, String>>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecError::from_redis("", e.into()))?;
        buckets
            .iter()
            .zip(maps)
            .map(|(bucket, map)| stock_numbers(&bucket.stock_key(), &map))
            .collect()
    }

    /// For each `(bucket, reservation id, operation id)`: the reservation's fence (phase,
    /// quantity, refunded) if it exists, and whether the op record exists. One pipelined
    /// round trip (the reconciler checks the records of the reservations that hold units).
    pub async fn read_guards(
        &self,
        guards: &[(BucketKey, u64, String)],
    ) -> Result<Vec<(Option<Fence>, bool)>, ExecError> {
        if guards.is_empty() {
            return Ok(Vec::new());
        }
        // The fence and the op record of a guard share its bucket's tag; guards of different
        // buckets are split per slot in cluster mode.
        let mut cmds = Vec::with_capacity(guards.len() * 2);
        for (bucket, reservation_id, op) in guards {
            let fence_key = bucket.fence_key(*reservation_id);
            let mut hmget = redis::cmd("HMGET");
            hmget
                .arg(&fence_key)
                .arg("phase")
                .arg("quantity")
                .arg("refunded");
            cmds.push((fence_key, hmget));
            let op_key = bucket.op_key(op);
            let mut exists = redis::cmd("EXISTS");
            exists.arg(&op_key);
            cmds.push((op_key, exists));
        }
        let replies = self
            .conn
            .pipeline_by_slot(cmds)
            .await
            .map_err(|e| ExecError::from_redis("", e))?;
        let mut out = Vec::with_capacity(guards.len());
        for pair in replies.chunks(2) {
            let fence = match pair.first() {
                Some(Value::Array(fields)) => {
                    let text = |i: usize| match fields.get(i) {
                        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
                        _ => None,
                    };
                    match (text(0), text(1), text(2)) {
                        (Some(phase), Some(q), refunded) => {
                            FencePhase::from_name(&phase).map(|phase| Fence {
                                phase,
                                quantity: q.parse().unwrap_or(0),
                                refunded: refunded.and_then(|r| r.parse().ok()).unwrap_or(0),
                            })
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            let exists = matches!(pair.get(1), Some(Value::Int(1)));
            out.push((fence, exists));
        }
        Ok(out)
    }

    /// The stock hash, or `None` when the bucket does not exist. Errors carry an empty
    /// operation id (a read has none).
    pub async fn read_bucket(&self, bucket: &BucketKey) -> Result<Option<StockNumbers>, ExecError> {
        let key = bucket.stock_key();
        let map = self.hgetall(&key).await?;
        stock_numbers(&key, &map)
    }

    /// The reservation fence, or `None` (phase NONE).
    pub async fn read_fence(
        &self,
        bucket: &BucketKey,
        reservation_id: u64,
    ) -> Result<Option<FenceRecord>, ExecError> {
        let key = bucket.fence_key(reservation_id);
        let map = self.hgetall(&key).await?;
        if map.is_empty() {
            return Ok(None);
        }
        let protocol = |detail: String| ExecError::Protocol {
            operation_id: String::new(),
            detail: format!("{key}: {detail}"),
        };
        let op = |name: &str| map.get(name).filter(|s| !s.is_empty()).cloned();
        let phase = map.get("phase").map(String::as_str).unwrap_or_default();
        Ok(Some(FenceRecord {
            fence: Fence {
                phase: FencePhase::from_name(phase)
                    .ok_or_else(|| protocol(format!("unknown phase {phase:?}")))?,
                quantity: reply::field(&map, "quantity").map_err(protocol)?,
                refunded: reply::field(&map, "refunded").map_err(protocol)?,
            },
            try_op: op("try_op"),
            confirm_op: op("confirm_op"),
            cancel_op: op("cancel_op"),
            last_refund_op: op("last_refund_op"),
            version: reply::field(&map, "version").map_err(protocol)?,
            updated_at_ms: reply::field(&map, "updated_at").map_err(protocol)?,
        }))
    }

    /// The recorded result of `operation_id` on `bucket` (its op record), or `None` when there
    /// is none (never run, or expired after the op TTL).
    pub async fn read_op(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
    ) -> Result<Option<OpResult>, ExecError> {
        let key = bucket.op_key(operation_id);
        let map = self.hgetall(&key).await?;
        reply::parse_record(&map).map_err(|detail| ExecError::Protocol {
            operation_id: operation_id.to_string(),
            detail: format!("{key}: {detail}"),
        })
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, ExecError> {
        // The manager multiplexes one connection; a clone is a handle, not a new socket.
        let mut conn = self.conn.clone();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| ExecError::from_redis("", e))
    }
}

/// A stock hash read back with HGETALL; `None` for an empty map (no such key). A hash without
/// `total` is a bucket something other than the scripts wrote (a stray HINCRBY on a lost
/// bucket, say): reported as it is, numbers missing read as 0, so the reconciler sees it.
fn stock_numbers(
    key: &str,
    map: &HashMap<String, String>,
) -> Result<Option<StockNumbers>, ExecError> {
    if map.is_empty() {
        return Ok(None);
    }
    let protocol = |detail: String| ExecError::Protocol {
        operation_id: String::new(),
        detail: format!("{key}: {detail}"),
    };
    let state = map.get("state").map(String::as_str).unwrap_or_default();
    let number = |name: &str| -> Result<i64, ExecError> {
        match map.get(name) {
            None => Ok(0),
            Some(_) => reply::field(map, name).map_err(protocol),
        }
    };
    Ok(Some(StockNumbers {
        total: number("total")?,
        available: number("available")?,
        reserved: number("reserved")?,
        sold: number("sold")?,
        version: u64::try_from(number("version")?)
            .map_err(|_| protocol("negative version".into()))?,
        state: BucketState::from_name(state)
            .ok_or_else(|| protocol(format!("unknown state {state:?}")))?,
        baseline_version: u64::try_from(number("baseline_version")?)
            .map_err(|_| protocol("negative baseline version".into()))?,
        deficit: number("deficit")?,
        updated_at_ms: number("updated_at")?,
    }))
}
