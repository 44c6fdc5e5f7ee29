//! The seed tables' text timestamps (`%Y-%m-%dT%H:%M:%fZ`, UTC) to and from epoch ms.
//!
//! Formatting happens in Rust so the text is exactly what the column defaults produce, which
//! keeps plain string comparison (and its index) valid for purging by age.

/// SQL expression turning the text timestamp column `col` into epoch ms (NULL if unreadable).
/// SQLite keeps julian days as integer ms internally, so the round trip is exact.
pub(crate) fn epoch_ms_sql(col: &str) -> String {
    format!("CAST(round((julianday({col}) - 2440587.5) * 86400000.0) AS INTEGER)")
}

/// Formats epoch ms as `YYYY-MM-DDTHH:MM:SS.SSSZ`.
pub(crate) fn format_ms(ms: i64) -> String {
    const DAY_MS: i64 = 86_400_000;
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

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_ms(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(format_ms(1_772_323_200_123), "2026-03-01T00:00:00.123Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
    }
}
