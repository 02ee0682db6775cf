//! Opening `state.sqlite`: a missing file is created whole; an existing one
//! is verified before anything opens it for writing.
//!
//! Invariants:
//! - Only a missing `state.sqlite` starts a new database, and a new database
//!   appears whole: it is built under a temporary name, synced, and only then
//!   linked into place (never over an existing file), so a crash during
//!   creation leaves no empty or half-made `state.sqlite`. The build itself
//!   keeps no journal and syncs nothing (its file is thrown away if anything
//!   fails or crashes); the file is synced once, whole, and is in WAL mode
//!   from its header on.
//! - An existing file is verified read-only, the way SQLite recovers it:
//!   when its `-wal` holds frames, through the WAL (a read-only open; it may
//!   create or rebuild the `-shm` file, SQLite's index of the WAL, which
//!   holds no data and is rebuilt on every recovery); otherwise the main
//!   file alone, opened immutable, so no `-wal` or `-shm` file appears.
//!   Verification never writes the main file or the WAL.
//! - A refusal leaves the files as they were and names its one cause: a
//!   missing file whose `-wal` holds frames (they belong to a database that
//!   was moved away, and SQLite would replay them over a new one), an
//!   empty file, something that is not a file, a file that is not an SQLite
//!   database, damage (SQLite's quick check fails, the file is shorter than
//!   its own pages, or the schema differs from the one its DDL digest
//!   names), or an incompatible database (another schema name, version or
//!   DDL digest). Only the last gets the back-up-and-move instruction.
//! - The schema check compares every table, index, view and trigger of
//!   `sqlite_schema` with the ones the DDL creates, by digest; a full quick
//!   check (which reads every page) runs only to classify a database that
//!   failed another check.
//! - The writer connection does not checkpoint when it closes: a server
//!   refused at startup (a full disk) closes it without touching the main
//!   file; checkpoints are the writer's own (see `store`).

use super::{Damage, StoreError, Unusable, ddl_digest, disk, schema};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How many compiled statements a connection keeps: more than the server
/// has distinct SQL texts, so none is ever compiled twice.
const STATEMENT_CACHE_CAPACITY: usize = 256;

/// The WAL is cut back to this size when SQLite restarts it after a
/// checkpoint (it may grow past it inside one busy period).
const JOURNAL_SIZE_LIMIT_BYTES: i64 = 4 * 1024 * 1024;

/// Opens (creating it if missing) the database at `path` for the writer.
pub(super) fn open(path: &Path) -> Result<Connection, StoreError> {
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            // A WAL without its database: SQLite would replay its frames
            // over the new file (it cannot tell whose they are).
            if std::fs::metadata(with_suffix(path, "-wal")).is_ok_and(|wal| wal.len() > 0) {
                return Err(StoreError::WalWithoutDatabase);
            }
            create(path)?;
        }
        Err(_) => return Err(StoreError::Unusable(Unusable::Unreadable)),
        Ok(_) => {
            let verified = verify(path)?;
            // With less room its first writes would fail anyway (and a failed
            // WAL append may still leave bytes past the WAL's last valid frame).
            if disk::free_bytes(path).is_some_and(|free| free < disk::ROOM_AGAIN_BYTES) {
                return Err(StoreError::DiskFull {
                    needed_bytes: disk::needed_bytes(&verified, path),
                });
            }
        }
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection =
        Connection::open_with_flags(path, flags).map_err(|error| classify(&error, path))?;
    configure(&connection).map_err(|error| classify(&error, path))?;
    Ok(connection)
}

/// A store error for an SQLite failure while opening `path`.
fn classify(error: &rusqlite::Error, path: &Path) -> StoreError {
    if disk::is_full(error, path) {
        let needed_bytes = Connection::open_with_flags(path, read_only_flags())
            .map_or(0, |connection| disk::needed_bytes(&connection, path));
        return StoreError::DiskFull { needed_bytes };
    }
    StoreError::Sqlite(super::clone_error(error))
}

/// Opens the reader's connection (see `reader`): read-only, on the database
/// `open` opened for the writer.
pub(super) fn reader(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection =
        Connection::open_with_flags(path, flags).map_err(|error| classify(&error, path))?;
    configure_statements(&connection).map_err(|error| classify(&error, path))?;
    Ok(connection)
}

fn configure(connection: &Connection) -> rusqlite::Result<()> {
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "FULL")?;
    connection.pragma_update(None, "foreign_keys", "ON")?;
    connection.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT_BYTES)?;
    configure_statements(connection)?;
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    Ok(())
}

