//! Online backups of the state database and the verification of a database
//! file (the live one or an inactive backup), for `state backup`,
//! `state prune --apply` and `state verify`.
//!
//! Invariants:
//! - Both run on their own read-only connection, never on the writer's, so
//!   the writer keeps committing while they read one consistent snapshot.
//! - A backup never replaces a file: its destination is created exclusively
//!   (`O_CREAT | O_EXCL`, mode 0600) before SQLite writes into it with
//!   `VACUUM INTO`. It counts only once it is on disk (file and directory
//!   synced) and verified: SQLite's integrity check passes, no foreign key
//!   dangles, and its schema identity is this binary's. A backup that fails
//!   at any step removes the file it created; the live state is only read.
//! - Verification opens the file read-only and changes nothing; its report
//!   names checks and counts, never row contents.

use super::open::{read_only_flags, schema_difference, uri_path};
use super::{StoreError, consistency, ddl_digest, disk, retention, schema};
use kernel::ids::Digest;
use rusqlite::{Connection, ErrorCode};
use sha2::{Digest as _, Sha256};
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// At most this many lines of SQLite's integrity check are kept.
const INTEGRITY_LINES: usize = 8;

/// A written, synced and verified backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub digest: Digest,
}

/// Why a backup was not made (the destination is gone again in every case
/// but [`Failure::Exists`], which was never ours).
#[derive(Debug)]
pub enum Failure {
    /// Something appeared at the destination before it could be created.
    Exists,
    /// The destination's directory does not exist (any more).
    NoSuchDirectory,
    /// The disk holding the destination is full.
    DiskFull,
    /// Writing or reading the backup failed (a phrase without paths).
    Failed(String),
    /// The written file failed verification (its first problem).
    Unverified(String),
}

/// What is at `destination`, for `kernel::maintenance::check_destination`.
pub fn destination_facts(
    state: &Path,
    destination: &Path,
) -> kernel::maintenance::DestinationFacts {
    let exists = std::fs::symlink_metadata(destination).is_ok();
    let directory_exists = destination.parent().is_some_and(Path::is_dir);
    let is_state_file = state_files(state)
        .iter()
        .any(|file| same_file(file, destination));
    kernel::maintenance::DestinationFacts {
        exists,
        directory_exists,
        is_state_file,
    }
}

/// The live database and its companions.
fn state_files(state: &Path) -> [PathBuf; 4] {
    let with = |suffix: &str| {
        let mut name = state.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [
        state.to_path_buf(),
        with("-wal"),
        with("-shm"),
        with("-journal"),
    ]
}

/// Whether `a` and `b` name one file (by path, or by device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    if a == b {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `path` names the live database or one of its companions.
pub fn is_state_file(state: &Path, path: &Path) -> bool {
    state_files(state).iter().any(|file| same_file(file, path))
}

/// The bytes a backup of `state` will about take: its pages in use.
pub fn expected_bytes(state: &Path) -> u64 {
    read_only(state, false)
        .and_then(|connection| retention::page_stats(&connection))
        .map_or(0, |pages| {
            pages
                .page_count
                .saturating_sub(pages.free_pages)
                .saturating_mul(pages.page_size_bytes)
        })
}

/// A read-only connection to `path`: through its WAL (the live database), or
/// `immutable` (an inactive file: no `-wal` or `-shm` appears beside it).
fn read_only(path: &Path, immutable: bool) -> rusqlite::Result<Connection> {
    let mode = if immutable {
        "mode=ro&immutable=1"
    } else {
        "mode=ro"
    };
    let connection =
        Connection::open_with_flags(format!("file:{}?{mode}", uri_path(path)), read_only_flags())?;
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(connection)
}

/// Writes a backup of the live database `state` to the new file
/// `destination` (see the module invariants).
pub fn write(state: &Path, destination: &Path) -> Result<Written, Failure> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(destination)
    {
        Ok(file) => drop(file),
        Err(error) => {
            return Err(match error.kind() {
                std::io::ErrorKind::AlreadyExists => Failure::Exists,
                std::io::ErrorKind::NotFound => Failure::NoSuchDirectory,
                std::io::ErrorKind::StorageFull => Failure::DiskFull,
                _ => Failure::Failed("the backup file cannot be created".into()),
            });
        }
    }
    let written = copy_and_verify(state, destination);
    if written.is_err() {
        let _ = std::fs::remove_file(destination);
        sync_directory(destination);
    }
    written
}

fn copy_and_verify(state: &Path, destination: &Path) -> Result<Written, Failure> {
    let source = read_only(state, false)
        .map_err(|_| Failure::Failed("the live state cannot be read".into()))?;
    let target = destination.to_string_lossy().into_owned();
    source
        .execute("VACUUM INTO ?1", [target])
        .map_err(|error| written_failure(&error, destination))?;
    drop(source);
    let file = std::fs::File::open(destination)
        .map_err(|_| Failure::Failed("the backup cannot be read back".into()))?;
    file.sync_all().map_err(|error| match error.kind() {
        std::io::ErrorKind::StorageFull => Failure::DiskFull,
        _ => Failure::Failed("the backup cannot be synced to disk".into()),
    })?;
    drop(file);
    sync_directory(destination);
    let report = read_only(destination, true)
        .and_then(|connection| verify(&connection, true))
        .map_err(|_| Failure::Unverified("the backup cannot be opened as a database".into()))?;
    if let Some(problem) = report.first_problem() {
        return Err(Failure::Unverified(problem));
    }
    digest_of(destination).map_err(|_| Failure::Failed("the backup cannot be read back".into()))
}

