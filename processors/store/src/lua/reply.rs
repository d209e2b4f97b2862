//! The one reply layout every script returns (see `lua/_common.lua`):
//! `{code, version, total, available, reserved, sold, phase, empty_rollback, replayed, deficit,
//! paid}`.

use super::ExecError;
use redis::Value;
use std::collections::HashMap;
use stocksvr_core::events::StockAfter;
use stocksvr_core::model::{FencePhase, OpCode, OpResult};

/// The reply of a script as the shared [`OpResult`]. `phase` is a fence phase for the
/// reservation steps, `INITIALIZED` / `UNCHANGED` for an init, empty otherwise.
pub fn parse_reply(operation_id: &str, reply: Value) -> Result<OpResult, ExecError> {
    let protocol = |detail: String| ExecError::Protocol {
        operation_id: operation_id.to_string(),
        detail,
    };
    let items = match reply {
        Value::Array(items) if items.len() == 11 => items,
        other => {
            return Err(protocol(format!(
                "expected an 11-element array, got {other:?}"
            )))
        }
    };
    let text = |i: usize| {
        value_text(&items[i])
            .ok_or_else(|| protocol(format!("item {i} is not text: {:?}", items[i])))
    };
    let int = |i: usize| {
        value_int(&items[i])
            .ok_or_else(|| protocol(format!("item {i} is not an integer: {:?}", items[i])))
    };
    let flag = |i: usize| match int(i)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(protocol(format!("item {i} is not a 0/1 flag: {n}"))),
    };

    let code = text(0)?;
    let code =
        OpCode::from_name(&code).ok_or_else(|| protocol(format!("unknown code {code:?}")))?;
    let version = u64::try_from(int(1)?).map_err(|_| protocol("negative version".into()))?;
    let phase = text(6)?;
    Ok(OpResult {
        code,
        empty_rollback: flag(7)?,
        replayed: flag(8)?,
        created: phase == "INITIALIZED",
        after: StockAfter {
            total: int(2)?,
            available: int(3)?,
            reserved: int(4)?,
            sold: int(5)?,
        },
        deficit: int(9)?,
        paid: int(10)?,
        version,
        fence: FencePhase::from_name(&phase).unwrap_or(FencePhase::None),
    })
}

/// A numeric field of a hash read back with HGETALL.
/// One item's reply of a group call (`try.lua` with several items): its `{'ERR', message}`
/// in place of a result is the error reply a lone call would have got, read back into a
/// [`redis::RedisError`] by the client's own parser so it is sorted the same way.
pub fn item_error(reply: Value) -> Result<Value, redis::RedisError> {
    let message = match &reply {
        Value::Array(items) if items.len() == 2 => {
            match (value_text(&items[0]), value_text(&items[1])) {
                (Some(marker), Some(message)) if marker == "ERR" => message,
                _ => return Ok(reply),
            }
        }
        _ => return Ok(reply),
    };
    // An error line ends at its first CR or LF.
    let line: String = message
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
        Ok(Value::ServerError(e)) => Err(e.into()),
        Ok(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "script item error",
            line,
        ))),
        Err(e) => Err(e),
    }
}

/// An op record read back with HGETALL (see `record` in `lua/_common.lua`) as the result
/// its script returned; `None` for an empty map (no record, or expired). Not a replay: the
/// result has `replayed` false.
pub fn parse_record(map: &HashMap<String, String>) -> Result<Option<OpResult>, String> {
    if map.is_empty() {
        return Ok(None);
    }
    let code = map.get("code").map(String::as_str).unwrap_or_default();
    let code = OpCode::from_name(code).ok_or_else(|| format!("unknown code {code:?}"))?;
    let phase = map.get("phase").map(String::as_str).unwrap_or_default();
    let flag = |name: &str| field::<i64>(map, name).map(|v| v == 1);
    Ok(Some(OpResult {
        code,
        empty_rollback: flag("empty_rollback")?,
        replayed: false,
        created: phase == "INITIALIZED",
        after: StockAfter {
            total: field(map, "total")?,
            available: field(map, "available")?,
            reserved: field(map, "reserved")?,
            sold: field(map, "sold")?,
        },
        // Records written before `paid` existed have none: nothing was paid then.
        deficit: field(map, "deficit").unwrap_or(0),
        paid: field(map, "paid").unwrap_or(0),
        version: field(map, "version")?,
        fence: FencePhase::from_name(phase).unwrap_or(FencePhase::None),
    }))
}

pub fn field<T: std::str::FromStr>(map: &HashMap<String, String>, name: &str) -> Result<T, String> {
    let raw = map
        .get(name)
        .ok_or_else(|| format!("field {name} missing"))?;
    raw.parse()
        .map_err(|_| format!("field {name} is not a number: {raw:?}"))
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn value_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        // Replays read numbers back from the op record hash; the script converts them with
        // tonumber, but accept text too so a reply is never rejected for its encoding.
        other => value_text(other)?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(code: &str, phase: &str) -> Value {
        Value::Array(vec![
            bulk(code),
            Value::Int(7),
            Value::Int(10),
            Value::Int(5),
            Value::Int(3),
            Value::Int(2),
            bulk(phase),
            Value::Int(0),
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
        ])
    }

    #[test]
    fn replies_parse_into_the_shared_result() {
        let r = parse_reply("op", reply("SUCCEEDED", "RESERVED")).expect("parses");
        assert_eq!(r.code, OpCode::Succeeded);
        assert_eq!(r.version, 7);
        assert_eq!(r.after.available, 5);
        assert_eq!(r.fence, FencePhase::Reserved);
        assert!(r.replayed && !r.empty_rollback && !r.created);
        let init = parse_reply("op", reply("SUCCEEDED", "INITIALIZED")).expect("parses");
        assert!(init.created);
        assert_eq!(init.fence, FencePhase::None);
        let missing = parse_reply("op", reply("BUCKET_MISSING", "")).expect("parses");
        assert_eq!(missing.code, OpCode::BucketMissing);
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        assert!(matches!(
            parse_reply("op", Value::Array(vec![bulk("NOPE")])),
            Err(ExecError::Protocol { .. })
        ));
        assert!(matches!(
            parse_reply("op", reply("WHAT", "")),
            Err(ExecError::Protocol { .. })
        ));
    }

    #[test]
    fn an_op_record_reads_back_as_the_result_its_script_returned() {
        let map: HashMap<String, String> = [
            ("action", "TRY"),
            ("reservation_id", "9"),
            ("code", "SUCCEEDED"),
            ("version", "33"),
            ("total", "10"),
            ("available", "7"),
            ("reserved", "3"),
            ("sold", "0"),
            ("phase", "RESERVED"),
            ("empty_rollback", "0"),
            ("deficit", "0"),
            ("paid", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let r = parse_record(&map).expect("parses").expect("a record");
        assert_eq!(
            (
                r.code,
                r.version,
                r.after.available,
                r.after.reserved,
                r.fence
            ),
            (OpCode::Succeeded, 33, 7, 3, FencePhase::Reserved)
        );
        assert!(!r.replayed && !r.empty_rollback);
        assert_eq!(parse_record(&HashMap::new()), Ok(None), "no record");
        let mut broken = map;
        broken.insert("version".into(), "x".into());
        assert!(parse_record(&broken).is_err());
    }
}
