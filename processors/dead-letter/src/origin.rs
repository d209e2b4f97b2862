//! A dead letter's row, read from the record and its `stocksvr.dlt.*` headers. Pure, so
//! every malformed shape is unit-tested; nothing here can fail, because a dead letter with
//! unreadable headers is still a record somebody has to look at.

use rdkafka::message::{Headers, Message};
use stocksvr_pipeline::deadletter::{headers, DEAD_LETTER_SUFFIX};

/// `record_key VARBINARY(1024)`.
pub const KEY_MAX_BYTES: usize = 1024;
/// `record_value MEDIUMBLOB`.
pub const VALUE_MAX_BYTES: usize = 16_777_215;
const TOPIC_MAX_CHARS: usize = 249;
const GROUP_MAX_CHARS: usize = 255;
const CLASS_MAX_CHARS: usize = 32;
const MESSAGE_MAX_CHARS: usize = 2048;

/// Starts the stored error message of a record whose key or value did not fit its column.
/// Such a row is never replayed (the bytes would not be the original ones); the complete
/// record stays on the dead-letter topic at its coordinates for the topic's retention.
pub const NOT_STORED_MARKER: &str = "[stocksvr.dlq: not stored:";

/// Error class of a dead letter whose class header is missing or unreadable.
pub const UNKNOWN_CLASS: &str = "unknown";

/// One `inventory_dead_letter` row before it is inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewParked {
    pub dlt_topic: String,
    pub dlt_partition: i32,
    pub dlt_offset: i64,
    pub original_topic: String,
    pub original_partition: i32,
    /// -1 when the header is missing or garbled.
    pub original_offset: i64,
    pub original_timestamp_ms: Option<i64>,
    pub consumer_group: String,
    pub error_class: String,
    pub error_message: String,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// What was missing or garbled, for the log (the row keeps only the fallbacks).
    pub notes: Vec<String>,
}

fn header<'a, M: Message>(message: &'a M, name: &str) -> Option<&'a [u8]> {
    // The first occurrence wins: `deadletter::send` writes each header once.
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

