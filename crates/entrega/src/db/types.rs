//! The column types the two backends store differently, bound and read the same way: a
//! timestamp (`TIMESTAMPTZ` on PostgreSQL, UTC text on SQLite), JSON (`JSONB`, text), a
//! UUID (`UUID`, text) and lists (`TEXT[]` or `BIGINT[]`, a JSON array for `json_each`). A
//! statement binds [`TimeMs`], [`JsonText`], [`TextList`] or [`IntList`] once and each backend gets its
//! own encoding, so the statement's text can read the same on both.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::sqlite::{SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type, TypeInfo as _, ValueRef as _};

use super::Value;

/// An instant in epoch milliseconds, as a timestamp column holds it: bound as `TIMESTAMPTZ`
/// on PostgreSQL and as `YYYY-MM-DDTHH:MM:SS.fffZ` text on SQLite (the seed columns' form,
/// so text comparison and its index stay valid); read back from either, and from an
/// integer of epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeMs(pub i64);

/// A JSON document as text: bound as `JSONB` on PostgreSQL and as text on SQLite (read it
/// back with `CAST(column AS TEXT)` on both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(pub String);

/// A list of texts as one parameter: `TEXT[]` on PostgreSQL (`UNNEST($n::text[])`,
/// `= ANY($n)`), a JSON array on SQLite (`json_each($n)`), however long the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextList(pub Vec<String>);

/// A list of integers as one parameter: `BIGINT[]` on PostgreSQL (`= ANY($n)`), a JSON
/// array on SQLite (`IN (SELECT value FROM json_each($n))`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntList(pub Vec<i64>);

impl From<IntList> for Value {
    fn from(v: IntList) -> Self {
        Self::IntList(v.0)
    }
}

impl TextList {
    /// The list of `items`.
    pub fn of<S: AsRef<str>>(items: &[S]) -> Self {
        Self(items.iter().map(|s| s.as_ref().to_owned()).collect())
    }
}

impl From<TimeMs> for Value {
    fn from(v: TimeMs) -> Self {
        Self::TimeMs(Some(v.0))
    }
}

impl From<Option<TimeMs>> for Value {
    fn from(v: Option<TimeMs>) -> Self {
        Self::TimeMs(v.map(|t| t.0))
    }
}

impl From<JsonText> for Value {
    fn from(v: JsonText) -> Self {
        Self::Json(Some(v.0))
    }
}

impl From<Option<JsonText>> for Value {
    fn from(v: Option<JsonText>) -> Self {
        Self::Json(v.map(|j| j.0))
    }
}

impl From<TextList> for Value {
    fn from(v: TextList) -> Self {
        Self::TextList(v.0)
    }
}

impl From<uuid::Uuid> for Value {
    fn from(v: uuid::Uuid) -> Self {
        Self::Uuid(Some(v))
    }
}

/// PostgreSQL's built-in type ids (stable across servers).
const TIMESTAMPTZ_OID: u32 = 1184;
const JSONB_OID: u32 = 3802;
/// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;
/// Epoch ms kept within what `timestamptz` holds (about year 33658 either way), so
/// "everything" sentinels such as `i64::MAX` bind as bounds.
const PG_LIMIT_MS: i64 = 1_000_000_000_000_000;

/// [`TimeMs`] as PostgreSQL's binary `timestamptz`.
pub(crate) struct PgTimestamptz(pub i64);

impl Type<Postgres> for PgTimestamptz {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(sqlx::postgres::types::Oid(TIMESTAMPTZ_OID))
    }
}

impl Encode<'_, Postgres> for PgTimestamptz {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let micros = self.0.clamp(-PG_LIMIT_MS, PG_LIMIT_MS) * 1_000 - PG_EPOCH_US;
        buf.extend_from_slice(&micros.to_be_bytes());
        Ok(IsNull::No)
    }
}

/// [`JsonText`] as PostgreSQL's binary `jsonb`.
pub(crate) struct PgJsonb(pub String);

impl Type<Postgres> for PgJsonb {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(sqlx::postgres::types::Oid(JSONB_OID))
    }
}

impl Encode<'_, Postgres> for PgJsonb {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // jsonb's binary form: a version byte, then the text.
        buf.push(1);
        buf.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }
}

impl Type<Postgres> for TimeMs {
    fn type_info() -> PgTypeInfo {
        PgTimestamptz::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        matches!(ty.name(), "TIMESTAMPTZ" | "TIMESTAMP" | "INT8")
    }
}

impl Decode<'_, Postgres> for TimeMs {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        if value.type_info().name() == "INT8" {
            return Ok(Self(<i64 as Decode<Postgres>>::decode(value)?));
        }
        match value.format() {
            PgValueFormat::Binary => {
                let bytes: [u8; 8] = value.as_bytes()?.try_into()?;
                let micros = i64::from_be_bytes(bytes) + PG_EPOCH_US;
                Ok(Self(micros.div_euclid(1_000)))
            }
            PgValueFormat::Text => parsed(value.as_str()?),
        }
    }
}

impl Type<Sqlite> for TimeMs {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <String as Type<Sqlite>>::compatible(ty) || <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl Decode<'_, Sqlite> for TimeMs {
    fn decode(value: SqliteValueRef<'_>) -> Result<Self, BoxDynError> {
        if value.type_info().name() == "INTEGER" {
            return Ok(Self(<i64 as Decode<Sqlite>>::decode(value)?));
        }
        parsed(<&str as Decode<Sqlite>>::decode(value)?)
    }
}

fn parsed(text: &str) -> Result<TimeMs, BoxDynError> {
    entrega_core::utc::parse_utc_ms(text)
        .map(TimeMs)
        .ok_or_else(|| format!("`{text}` is not a UTC timestamp").into())
}
