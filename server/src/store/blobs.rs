//! Content-addressed values (`blobs`): canonical JSON and UTF-8 text.
//!
//! Invariant: the key is the SHA-256 of the exact bytes, computed by the
//! caller before the transaction; inserting an existing value is a no-op.

use super::Cached as _;
use super::codec::{DigestColumn, i64_of};
use kernel::ids::Digest;
use rusqlite::{Connection, OptionalExtension, params};

/// The media type of canonical JSON values.
pub const JSON: &str = "application/json";

/// A value ready to store: its bytes and their digest.
#[derive(Clone, Debug)]
pub struct Blob {
    pub digest: Digest,
    pub bytes: Vec<u8>,
}

impl Blob {
    /// Canonical JSON bytes of `value` with their digest (hashing happens here,
    /// outside any transaction).
    pub fn json(value: &serde_json::Value) -> Self {
        let bytes = protocol::canonicalize(value).unwrap_or_else(|_| b"null".to_vec());
        Self {
            digest: crate::ids::sha256(&bytes),
            bytes,
        }
    }
}

impl Blob {
    /// UTF-8 `text` with its digest.
    pub fn text(text: &str) -> Self {
        Self {
            digest: crate::ids::sha256(text.as_bytes()),
            bytes: text.as_bytes().to_vec(),
        }
    }
}

/// The media type of message texts.
pub const TEXT: &str = "text/plain";

/// Stores `blob` (no-op when it exists).
pub(crate) fn put(
    connection: &Connection,
    blob: &Blob,
    media_type: &str,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO blobs (digest, media_type, bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (digest) DO NOTHING",
        params![
            blob.digest.0.to_vec(),
            media_type,
            blob.bytes,
            i64_of(now_ms)
        ],
    )?;
    Ok(())
}

/// Reads a stored value.
pub(crate) fn get(connection: &Connection, digest: &Digest) -> rusqlite::Result<Option<Vec<u8>>> {
    connection
        .query_row_cached(
            "SELECT bytes FROM blobs WHERE digest = ?1",
            params![digest.0.to_vec()],
            |row| row.get(0),
        )
        .optional()
}

/// Reads a stored JSON value (`null` when missing or unreadable).
pub(crate) fn get_json(
    connection: &Connection,
    digest: &Digest,
) -> rusqlite::Result<serde_json::Value> {
    Ok(get(connection, digest)?
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(serde_json::Value::Null))
}

/// Reads a digest column.
pub(crate) fn digest_of(column: Option<DigestColumn>) -> Option<Digest> {
    column.map(|c| c.0)
}

/// How many blobs are stored.
pub fn count(connection: &Connection) -> rusqlite::Result<i64> {
    connection.query_row("SELECT COUNT(*) FROM blobs", [], |row| row.get(0))
}
