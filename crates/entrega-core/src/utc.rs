//! UTC calendar arithmetic without a date library: epoch milliseconds to and from the
//! proleptic Gregorian calendar, for timestamps stored as text and times typed by operators.

const DAY_MS: i64 = 86_400_000;

/// Epoch ms as `YYYY-MM-DDTHH:MM:SS.fffZ` (UTC), the text form of SQLite's seed columns.
pub fn format_utc_ms(ms: i64) -> String {
    let (year, month, day) = civil_from_days(ms.div_euclid(DAY_MS));
    let in_day = ms.rem_euclid(DAY_MS);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// Epoch ms of a UTC timestamp as databases write it: `YYYY-MM-DD`, then `T` or a space,
/// `HH:MM:SS`, an optional fraction (digits past milliseconds are dropped), then `Z`, an
/// offset (`+HH`, `+HH:MM`, `-HHMM`) or nothing (read as UTC). `None` for anything else.
pub fn parse_utc_ms(text: &str) -> Option<i64> {
    let b = text.trim().as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let digits = b.get(from..from + len)?;
        digits.iter().try_fold(0i64, |n, d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(at, c)| b.get(at) != Some(&c))
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut millis = 0;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            if at - start < 3 {
                millis = millis * 10 + i64::from(b[at] - b'0');
            }
            at += 1;
        }
        let read = at - start;
        if read == 0 {
            return None;
        }
        for _ in read..3 {
            millis *= 10;
        }
    }
    let offset_minutes = match b.get(at) {
        None => 0,
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let hours = num(at + 1, 2)?;
            let rest = &b[at + 3..];
            let minutes = match rest {
                [] => 0,
                [b':', _, _] => num(at + 4, 2)?,
                [_, _] => num(at + 3, 2)?,
                _ => return None,
            };
            let total = hours * 60 + minutes;
            if sign == b'+' {
                total
            } else {
                -total
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1_000 + millis)
}

/// Days since 1970-01-01 of a date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month, day) of a day count since 1970-01-01; inverse of
/// [`days_from_civil`].
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_utc_ms(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(format_utc_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_what_it_formats_and_what_databases_write() {
        for ms in [0, -1, 951_782_400_000, 1_767_225_599_999, 1_772_323_200_123] {
            assert_eq!(parse_utc_ms(&format_utc_ms(ms)), Some(ms), "{ms}");
        }
        let at = 1_772_323_200_123;
        for text in [
            "2026-03-01 00:00:00.123",
            "2026-03-01 00:00:00.123456+00",
            "2026-03-01T01:00:00.123+01:00",
            "2026-02-28T23:30:00.1239-0030",
        ] {
            assert_eq!(parse_utc_ms(text), Some(at), "{text}");
        }
        assert_eq!(parse_utc_ms("2026-03-01 00:00:00"), Some(at - 123));
        for bad in [
            "",
            "2026-03-01",
            "2026-13-01 00:00:00",
            "2026-03-01 00:00:00.",
            "2026-03-01 00:00:00Zx",
            "2026-03-01 00:00:00+1",
            "2026/03/01 00:00:00",
            "2026-03-01 0a:00:00",
        ] {
            assert_eq!(parse_utc_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn dates_round_trip() {
        for days in [-800_000, -1, 0, 59, 60, 10_957, 20_513, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
