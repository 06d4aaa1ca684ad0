//! Time as tether shows it: RFC 3339 timestamps and short ages.
//!
//! The daemon stores times as microseconds since the Unix epoch. They are
//! shown in UTC with exactly six fractional digits (the stored precision),
//! so that they sort as text, and ages are rounded down to one unit
//! (`5s`, `3m`, `2h`, `4d`) because a table cell has no room for more.
//! Directory names carry a compact UTC time to the second
//! (`20261125T174012Z`), with no colons to quote in a shell.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A duration in whole milliseconds, as the wire's `*_ms` fields carry
/// it; saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long ago `micros` was, as `5s`, `3m`, `2h` or `4d` (rounded down).
/// A time in the future (clocks disagree) counts as `0s`.
pub fn age(now_micros: u64, micros: u64) -> String {
    let secs = Duration::from_micros(now_micros.saturating_sub(micros)).as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// Microseconds since the Unix epoch, shown as an RFC 3339 UTC timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub u64);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = Utc::of(self.0);
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year, t.month, t.day, t.hour, t.minute, t.second, t.micros
        )
    }
}

/// Microseconds since the Unix epoch, shown as a compact UTC time to the
/// second for file names: `20261125T174012Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactUtc(pub u64);

impl fmt::Display for CompactUtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = Utc::of(self.0);
        write!(
            f,
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        )
    }
}

/// A time's UTC calendar fields, for both ways of showing it.
struct Utc {
    year: u64,
    month: u64,
    day: u64,
    hour: u64,
    minute: u64,
    second: u64,
    micros: u64,
}

impl Utc {
    fn of(micros: u64) -> Utc {
        let secs = micros / 1_000_000;
        let (year, month, day) = civil_from_days(secs / 86_400);
        let rem = secs % 86_400;
        Utc {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            micros: micros % 1_000_000,
        }
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01. Works in
/// 400-year eras (146 097 days each), which repeat exactly, with years
/// starting in March so that the leap day falls at the end of a year.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01, the start of an era.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400_000_000, "2000-02-29T00:00:00.000000Z"),
            (951_868_799_999_999, "2000-02-29T23:59:59.999999Z"),
            (1_709_164_800_000_001, "2024-02-29T00:00:00.000001Z"),
            (4_102_444_800_000_000, "2100-01-01T00:00:00.000000Z"),
            (4_107_542_400_000_000, "2100-03-01T00:00:00.000000Z"),
        ];
        for (micros, text) in cases {
            assert_eq!(Rfc3339(micros).to_string(), text, "{micros}");
        }
        assert_eq!(
            CompactUtc(1_764_092_412_999_999).to_string(),
            "20251125T174012Z"
        );
    }

    #[test]
    fn ages_are_rounded_down_to_one_unit() {
        let s = 1_000_000;
        let now = 1_000_000 * s;
        assert_eq!(age(now, now), "0s");
        assert_eq!(age(now, now + 5 * s), "0s");
        assert_eq!(age(now, now - 59 * s), "59s");
        assert_eq!(age(now, now - 61 * s), "1m");
        assert_eq!(age(now, now - 3599 * s), "59m");
        assert_eq!(age(now, now - 7300 * s), "2h");
        assert_eq!(age(now, now - 3 * 86_400 * s - 5), "3d");
    }
}