/// What the writer's and the reader's connections share: temporary storage,
/// the busy wait and how statements are compiled and kept.
fn configure_statements(connection: &Connection) -> rusqlite::Result<()> {
    // Statement journals (one per job savepoint) and temporary sort trees
    // stay in memory: a job's savepoint journal above 64 KiB otherwise spills
    // to a new temporary file (open, write) inside the transaction. They are
    // never needed after a crash (the WAL is), so durability is unchanged.
    connection.pragma_update(None, "temp_store", "MEMORY")?;
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    // Query-planner stability: a statement's plan never depends on the
    // values bound to it. Without this, SQLite (built with STAT4, as the
    // bundled one is) marks `col = ?N` parameters as plan-relevant, and every
    // rebinding of a cached statement expires it, so `prepare_cached`
    // recompiles it on each use anyway. Results are unaffected; plans are the
    // ones a fresh `prepare` (no values known yet) makes.
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

pub(super) fn read_only_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

// ---- creation ---------------------------------------------------------------

/// Builds a new database under `<name>.creating`, syncs it once and links it
/// into place.
fn create(path: &Path) -> Result<(), StoreError> {
    let building = with_suffix(path, ".creating");
    // Leftovers of a creation that crashed hold no runs (nothing was ever
    // committed through them); the global lock keeps anyone else out.
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(with_suffix(&building, suffix));
    }
    let linked = build(&building)
        .and_then(|()| sync(&building))
        .and_then(|()| {
            std::fs::hard_link(&building, path)
                .map_err(|_| StoreError::Unusable(Unusable::Unreadable))
        });
    let _ = std::fs::remove_file(&building);
    linked?;
    if let Some(directory) = path.parent()
        && let Ok(directory) = std::fs::File::open(directory)
    {
        let _ = directory.sync_all();
    }
    Ok(())
}

/// Writes the schema into `building` with no journal and no syncs (a crash
/// leaves a file that is never linked, and the next creation deletes it),
/// then records WAL mode in its header, so the file is born in WAL mode.
fn build(building: &Path) -> Result<(), StoreError> {
    let connection = Connection::open(building).map_err(|error| classify(&error, building))?;
    let created = (|| {
        connection.pragma_update(None, "journal_mode", "OFF")?;
        connection.pragma_update(None, "synchronous", "OFF")?;
        create_schema(&connection)?;
        connection.query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        })
    })();
    match created {
        Ok(mode) if mode == "wal" => {}
        Ok(_) => return Err(StoreError::Unusable(Unusable::Unreadable)),
        Err(error) => return Err(classify(&error, building)),
    }
    connection
        .close()
        .map_err(|(_, error)| classify(&error, building))
}

/// The one sync of a new database: its whole file, before it is linked.
fn sync(building: &Path) -> Result<(), StoreError> {
    std::fs::File::open(building)
        .and_then(|file| file.sync_all())
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::StorageFull => StoreError::DiskFull {
                needed_bytes: disk::ROOM_AGAIN_BYTES,
            },
            _ => StoreError::Unusable(Unusable::Unreadable),
        })
}

fn create_schema(connection: &Connection) -> rusqlite::Result<()> {
    let now_ms = crate::clock::now_ms();
    connection.execute_batch("BEGIN IMMEDIATE")?;
    connection.execute_batch(schema::DDL)?;
    connection.execute(
        "INSERT INTO schema_meta (singleton, schema_name, schema_version, ddl_digest, created_at_ms) VALUES (1, 'pi-workflows-state', ?3, ?1, ?2)",
        rusqlite::params![ddl_digest(), now_ms as i64, schema::VERSION],
    )?;
    connection.execute_batch("COMMIT")
}

// ---- verification -------------------------------------------------------------

/// Verifies an existing `state.sqlite` read-only (see the module doc) and
/// returns the read-only connection that did.
fn verify(path: &Path) -> Result<Connection, StoreError> {
    let meta = std::fs::metadata(path).map_err(|_| StoreError::Unusable(Unusable::Unreadable))?;
    if !meta.is_file() {
        return Err(StoreError::Unusable(Unusable::NotAFile));
    }
    if meta.len() == 0 {
        return Err(StoreError::Empty);
    }
    let wal_has_frames =
        std::fs::metadata(with_suffix(path, "-wal")).is_ok_and(|wal| wal.len() > 0);
    let mode = if wal_has_frames {
        "mode=ro"
    } else {
        "mode=ro&immutable=1"
    };
    let uri = format!("file:{}?{mode}", uri_path(path));
    let connection = Connection::open_with_flags(uri, read_only_flags()).map_err(|error| {
        StoreError::Unusable(match error.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) => Unusable::NotADatabase,
            _ => Unusable::Unreadable,
        })
    })?;
    let identity: rusqlite::Result<(String, i64, String)> = connection.query_row(
        "SELECT schema_name, schema_version, ddl_digest FROM schema_meta WHERE singleton = 1",
        [],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    );
    let compatible = match identity {
        Ok((name, version, digest)) if version == super::schema::VERSION => {
            name == "pi-workflows-state" && digest == ddl_digest()
        }
        Ok(_) => false,
        Err(error) if error.sqlite_error_code() == Some(ErrorCode::NotADatabase) => {
            return Err(StoreError::Unusable(Unusable::NotADatabase));
        }
        Err(_) => false,
    };
    if !compatible {
        // Another schema, or damage that hides this one: the quick check tells.
        return Err(match quick_check(&connection) {
            Ok(()) => StoreError::Incompatible,
            Err(damage) => damage,
        });
    }
    if !wal_has_frames {
        let pages = pragma(&connection, "page_count")?;
        let page_size = pragma(&connection, "page_size")?;
        if pages.saturating_mul(page_size) > meta.len() {
            return Err(StoreError::Damaged(Damage::Truncated));
        }
    }
    if let Some(difference) = schema_difference(&connection)? {
        return Err(StoreError::Damaged(Damage::SchemaChanged(difference)));
    }
    Ok(connection)
}

