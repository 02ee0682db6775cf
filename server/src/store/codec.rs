//! Column encodings for kernel values.
//!
//! Invariant: enums are stored as the exact strings their serde names give
//! (the same strings the wire protocol uses), so a row reads back into the
//! same kernel value it was written from.

use kernel::ids::Digest;
use rusqlite::types::{FromSql, FromSqlError, ValueRef};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub(crate) use crate::wire::codec_name as name;

/// Parses a stored enum name back into its kernel value.
pub(crate) fn parse<T: DeserializeOwned>(text: &str) -> rusqlite::Result<T> {
    serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(error))
    })
}

/// Parses an optional stored enum name.
pub(crate) fn parse_opt<T: DeserializeOwned>(text: Option<String>) -> rusqlite::Result<Option<T>> {
    text.map(|text| parse(&text)).transpose()
}

/// A JSON column.
pub(crate) fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Reads a JSON column.
pub(crate) fn from_json<T: DeserializeOwned>(text: &str) -> rusqlite::Result<T> {
    serde_json::from_str(text).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(error))
    })
}

/// A 32-byte digest column.
#[derive(Debug)]
pub(crate) struct DigestColumn(pub Digest);

impl FromSql for DigestColumn {
    fn column_result(value: ValueRef<'_>) -> Result<Self, FromSqlError> {
        let bytes = value.as_blob()?;
        let array: [u8; 32] = bytes
            .try_into()
            .map_err(|_| FromSqlError::InvalidBlobSize {
                expected_size: 32,
                blob_size: bytes.len(),
            })?;
        Ok(Self(Digest(array)))
    }
}

/// Converts a stored integer (SQLite is signed) back to the kernel's `u64`.
pub(crate) fn u64_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Converts a kernel `u64` (capped at 2^53−1) to the stored integer.
pub(crate) fn i64_of(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
