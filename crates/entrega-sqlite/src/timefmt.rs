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
    entrega_core::utc::format_utc_ms(ms)
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
