//! Fuzz of the dead-letter origin parsing (0 panics): arbitrary dead-letter topics, header
//! sets (every `stocksvr.dlt.*` header missing, repeated, empty, garbled, not UTF-8, too
//! long, or well formed with extreme numbers, among foreign headers), keys and values.
//! Every record must park: [`parse_dead_letter`] returns a row whose every string fits its
//! column and whose fallbacks hold. `STOCKSVR_FUZZ_CASES` raises the case count (see
//! `stocksvr_pipeline::codec::fuzz`).

use super::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::Timestamp;

const NAMES: [&str; 7] = [
    headers::ORIGINAL_TOPIC,
    headers::ORIGINAL_PARTITION,
    headers::ORIGINAL_OFFSET,
    headers::ORIGINAL_TIMESTAMP,
    headers::CONSUMER_GROUP,
    headers::ERROR_CLASS,
    headers::ERROR_MESSAGE,
];

/// A header value: numbers at their edges, text of any length, arbitrary bytes, nothing.
fn header_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(None),
        any::<i64>().prop_map(|n| Some(n.to_string().into_bytes())),
        prop_oneof![
            Just(i64::MIN.to_string()),
            Just(i64::MAX.to_string()),
            Just(u64::MAX.to_string()),
            Just("-1".to_string()),
            Just(" 3".to_string()),
            Just("+7".to_string()),
            Just(String::new()),
        ]
        .prop_map(|s| Some(s.into_bytes())),
        ".{0,40}".prop_map(|s: String| Some(s.into_bytes())),
        (any::<char>(), 0usize..3000).prop_map(|(c, n)| Some(c.to_string().repeat(n).into_bytes())),
        vec(any::<u8>(), 0..64).prop_map(Some),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0..NAMES.len()).prop_map(|i| NAMES[i].to_string()),
        1 => ".{0,20}",
    ]
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("order.lifecycle.v1.dlt".to_string()),
        Just(".dlt".to_string()),
        Just(String::new()),
        "[a-z.]{0,30}(\\.dlt)?",
        ".{0,300}",
    ]
}

fn bytes_up_to(max: usize) -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(None),
        vec(any::<u8>(), 0..32).prop_map(Some),
        (0..=max).prop_map(|n| Some(vec![0xab; n])),
    ]
}

prop_compose! {
    fn dead_letter()(
        topic in topic(),
        partition in prop_oneof![0i32..64, any::<i32>()],
        offset in any::<i64>(),
        hdrs in vec((header_name(), header_value()), 0..12),
        key in bytes_up_to(KEY_MAX_BYTES + 16),
        value in bytes_up_to(4096),
    ) -> OwnedMessage {
        let headers = hdrs.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header { key: k.as_str(), value: v.as_deref() })
        });
        OwnedMessage::new(
            value,
            key,
            topic,
            Timestamp::CreateTime(1),
            partition,
            offset,
            Some(headers),
        )
    }
}

#[test]
fn every_dead_letter_parks_with_bounded_fields() {
    let mut runner = TestRunner::new(stocksvr_pipeline::codec::fuzz::config());
    runner
        .run(&dead_letter(), |m| {
            let row = parse_dead_letter(&m);
            prop_assert_eq!(&row.dlt_topic, m.topic());
            prop_assert_eq!(row.dlt_offset, m.offset());
            prop_assert!(row.original_topic.chars().count() <= TOPIC_MAX_CHARS);
            prop_assert!(row.consumer_group.chars().count() <= GROUP_MAX_CHARS);
            prop_assert!(row.error_message.chars().count() <= MESSAGE_MAX_CHARS);
            prop_assert!(
                !row.error_class.is_empty()
                    && row.error_class.chars().count() <= CLASS_MAX_CHARS
                    && row.error_class.is_ascii(),
                "{:?}",
                row.error_class
            );
            prop_assert!(row.original_offset >= -1);
            prop_assert!(row.original_timestamp_ms.is_none_or(|t| t >= 0));
            prop_assert!(row.key.as_ref().is_none_or(|k| k.len() <= KEY_MAX_BYTES));
            // A key that did not fit is not silently dropped: the message says so.
            if m.key().is_some_and(|k| k.len() > KEY_MAX_BYTES) {
                prop_assert!(row.error_message.starts_with(NOT_STORED_MARKER));
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
