//! Bucket identity, Redis keys and business-day rules, including DST and extreme offsets.

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use stocksvr_core::bucket::*;
use stocksvr_core::events::OrderType;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn date(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).unwrap()
}

#[test]
fn ids_and_keys_follow_the_seed() {
    let key = BucketKey::new(10001, 90001, date(2026, 7, 26));
    assert_eq!(key.stock_bucket_id(), "bucket_10001_90001_20260726");
    assert_eq!(key.to_string(), "bucket_10001_90001_20260726");
    assert_eq!(key.redis_hash_tag(), "{10001:90001:2026-07-26}");
    assert_eq!(key.stock_key(), "inv:{10001:90001:2026-07-26}:stock");
    assert_eq!(
        key.fence_key(100123001),
        "inv:{10001:90001:2026-07-26}:reservation:100123001"
    );
    assert_eq!(
        key.op_key("op_try_100123001"),
        "inv:{10001:90001:2026-07-26}:op:op_try_100123001"
    );
    let widest = BucketKey::new(u64::MAX, u64::MAX, date(2026, 12, 31));
    assert!(widest.stock_bucket_id().len() <= 64);
}

#[test]
fn bucket_ids_parse_strictly() {
    for key in [
        BucketKey::new(10001, 90001, date(2026, 7, 26)),
        BucketKey::new(0, 0, date(2000, 2, 29)),
        BucketKey::new(u64::MAX, 1, date(9999, 12, 31)),
    ] {
        assert_eq!(parse_bucket_id(&key.stock_bucket_id()), Ok(key));
        assert_eq!(key.stock_bucket_id().parse::<BucketKey>(), Ok(key));
    }
    for bad in [
        "",
        "bucket_",
        "bucket_1_2",
        "bucket_1_2_3",
        "bucket_1_2_2026726",
        "bucket_1_2_20260230",
        "bucket_01_2_20260726",
        "bucket_+1_2_20260726",
        "bucket_1_2_20260726_4",
        "bucket_1__20260726",
        "bucket_18446744073709551616_2_20260726",
        "Bucket_1_2_20260726",
        "bucket_1_2_2026-7-26",
    ] {
        assert_eq!(
            parse_bucket_id(bad),
            Err(BucketError::MalformedBucketId(bad.to_owned())),
            "{bad}"
        );
    }
}

#[test]
fn timezones_parse_by_iana_name() {
    assert_eq!(
        parse_timezone("Asia/Shanghai"),
        Ok(chrono_tz::Asia::Shanghai)
    );
    for bad in ["", "asia/shanghai", "UTC+8", "Mars/Olympus"] {
        assert_eq!(
            parse_timezone(bad),
            Err(BucketError::UnknownTimezone(bad.to_owned()))
        );
    }
}

#[test]
fn business_date_at_extreme_offsets_around_midnight() {
    let kiritimati = parse_timezone("Pacific/Kiritimati").unwrap(); // UTC+14
    let pago_pago = parse_timezone("Pacific/Pago_Pago").unwrap(); // UTC-11
                                                                  // 10:00Z is midnight in Kiritimati; the same instant is 23:00 the day before in Pago Pago.
    assert_eq!(
        business_date(utc("2026-07-26T09:59:59.999Z"), kiritimati),
        date(2026, 7, 26)
    );
    assert_eq!(
        business_date(utc("2026-07-26T10:00:00Z"), kiritimati),
        date(2026, 7, 27)
    );
    assert_eq!(
        business_date(utc("2026-07-26T10:00:00Z"), pago_pago),
        date(2026, 7, 25)
    );
    // Pago Pago's midnight is 11:00Z.
    assert_eq!(
        business_date(utc("2026-07-26T10:59:59Z"), pago_pago),
        date(2026, 7, 25)
    );
    assert_eq!(
        business_date(utc("2026-07-26T11:00:00Z"), pago_pago),
        date(2026, 7, 26)
    );
    // One instant, three business days.
    let t = utc("2026-07-26T10:30:00Z");
    assert_eq!(business_date(t, pago_pago), date(2026, 7, 25));
    assert_eq!(business_date(t, chrono_tz::UTC), date(2026, 7, 26));
    assert_eq!(business_date(t, kiritimati), date(2026, 7, 27));
}

