//! The test merchants' time zone: a whole-hour fixed offset in which it is about noon when the
//! test process starts.
//!
//! The service puts a Try in the bucket of the merchant's business day, computed from the
//! merchant's zone at Try time. With UTC merchants a test that ran across midnight UTC made
//! today's bucket and then tried against tomorrow's, which does not exist (CI runs at any
//! hour). Starting at local noon, a test would have to run about eleven hours to see the day
//! change. Tests give their merchants [`zone_name`] and compute days with [`today`] and
//! [`date_of`], never with `Utc::now().date_naive()`.

use chrono::{DateTime, NaiveDate, NaiveTime, TimeDelta, Timelike, Utc};
use std::sync::OnceLock;

/// A whole-hour offset from UTC (-11..=12) and its IANA name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoonZone {
    offset_hours: i32,
    name: String,
}

impl NoonZone {
    /// The zone in which it is between 12:00 and 13:00 while it is `utc_hour` o'clock (0-23)
    /// in UTC. Pure, so every hour can be tested; [`noon_zone`] calls it with the real hour.
    pub fn for_utc_hour(utc_hour: u32) -> Self {
        let offset_hours = 12 - (utc_hour % 24) as i32;
        // The Etc zones keep POSIX signs, inverted: Etc/GMT-5 is five hours AHEAD of UTC.
        let name = match offset_hours {
            0 => "Etc/GMT".to_owned(),
            ahead if ahead > 0 => format!("Etc/GMT-{ahead}"),
            behind => format!("Etc/GMT+{}", -behind),
        };
        Self { offset_hours, name }
    }

    /// The IANA name, as `merchant_settings` and `dish_stock_baseline.timezone` store it.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn offset(&self) -> TimeDelta {
        TimeDelta::hours(i64::from(self.offset_hours))
    }

    /// The business day at `t` (a fixed offset needs no tz database).
    pub fn date_of(&self, t: DateTime<Utc>) -> NaiveDate {
        (t + self.offset()).date_naive()
    }

    /// The instant `day` begins (its local midnight).
    pub fn start_of(&self, day: NaiveDate) -> DateTime<Utc> {
        day.and_time(NaiveTime::MIN).and_utc() - self.offset()
    }
}

/// The zone of this process, picked from the UTC hour at first use and kept, so every test of
/// a binary (and every bucket it makes) agrees on the day.
pub fn noon_zone() -> &'static NoonZone {
    static ZONE: OnceLock<NoonZone> = OnceLock::new();
    ZONE.get_or_init(|| NoonZone::for_utc_hour(Utc::now().hour()))
}

/// The IANA name of [`noon_zone`], for test merchants and baselines.
pub fn zone_name() -> &'static str {
    noon_zone().name()
}

/// Today's business day of a test merchant.
pub fn today() -> NaiveDate {
    date_of(Utc::now())
}

/// The business day of a test merchant at `t` (a scheduled order's bucket day).
pub fn date_of(t: DateTime<Utc>) -> NaiveDate {
    noon_zone().date_of(t)
}

/// The instant a test merchant's `day` begins.
pub fn start_of(day: NaiveDate) -> DateTime<Utc> {
    noon_zone().start_of(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hour: u32, min: u32, sec: u32) -> DateTime<Utc> {
        NaiveDate::from_ymd_opt(2026, 3, 29)
            .and_then(|d| d.and_hms_opt(hour, min, sec))
            .expect("valid instant")
            .and_utc()
    }

    /// The offset back from the name, by the Etc convention (the sign inverted).
    fn offset_named(name: &str) -> i32 {
        let rest = name.strip_prefix("Etc/GMT").expect("an Etc/GMT name");
        if rest.is_empty() {
            return 0;
        }
        assert!(rest.starts_with(['+', '-']), "signed: {name}");
        -rest.parse::<i32>().expect("hours after Etc/GMT")
    }

    #[test]
    fn every_utc_hour_gets_a_zone_where_it_is_just_past_noon() {
        for hour in 0..24 {
            let zone = NoonZone::for_utc_hour(hour);
            assert!((-11..=12).contains(&zone.offset_hours), "{zone:?}");
            assert_eq!(offset_named(zone.name()), zone.offset_hours, "{zone:?}");
            for (min, sec) in [(0, 0), (30, 0), (59, 59)] {
                let t = at(hour, min, sec);
                let local = (t + zone.offset()).time();
                assert_eq!(
                    (local.hour(), local.minute(), local.second()),
                    (12, min, sec),
                    "{t} in {zone:?}"
                );
                // Eleven hours on it is still the same day; thirteen hours on it is not.
                assert_eq!(zone.date_of(t + TimeDelta::hours(11)), zone.date_of(t));
                assert_ne!(zone.date_of(t + TimeDelta::hours(13)), zone.date_of(t));
            }
        }
    }

    #[test]
    fn names_follow_the_inverted_etc_signs() {
        assert_eq!(NoonZone::for_utc_hour(0).name(), "Etc/GMT-12");
        assert_eq!(NoonZone::for_utc_hour(7).name(), "Etc/GMT-5");
        assert_eq!(NoonZone::for_utc_hour(12).name(), "Etc/GMT");
        assert_eq!(NoonZone::for_utc_hour(15).name(), "Etc/GMT+3");
        assert_eq!(NoonZone::for_utc_hour(23).name(), "Etc/GMT+11");
    }

    #[test]
    fn a_day_starts_at_its_local_midnight() {
        for hour in 0..24 {
            let zone = NoonZone::for_utc_hour(hour);
            let t = at(hour, 17, 0);
            let day = zone.date_of(t);
            let start = zone.start_of(day);
            assert!(start <= t && t < start + TimeDelta::days(1), "{t} {zone:?}");
            assert_eq!(zone.date_of(start), day);
            assert_eq!(
                zone.date_of(start - TimeDelta::milliseconds(1)),
                day.pred_opt().expect("a day before")
            );
        }
    }

    #[test]
    fn the_process_keeps_one_zone() {
        assert!(std::ptr::eq(noon_zone(), noon_zone()));
        assert_eq!(date_of(start_of(today())), today());
    }
}
