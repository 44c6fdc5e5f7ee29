//! Times on the command line and in tables: `--since`/`--until` values to epoch ms, and epoch
//! ms to UTC text.

use entrega_core::utc::{days_from_civil, format_utc_ms};

const DAY_MS: i64 = 86_400_000;

/// Why a time value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid time `{0}`: expected epoch milliseconds, an age such as 30m, 2h or 1d, \
     or a UTC time such as 2026-03-01T10:00:00Z or 2026-03-01"
)]
pub struct InvalidTime(pub String);

/// Reads a time given as epoch milliseconds (`1767225600000`), as an age before `now_ms`
/// (`45s`, `30m`, `2h`, `7d`), or as UTC (`2026-03-01T10:00:00Z`, with optional fraction, or a
/// bare date, meaning its midnight).
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, InvalidTime> {
    let bad = || InvalidTime(text.to_owned());
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| bad());
    }
    if let Some(unit) = t.chars().last().filter(|c| "smhd".contains(*c)) {
        let digits = &t[..t.len() - 1];
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = digits.parse().map_err(|_| bad())?;
            let per = match unit {
                's' => 1_000,
                'm' => 60_000,
                'h' => 3_600_000,
                _ => DAY_MS,
            };
            return Ok(now_ms.saturating_sub(n.saturating_mul(per)));
        }
    }
    parse_utc(t).ok_or_else(bad)
}

/// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS[.fff]Z`.
fn parse_utc(t: &str) -> Option<i64> {
    let (date, rest) = match t.split_once('T') {
        Some((d, r)) => (d, Some(r.strip_suffix('Z')?)),
        None => (t, None),
    };
    let mut parts = date.split('-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: i64 = parts.next()?.parse().ok()?;
    let day: i64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let mut ms = days_from_civil(year, month, day) * DAY_MS;
    if let Some(clock) = rest {
        let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
        let mut fields = hms.split(':');
        let h: i64 = fields.next()?.parse().ok()?;
        let m: i64 = fields.next()?.parse().ok()?;
        let s: i64 = fields.next()?.parse().ok()?;
        if fields.next().is_some() || h > 23 || m > 59 || s > 60 {
            return None;
        }
        let millis: i64 = if fraction.is_empty() {
            0
        } else {
            let digits: String = fraction.chars().chain("000".chars()).take(3).collect();
            digits.parse().ok()?
        };
        ms += ((h * 60 + m) * 60 + s) * 1_000 + millis;
    }
    Some(ms)
}

/// Epoch ms as `YYYY-MM-DDTHH:MM:SS.fffZ`.
pub fn format_utc(ms: i64) -> String {
    format_utc_ms(ms)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn times_read_in_every_form() {
        let now = 1_772_359_200_000; // 2026-03-01T10:00:00Z
        assert_eq!(parse_time("2026-03-01T10:00:00Z", 0).unwrap(), now);
        assert_eq!(parse_time("2026-03-01T10:00:00.25Z", 0).unwrap(), now + 250);
        assert_eq!(parse_time("2026-03-01", 0).unwrap(), now - 10 * 3_600_000);
        assert_eq!(parse_time("1772359200000", 0).unwrap(), now);
        assert_eq!(parse_time("2h", now).unwrap(), now - 7_200_000);
        assert_eq!(parse_time("1d", now).unwrap(), now - DAY_MS);
        assert_eq!(format_utc(now + 5), "2026-03-01T10:00:00.005Z");
        for bad in [
            "",
            "yesterday",
            "2026-13-01",
            "2026-03-01T10:00:00",
            "5w",
            "h",
        ] {
            assert!(parse_time(bad, now).is_err(), "{bad} parsed");
        }
    }
}
