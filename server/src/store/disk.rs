//! A full disk under the state database: how it is recognised and how much
//! space is asked for.
//!
//! Invariants:
//! - A statement that fails because the filesystem of `state.sqlite` has no
//!   room is a full disk, never a generic database failure: SQLite's
//!   `SQLITE_FULL`, or an I/O error while that filesystem has no free block
//!   left for an unprivileged writer (SQLite reports some failed
//!   allocations, e.g. of its `-shm` index, as I/O errors).
//! - The space asked for is an estimate, said as "about": the pages that
//!   exist only in the WAL (a checkpoint grows the main file to hold them)
//!   plus one automatic-checkpoint interval of WAL growth (1000 pages),
//!   rounded up to whole MiB.

use rusqlite::{Connection, ErrorCode};
use std::path::Path;

/// SQLite's automatic checkpoint interval, in pages (its default).
const AUTOCHECKPOINT_PAGES: u64 = 1000;

const MIB: u64 = 1024 * 1024;

/// With this much free, a full-disk episode is over (and a server may
/// start).
pub(crate) const ROOM_AGAIN_BYTES: u64 = MIB;

/// Whether `error` means the disk of `database` is full.
pub(crate) fn is_full(error: &rusqlite::Error, database: &Path) -> bool {
    match error.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => true,
        Some(ErrorCode::SystemIoFailure) => no_free_block(database),
        _ => false,
    }
}

/// Whether the filesystem holding `database` has no block left for an
/// unprivileged writer.
fn no_free_block(database: &Path) -> bool {
    free_bytes(database) == Some(0)
}

/// The bytes an unprivileged writer may still use on the filesystem holding
/// `database` (`None` when it cannot be asked).
pub(crate) fn free_bytes(database: &Path) -> Option<u64> {
    let directory = database.parent().unwrap_or(database);
    let stat = nix::sys::statvfs::statvfs(directory).ok()?;
    Some(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// About how many bytes must be freed for writes to go on (see the module
/// doc), at least 1 MiB.
pub(crate) fn needed_bytes(connection: &Connection, database: &Path) -> u64 {
    let pragma = |name: &str| -> u64 {
        connection
            .query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))
            .map_or(0, |value| u64::try_from(value).unwrap_or(0))
    };
    let page_size = pragma("page_size").max(512);
    let logical_bytes = pragma("page_count").saturating_mul(page_size);
    let main_bytes = std::fs::metadata(database).map_or(0, |meta| meta.len());
    let only_in_wal = logical_bytes.saturating_sub(main_bytes);
    let bytes = only_in_wal.saturating_add(AUTOCHECKPOINT_PAGES.saturating_mul(page_size));
    bytes.div_ceil(MIB).max(1) * MIB
}

/// `bytes` as whole MiB, for messages.
pub(crate) fn mebibytes(bytes: u64) -> u64 {
    bytes.div_ceil(MIB).max(1)
}