#[test]
fn business_date_across_dst_changes() {
    let ny = parse_timezone("America/New_York").unwrap();
    // 2026-03-08: 02:00 EST jumps to 03:00 EDT. Local midnight is still 05:00Z (EST).
    assert_eq!(
        business_date(utc("2026-03-08T04:59:59Z"), ny),
        date(2026, 3, 7)
    );
    assert_eq!(
        business_date(utc("2026-03-08T05:00:00Z"), ny),
        date(2026, 3, 8)
    );
    // The next midnight is EDT: 04:00Z, so this business day lasted 23 hours.
    assert_eq!(
        business_date(utc("2026-03-09T03:59:59Z"), ny),
        date(2026, 3, 8)
    );
    assert_eq!(
        business_date(utc("2026-03-09T04:00:00Z"), ny),
        date(2026, 3, 9)
    );
    // 2026-11-01: 02:00 EDT falls back to 01:00 EST; the repeated hour stays on Nov 1
    // and the day lasts 25 hours (midnight 04:00Z to midnight 05:00Z).
    assert_eq!(
        business_date(utc("2026-11-01T05:30:00Z"), ny),
        date(2026, 11, 1)
    );
    assert_eq!(
        business_date(utc("2026-11-01T06:30:00Z"), ny),
        date(2026, 11, 1)
    );
    assert_eq!(
        business_date(utc("2026-11-02T04:59:59Z"), ny),
        date(2026, 11, 1)
    );
    assert_eq!(
        business_date(utc("2026-11-02T05:00:00Z"), ny),
        date(2026, 11, 2)
    );
    // Santiago switches DST at local midnight itself (24:00 -> 01:00 on 2026-09-06):
    // 00:xx local does not exist that day, the date still changes exactly once.
    let santiago = parse_timezone("America/Santiago").unwrap();
    assert_eq!(
        business_date(utc("2026-09-06T03:59:59Z"), santiago),
        date(2026, 9, 5)
    );
    assert_eq!(
        business_date(utc("2026-09-06T04:00:00Z"), santiago),
        date(2026, 9, 6)
    );
}

#[test]
fn instant_orders_use_today_and_scheduled_orders_their_processing_day() {
    let sh = chrono_tz::Asia::Shanghai;
    let grace = TimeDelta::minutes(5);
    let now = utc("2026-07-25T16:30:00Z"); // 00:30 on the 26th in Shanghai
    assert_eq!(
        bucket_date_for(OrderType::Instant, now, None, sh, grace),
        Ok(date(2026, 7, 26))
    );
    // Ordered on the 25th (local) for the 27th: the 27th's bucket (docs/design.md, Try).
    let booked = utc("2026-07-25T03:00:00Z");
    let processing = utc("2026-07-27T04:00:00Z");
    assert_eq!(
        bucket_date_for(OrderType::Scheduled, booked, Some(processing), sh, grace),
        Ok(date(2026, 7, 27))
    );
    assert_eq!(
        bucket_date_for(OrderType::Scheduled, now, None, sh, grace),
        Err(BucketError::MissingProcessingTime)
    );
    // Within the grace a slightly past processing_time is accepted, beyond it refused.
    let late = now - TimeDelta::minutes(5);
    assert_eq!(
        bucket_date_for(OrderType::Scheduled, now, Some(late), sh, grace),
        Ok(date(2026, 7, 26))
    );
    let too_late = late - TimeDelta::milliseconds(1);
    assert_eq!(
        bucket_date_for(OrderType::Scheduled, now, Some(too_late), sh, grace),
        Err(BucketError::ProcessingTimeInPast {
            processing_time: too_late,
            now,
            grace
        })
    );
    // Scheduled at 00:10 local on the 26th in Kiritimati while it is still the 25th in UTC.
    let kiritimati = parse_timezone("Pacific/Kiritimati").unwrap();
    assert_eq!(
        bucket_date_for(
            OrderType::Scheduled,
            utc("2026-07-25T08:00:00Z"),
            Some(utc("2026-07-25T10:10:00Z")),
            kiritimati,
            grace
        ),
        Ok(date(2026, 7, 26))
    );
}

#[test]
fn bucket_states() {
    use BucketState::*;
    for (s, code) in [(Open, 10), (Closed, 20), (Archived, 30)] {
        assert_eq!(s.code(), code);
        assert_eq!(BucketState::from_code(code), Some(s));
    }
    assert_eq!(BucketState::from_code(0), None);
    assert!(Open.accepts_try() && !Closed.accepts_try() && !Archived.accepts_try());
    assert!(Open.accepts_completion() && Closed.accepts_completion());
    assert!(!Archived.accepts_completion());
}