/// A failed `VACUUM INTO`: a full disk, or another failure.
fn written_failure(error: &rusqlite::Error, destination: &Path) -> Failure {
    if error.sqlite_error_code() == Some(ErrorCode::DiskFull) || disk::is_full(error, destination) {
        Failure::DiskFull
    } else {
        Failure::Failed(format!(
            "SQLite could not write the backup ({})",
            super::safe_sqlite_message(error)
        ))
    }
}

fn sync_directory(path: &Path) {
    if let Some(directory) = path.parent()
        && let Ok(directory) = std::fs::File::open(directory)
    {
        let _ = directory.sync_all();
    }
}

/// The length and SHA-256 of a file.
fn digest_of(path: &Path) -> std::io::Result<Written> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1024 * 1024];
    let mut bytes = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        bytes += read as u64;
    }
    Ok(Written {
        bytes,
        digest: Digest(hasher.finalize().into()),
    })
}

// ---- verification -------------------------------------------------------------

/// One consistency check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    pub message: &'static str,
    pub violations: u64,
    /// Not run: it holds only while no runner is live, and runners were.
    pub skipped: bool,
}

/// What verifying a database found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    /// SQLite's integrity check: `["ok"]`, or its first lines.
    pub integrity: Vec<String>,
    /// The stored schema name, version and DDL digest are this binary's.
    pub identity_matches: bool,
    /// The stored DDL digest.
    pub ddl_digest: String,
    /// How the schema objects differ from the DDL's (`None`: they match).
    pub schema_difference: Option<String>,
    /// Rows whose foreign key names a missing row.
    pub foreign_key_violations: u64,
    pub checks: Vec<CheckResult>,
    pub orphaned_blobs: u64,
}

impl Verification {
    /// How many problems it found (orphaned blobs are waste, not damage:
    /// each counts as one problem so a collection bug is seen).
    pub fn problems(&self) -> u64 {
        let integrity = u64::from(self.integrity != ["ok"]);
        let identity = u64::from(!self.identity_matches);
        let schema = u64::from(self.schema_difference.is_some());
        let checks: u64 = self.checks.iter().map(|check| check.violations).sum();
        integrity + identity + schema + self.foreign_key_violations + checks + self.orphaned_blobs
    }

    /// The first problem, as a phrase without row contents.
    pub fn first_problem(&self) -> Option<String> {
        if self.integrity != ["ok"] {
            return Some("it fails SQLite's integrity check".into());
        }
        if !self.identity_matches {
            return Some("its schema identity is not this version's".into());
        }
        if let Some(difference) = &self.schema_difference {
            return Some(format!("its schema {difference}"));
        }
        if self.foreign_key_violations > 0 {
            return Some("a foreign key names a missing row".into());
        }
        if let Some(check) = self.checks.iter().find(|check| check.violations > 0) {
            return Some(format!("consistency check failed: {}", check.message));
        }
        (self.orphaned_blobs > 0).then(|| "it holds blobs nothing refers to".into())
    }
}

/// Verifies the database behind `connection`: integrity, schema identity
/// and objects, foreign keys, every consistency check (the quiescent-only
/// ones only when `quiescent`), orphaned blobs.
pub fn verify(connection: &Connection, quiescent: bool) -> rusqlite::Result<Verification> {
    let integrity: Vec<String> = {
        let mut statement =
            connection.prepare(&format!("PRAGMA integrity_check({INTEGRITY_LINES})"))?;
        let rows = statement.query_map([], |row| row.get::<_, String>(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let (identity_matches, ddl) = connection
        .query_row(
            "SELECT schema_name, schema_version, ddl_digest FROM schema_meta WHERE singleton = 1",
            [],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                ))
            },
        )
        .map(|(name, version, digest)| {
            (
                name == "pi-workflows-state"
                    && version == schema::VERSION
                    && digest == ddl_digest(),
                digest,
            )
        })
        .unwrap_or((false, String::new()));
    let schema_difference = match schema_difference(connection) {
        Ok(difference) => difference,
        Err(StoreError::Sqlite(error)) => return Err(error),
        Err(_) => Some("cannot be read".into()),
    };
    let foreign_key_violations: u64 =
        connection.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |row| {
            row.get::<_, i64>(0).map(super::codec::u64_of)
        })?;
    let checks = consistency::CHECKS
        .iter()
        .map(|check| {
            let skipped = check.quiescent_only && !quiescent;
            let violations = if skipped {
                0
            } else {
                consistency::violations_of(connection, std::slice::from_ref(check)).len() as u64
            };
            CheckResult {
                message: check.message,
                violations,
                skipped,
            }
        })
        .collect();
    Ok(Verification {
        integrity,
        identity_matches,
        ddl_digest: ddl,
        schema_difference,
        foreign_key_violations,
        checks,
        orphaned_blobs: retention::orphaned_blobs(connection)?,
    })
}

/// Verifies the live database `state` on a read-only connection of its own.
pub fn verify_live(state: &Path, quiescent: bool) -> rusqlite::Result<Verification> {
    let connection = read_only(state, false)?;
    connection.execute_batch("BEGIN")?;
    let report = verify(&connection, quiescent);
    let _ = connection.execute_batch("COMMIT");
    report
}

/// Verifies an inactive database file (a backup) without changing it.
pub fn verify_file(path: &Path) -> rusqlite::Result<Verification> {
    verify(&read_only(path, true)?, true)
}