fn bounded(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// Reads the row of one dead letter. Every field has a fallback, so every record parks:
/// a missing original topic is derived from the dead-letter topic name, a missing
/// partition is the dead letter's own (dead letters keep their source partition), a
/// missing offset is -1, the class `unknown`. Strings are cut to their column sizes here,
/// because `INSERT IGNORE` would otherwise cut them silently.
pub fn parse_dead_letter<M: Message>(message: &M) -> NewParked {
    let mut notes = Vec::new();
    let texts = Texts::read(message, &mut notes);
    let original_topic = match texts.topic.filter(|t| !t.is_empty()) {
        Some(t) => bounded(&t, TOPIC_MAX_CHARS),
        // Empty when even the name gives nothing away: replay refuses an unknown origin.
        None => message
            .topic()
            .strip_suffix(DEAD_LETTER_SUFFIX)
            .unwrap_or_default()
            .to_string(),
    };
    let original_partition = match texts.partition.as_deref().map(str::parse::<i32>) {
        Some(Ok(p)) if p >= 0 => p,
        Some(_) => {
            notes.push(format!("{} garbled", headers::ORIGINAL_PARTITION));
            message.partition()
        }
        None => message.partition(),
    };
    let original_offset = match texts.offset.as_deref().map(str::parse::<i64>) {
        Some(Ok(o)) if o >= 0 => o,
        Some(_) => {
            notes.push(format!("{} garbled", headers::ORIGINAL_OFFSET));
            -1
        }
        None => -1,
    };
    // `deadletter::send` writes -1 for a record without a timestamp.
    let original_timestamp_ms = match texts.timestamp.as_deref().map(str::parse::<i64>) {
        Some(Ok(t)) if t >= 0 => Some(t),
        Some(Ok(_)) | None => None,
        Some(Err(_)) => {
            notes.push(format!("{} garbled", headers::ORIGINAL_TIMESTAMP));
            None
        }
    };
    let consumer_group = bounded(&texts.group.unwrap_or_default(), GROUP_MAX_CHARS);
    let error_class = match texts.class {
        Some(c) if !c.is_empty() && c.chars().count() <= CLASS_MAX_CHARS && c.is_ascii() => c,
        Some(_) => {
            notes.push(format!("{} garbled", headers::ERROR_CLASS));
            UNKNOWN_CLASS.to_string()
        }
        None => UNKNOWN_CLASS.to_string(),
    };
    let (key, value, error_message) =
        stored_bytes(message, &texts.message.unwrap_or_default(), &mut notes);
    NewParked {
        dlt_topic: message.topic().to_string(),
        dlt_partition: message.partition(),
        dlt_offset: message.offset(),
        original_topic,
        original_partition,
        original_offset,
        original_timestamp_ms,
        consumer_group,
        error_class,
        error_message,
        key,
        value,
        notes,
    }
}

/// The `stocksvr.dlt.*` headers as text: `None` for a missing one, a lossy reading of one
/// that is not UTF-8 (both noted).
struct Texts {
    topic: Option<String>,
    partition: Option<String>,
    offset: Option<String>,
    timestamp: Option<String>,
    group: Option<String>,
    class: Option<String>,
    message: Option<String>,
}

impl Texts {
    fn read<M: Message>(message: &M, notes: &mut Vec<String>) -> Self {
        let mut text = |name: &str| -> Option<String> {
            match header(message, name) {
                None => {
                    notes.push(format!("{name} missing"));
                    None
                }
                Some(bytes) => match std::str::from_utf8(bytes) {
                    Ok(s) => Some(s.to_string()),
                    Err(_) => {
                        notes.push(format!("{name} is not UTF-8"));
                        Some(String::from_utf8_lossy(bytes).into_owned())
                    }
                },
            }
        };
        Texts {
            topic: text(headers::ORIGINAL_TOPIC),
            partition: text(headers::ORIGINAL_PARTITION),
            offset: text(headers::ORIGINAL_OFFSET),
            timestamp: text(headers::ORIGINAL_TIMESTAMP),
            group: text(headers::CONSUMER_GROUP),
            class: text(headers::ERROR_CLASS),
            message: text(headers::ERROR_MESSAGE),
        }
    }
}

/// The key and value as the row stores them, and its error message: a key or value too
/// large for its column is not stored, and the message then starts with
/// [`NOT_STORED_MARKER`] saying which.
fn stored_bytes<M: Message>(
    message: &M,
    original_message: &str,
    notes: &mut Vec<String>,
) -> (Option<Vec<u8>>, Option<Vec<u8>>, String) {
    let mut not_stored = Vec::new();
    let key = message.key().and_then(|k| {
        if k.len() > KEY_MAX_BYTES {
            not_stored.push(format!("key of {} bytes > {KEY_MAX_BYTES}", k.len()));
            None
        } else {
            Some(k.to_vec())
        }
    });
    let value = message.payload().and_then(|v| {
        if v.len() > VALUE_MAX_BYTES {
            not_stored.push(format!("value of {} bytes > {VALUE_MAX_BYTES}", v.len()));
            None
        } else {
            Some(v.to_vec())
        }
    });
    let error_message = if not_stored.is_empty() {
        bounded(original_message, MESSAGE_MAX_CHARS)
    } else {
        notes.extend(not_stored.iter().cloned());
        bounded(
            &format!(
                "{NOT_STORED_MARKER} {}] {original_message}",
                not_stored.join(", ")
            ),
            MESSAGE_MAX_CHARS,
        )
    };
    (key, value, error_message)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
    use rdkafka::Timestamp;

    fn dead_letter(
        topic: &str,
        hdrs: &[(&str, &[u8])],
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    ) -> OwnedMessage {
        let headers = hdrs.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(*v),
            })
        });
        OwnedMessage::new(
            value,
            key,
            topic.to_string(),
            Timestamp::CreateTime(1),
            3,
            77,
            Some(headers),
        )
    }

    #[test]
    fn every_header_is_read() {
        let m = dead_letter(
            "orders.v1.dlt",
            &[
                (headers::ORIGINAL_TOPIC, b"orders.v1"),
                (headers::ORIGINAL_PARTITION, b"3"),
                (headers::ORIGINAL_OFFSET, b"41"),
                (headers::ORIGINAL_TIMESTAMP, b"1700000000123"),
                (headers::CONSUMER_GROUP, b"stocksvr.order-lifecycle"),
                (headers::ERROR_CLASS, b"invalid"),
                (headers::ERROR_MESSAGE, b"wrong magic byte"),
            ],
            Some(b"k".to_vec()),
            Some(vec![0xff, 0]),
        );
        let row = parse_dead_letter(&m);
        assert_eq!(
            row,
            NewParked {
                dlt_topic: "orders.v1.dlt".into(),
                dlt_partition: 3,
                dlt_offset: 77,
                original_topic: "orders.v1".into(),
                original_partition: 3,
                original_offset: 41,
                original_timestamp_ms: Some(1_700_000_000_123),
                consumer_group: "stocksvr.order-lifecycle".into(),
                error_class: "invalid".into(),
                error_message: "wrong magic byte".into(),
                key: Some(b"k".to_vec()),
                value: Some(vec![0xff, 0]),
                notes: vec![],
            }
        );
    }

    #[test]
    fn missing_headers_fall_back_and_never_fail() {
        let m = dead_letter("orders.v1.dlt", &[], None, None);
        let row = parse_dead_letter(&m);
        assert_eq!(row.original_topic, "orders.v1");
        assert_eq!(row.original_partition, 3);
        assert_eq!(row.original_offset, -1);
        assert_eq!(row.original_timestamp_ms, None);
        assert_eq!(row.consumer_group, "");
        assert_eq!(row.error_class, UNKNOWN_CLASS);
        assert_eq!(row.error_message, "");
        assert_eq!((row.key, row.value), (None, None));
        assert_eq!(row.notes.len(), 7, "{:?}", row.notes);

        let odd = parse_dead_letter(&dead_letter("not-a-dead-letter-topic", &[], None, None));
        assert_eq!(odd.original_topic, "", "an unknown origin is not guessed");
    }

    #[test]
    fn garbled_headers_keep_what_is_readable() {
        let m = dead_letter(
            "orders.v1.dlt",
            &[
                (headers::ORIGINAL_PARTITION, b"three"),
                (headers::ORIGINAL_OFFSET, b"-5"),
                (headers::ORIGINAL_TIMESTAMP, b"-1"),
                (headers::CONSUMER_GROUP, &[b'g', 0xff]),
                (headers::ERROR_CLASS, &[0xc3, 0x28]),
                (headers::ERROR_MESSAGE, &[b'b', b'a', b'd', 0xfe]),
            ],
            None,
            Some(b"v".to_vec()),
        );
        let row = parse_dead_letter(&m);
        assert_eq!(row.original_partition, 3);
        assert_eq!(row.original_offset, -1);
        assert_eq!(row.original_timestamp_ms, None, "-1 means no timestamp");
        assert_eq!(row.consumer_group, "g\u{fffd}");
        assert_eq!(row.error_class, UNKNOWN_CLASS);
        assert_eq!(row.error_message, "bad\u{fffd}");

        let long_class = "x".repeat(40);
        let m = dead_letter(
            "t.dlt",
            &[
                (headers::ERROR_CLASS, long_class.as_bytes()),
                (headers::ERROR_MESSAGE, "é".repeat(3000).as_bytes()),
            ],
            None,
            None,
        );
        let row = parse_dead_letter(&m);
        assert_eq!(row.error_class, UNKNOWN_CLASS);
        assert_eq!(row.error_message.chars().count(), 2048);
    }

    #[test]
    fn oversized_bytes_are_not_stored_and_say_so() {
        let m = dead_letter(
            "t.dlt",
            &[(headers::ERROR_MESSAGE, b"boom")],
            Some(vec![1; KEY_MAX_BYTES + 1]),
            Some(vec![2; 10]),
        );
        let row = parse_dead_letter(&m);
        assert_eq!(row.key, None);
        assert_eq!(row.value, Some(vec![2; 10]));
        assert!(row.error_message.starts_with(NOT_STORED_MARKER));
        assert!(
            row.error_message.ends_with("] boom"),
            "{}",
            row.error_message
        );

        let fits = dead_letter("t.dlt", &[], Some(vec![1; KEY_MAX_BYTES]), None);
        assert_eq!(parse_dead_letter(&fits).key.map(|k| k.len()), Some(1024));
    }
}