fn pragma(connection: &Connection, name: &str) -> Result<u64, StoreError> {
    connection
        .query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))
        .map(|value| u64::try_from(value).unwrap_or(0))
        .map_err(damage_of)
}

/// An SQLite failure while reading a database that looked like ours.
fn damage_of(error: rusqlite::Error) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::Unusable(Unusable::NotADatabase),
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Damaged(Damage::IntegrityCheck),
        _ => StoreError::Unusable(Unusable::Unreadable),
    }
}

/// `PRAGMA quick_check`: `Ok` when SQLite finds the file sound.
fn quick_check(connection: &Connection) -> Result<(), StoreError> {
    let verdict: rusqlite::Result<String> =
        connection.query_row("PRAGMA quick_check(1)", [], |row| row.get(0));
    match verdict {
        Ok(text) if text == "ok" => Ok(()),
        Ok(_) => Err(StoreError::Damaged(Damage::IntegrityCheck)),
        Err(error) => Err(match damage_of(error) {
            StoreError::Unusable(Unusable::Unreadable) => {
                StoreError::Damaged(Damage::IntegrityCheck)
            }
            other => other,
        }),
    }
}

/// One `sqlite_schema` row: (type, name) → (table, SQL text).
type SchemaObjects = BTreeMap<(String, String), (String, Option<String>)>;

fn schema_objects(connection: &Connection) -> rusqlite::Result<SchemaObjects> {
    let mut statement = connection.prepare(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_stat%'",
    )?;
    let rows = statement.query_map([], |row| {
        Ok(((row.get(0)?, row.get(1)?), (row.get(2)?, row.get(3)?)))
    })?;
    rows.collect()
}

fn objects_digest(objects: &SchemaObjects) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for ((kind, name), (table, sql)) in objects {
        for part in [kind.as_str(), name, table, sql.as_deref().unwrap_or("")] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.update([b'\n']);
    }
    hasher.finalize().into()
}

/// The schema objects the DDL creates (built once, in memory).
fn expected_objects() -> &'static (SchemaObjects, [u8; 32]) {
    static EXPECTED: OnceLock<(SchemaObjects, [u8; 32])> = OnceLock::new();
    EXPECTED.get_or_init(|| {
        let connection = Connection::open_in_memory().expect("an in-memory database opens");
        connection
            .execute_batch(schema::DDL)
            .expect("the DDL creates its schema");
        let objects = schema_objects(&connection).expect("the new schema reads");
        let digest = objects_digest(&objects);
        (objects, digest)
    })
}

/// The first difference between the installed schema and the DDL's, as a
/// phrase for the damage message (`None` when their digests are equal).
pub(super) fn schema_difference(connection: &Connection) -> Result<Option<String>, StoreError> {
    let installed = schema_objects(connection).map_err(damage_of)?;
    let (expected, expected_digest) = expected_objects();
    if objects_digest(&installed) == *expected_digest {
        return Ok(None);
    }
    // Tables first: a dropped table also drops its indexes, and the table
    // is what to name.
    let mut expected_in_order: Vec<_> = expected.iter().collect();
    expected_in_order.sort_by_key(|((kind, _), _)| kind != "table");
    for ((kind, name), definition) in expected_in_order {
        match installed.get(&(kind.clone(), name.clone())) {
            None => return Ok(Some(format!("lacks {kind} {name}"))),
            Some(found) if found != definition => {
                return Ok(Some(format!("has a changed definition of {kind} {name}")));
            }
            Some(_) => {}
        }
    }
    let extra = installed
        .keys()
        .find(|key| !expected.contains_key(*key))
        .map(|(kind, name)| format!("has {kind} {name}, which its schema does not name"));
    Ok(Some(extra.unwrap_or_else(|| "has another schema".into())))
}

pub(super) fn uri_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    text.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}
