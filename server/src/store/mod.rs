//! The SQLite store: one database file, one writer thread, group commit.
//!
//! Invariants:
//! - Only the writer thread opens the database for writing. Every write is a
//!   job: the handler's closure runs inside one `BEGIN IMMEDIATE` transaction
//!   (its own savepoint when a job precedes it in the commit) and its reply is
//!   sent only after `COMMIT` returned.
//! - Jobs that arrive together share one commit (group commit); a job whose
//!   closure fails or discards rolls back only its savepoint.
//! - No process, network or hashing work happens inside a job: the caller
//!   computes digests before it submits the closure.
//! - An installed database with another DDL digest is refused before any
//!   mutation, and no file is created or changed.

pub mod attempts;
pub mod blobs;
mod codec;
pub(crate) use codec::name as codec_name;
pub mod commands;
pub mod decisions;
pub mod host;
pub mod meta;
pub mod runs;
pub mod schema;
pub mod viewer;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, Params, Row};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use tokio::sync::oneshot;

/// The exact instruction shown for an incompatible database.
pub const INCOMPATIBLE_STATE: &str = "Pi Workflows durable state is incompatible. Back up and move state.sqlite with its -wal and -shm files, then start Pi Workflows to create a new state.sqlite database. The incompatible state was not changed.";

/// How many jobs may share one commit.
const MAX_JOBS_PER_COMMIT: usize = 256;

/// How many compiled statements the writer connection keeps: more than the
/// server has distinct SQL texts, so none is ever compiled twice.
const STATEMENT_CACHE_CAPACITY: usize = 256;

/// Statements through the connection's prepared-statement cache: each SQL
/// text is compiled once per connection, not on every call. Same results and
/// errors as `Connection::execute` / `Connection::query_row`.
pub(crate) trait Cached {
    /// `Connection::execute` with a cached statement.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// `Connection::query_row` with a cached statement.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Runs one transaction-control statement (`BEGIN IMMEDIATE`, `SAVEPOINT`,
/// `COMMIT`, ...) through the statement cache.
fn control(connection: &Connection, sql: &str) -> rusqlite::Result<()> {
    connection.execute_cached(sql, []).map(|_| ())
}

/// Why the store could not be opened or used.
#[derive(Debug)]
pub enum StoreError {
    /// The installed database is not this schema; nothing was changed.
    Incompatible,
    /// SQLite failed.
    Sqlite(rusqlite::Error),
    /// The writer thread is gone (server shutting down).
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Incompatible => f.write_str(INCOMPATIBLE_STATE),
            Self::Sqlite(error) => {
                write!(f, "state database error: {}", safe_sqlite_message(error))
            }
            Self::Closed => f.write_str("the state store is closed"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sqlite(error)
    }
}

/// SQLite messages can quote values; report only the error class.
fn safe_sqlite_message(error: &rusqlite::Error) -> String {
    match error {
        rusqlite::Error::SqliteFailure(code, _) => format!("{:?}", code.code),
        other => {
            let text = other.to_string();
            text.split(':')
                .next()
                .unwrap_or("unknown")
                .chars()
                .take(80)
                .collect()
        }
    }
}

/// The digest of the DDL this binary writes and accepts.
pub fn ddl_digest() -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(schema::DDL.as_bytes()))
    )
}

/// What a write job decides about its own changes.
#[derive(Debug)]
pub enum Commit<R> {
    /// Keep the changes; reply after the shared commit.
    Keep(R),
    /// Roll back this job's changes (a kernel rejection); still reply after the commit.
    Discard(R),
}

type WriteFn = Box<dyn FnOnce(&Connection) -> bool + Send>;
type ReplyFn = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

struct Job {
    run: WriteFn,
    reply: ReplyFn,
}

/// A committed presentation change: the run and its new presentation revision.
pub type Published = (kernel::ids::RunId, u64);

/// A handle to the writer thread. Cloning shares the same thread.
#[derive(Clone, Debug)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
    published: tokio::sync::broadcast::Sender<Published>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Store {
    /// Opens (or creates) the database at `path` and starts the writer thread.
    pub fn open(path: &Path, faults: crate::fault::Faults) -> Result<Self, StoreError> {
        let connection = open_connection(path)?;
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (published, _) = tokio::sync::broadcast::channel(4096);
        let sender = published.clone();
        thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || writer_loop(connection, receiver, faults, sender))
            .map_err(|_| StoreError::Closed)?;
        Ok(Self {
            jobs,
            path: path.to_path_buf(),
            published,
        })
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Presentation changes, announced after their commit.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Published> {
        self.published.subscribe()
    }

    /// Runs `write` in the writer thread inside a transaction and returns its
    /// value after the commit.
    pub async fn write<R, F>(&self, write: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<Commit<R>> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel::<Result<R, StoreError>>();
        type Slot<R> = std::sync::Arc<std::sync::Mutex<Option<rusqlite::Result<R>>>>;
        let slot: Slot<R> = Default::default();
        let slot_for_run = slot.clone();
        let run: WriteFn = Box::new(move |connection| {
            let (keep, value) = match write(connection) {
                Ok(Commit::Keep(value)) => (true, Ok(value)),
                Ok(Commit::Discard(value)) => (false, Ok(value)),
                Err(error) => (false, Err(error)),
            };
            *slot_for_run.lock().expect("slot lock") = Some(value);
            keep
        });
        let reply: ReplyFn = Box::new(move |committed| {
            let value = slot.lock().expect("slot lock").take();
            let result = committed.and_then(|()| match value {
                Some(Ok(value)) => Ok(value),
                Some(Err(error)) => Err(StoreError::Sqlite(error)),
                None => Err(StoreError::Closed),
            });
            let _ = sender.send(result);
        });
        self.jobs
            .send(Job { run, reply })
            .map_err(|_| StoreError::Closed)?;
        receiver.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs a read inside the writer thread (a consistent snapshot of committed state).
    pub async fn read<R, F>(&self, read: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        self.write(move |connection| read(connection).map(Commit::Discard))
            .await
    }
}

/// Opens the database: verifies an existing file read-only first so that an
/// incompatible database is never touched, then opens it for writing.
fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let exists = path.metadata().map(|meta| meta.len() > 0).unwrap_or(false);
    if exists {
        verify_existing(path)?;
    }
    let connection = Connection::open(path)?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "FULL")?;
    connection.pragma_update(None, "foreign_keys", "ON")?;
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
    if !exists {
        create_schema(&connection)?;
    }
    Ok(connection)
}

/// Reads the stored DDL digest without writing anything (no WAL or SHM file
/// is created: the file is opened immutable).
fn verify_existing(path: &Path) -> Result<(), StoreError> {
    let uri = format!("file:{}?mode=ro&immutable=1", uri_path(path));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection =
        Connection::open_with_flags(uri, flags).map_err(|_| StoreError::Incompatible)?;
    let stored: Result<(String, i64, String), _> = connection.query_row(
        "SELECT schema_name, schema_version, ddl_digest FROM schema_meta WHERE singleton = 1",
        [],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    );
    match stored {
        Ok((name, 1, digest)) if name == "pi-workflows-state" && digest == ddl_digest() => Ok(()),
        _ => Err(StoreError::Incompatible),
    }
}

fn uri_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    text.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

fn create_schema(connection: &Connection) -> Result<(), StoreError> {
    let now_ms = crate::clock::now_ms();
    connection.execute_batch("BEGIN IMMEDIATE")?;
    let created = connection.execute_batch(schema::DDL).and_then(|()| {
        connection.execute(
            "INSERT INTO schema_meta (singleton, schema_name, schema_version, ddl_digest, created_at_ms) VALUES (1, 'pi-workflows-state', 1, ?1, ?2)",
            rusqlite::params![ddl_digest(), now_ms as i64],
        )
    });
    match created {
        Ok(_) => connection.execute_batch("COMMIT")?,
        Err(error) => {
            let _ = connection.execute_batch("ROLLBACK");
            return Err(error.into());
        }
    }
    // Move the schema into the main file so a later read-only check sees it.
    connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

fn writer_loop(
    connection: Connection,
    receiver: mpsc::Receiver<Job>,
    faults: crate::fault::Faults,
    published: tokio::sync::broadcast::Sender<Published>,
) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_JOBS_PER_COMMIT {
            match receiver.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut changes = Vec::new();
        let committed = run_batch(&connection, &mut batch, &faults, &mut changes);
        faults.hit(crate::fault::FaultPoint::AfterCommit);
        if committed.is_ok() {
            for change in changes {
                let _ = published.send(change);
            }
        }
        for job in batch {
            let result = match &committed {
                Ok(()) => Ok(()),
                Err(error) => Err(StoreError::Sqlite(clone_error(error))),
            };
            (job.reply)(result);
        }
    }
}

fn clone_error(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        _ => rusqlite::Error::InvalidQuery,
    }
}

fn run_batch(
    connection: &Connection,
    batch: &mut [Job],
    faults: &crate::fault::Faults,
    changes: &mut Vec<Published>,
) -> rusqlite::Result<()> {
    control(connection, "BEGIN IMMEDIATE")?;
    for (index, job) in batch.iter_mut().enumerate() {
        let run = std::mem::replace(&mut job.run, Box::new(|_| false));
        // The first job needs no savepoint: nothing precedes it in the
        // transaction, so rolling the transaction back and beginning a new
        // one undoes exactly its changes (and spares every single-job batch
        // its savepoint journal).
        let savepoint = index > 0;
        if savepoint {
            control(connection, "SAVEPOINT job")?;
        }
        // Every run the job changed gets its presentation revision and patch
        // inside the job's savepoint.
        let mut published = Vec::new();
        let kept = run(connection) && viewer::flush(connection).map(|p| published = p).is_ok();
        viewer::discard();
        if kept {
            if savepoint {
                control(connection, "RELEASE job")?;
            }
            changes.extend(published);
        } else if savepoint {
            control(connection, "ROLLBACK TO job")?;
            control(connection, "RELEASE job")?;
        } else {
            control(connection, "ROLLBACK")?;
            control(connection, "BEGIN IMMEDIATE")?;
        }
    }
    faults.hit(crate::fault::FaultPoint::BeforeCommit);
    if let Err(error) = control(connection, "COMMIT") {
        let _ = control(connection, "ROLLBACK");
        return Err(error);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(
        path: &'static str,
        keep: bool,
        ran: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    ) -> Job {
        Job {
            run: Box::new(move |connection| {
                connection
                    .execute_cached(
                        "INSERT INTO projects (project_id, canonical_path, created_at_ms) VALUES (?1, ?1, 0)",
                        [path],
                    )
                    .expect("insert");
                keep
            }),
            reply: Box::new(move |committed| ran.lock().expect("lock").push(committed.is_ok())),
        }
    }

    /// A discarded job leaves nothing behind and the kept ones around it all
    /// commit, whether it is the batch's first job (no savepoint: the
    /// transaction is rolled back and begun again) or a later one.
    #[test]
    fn discarded_jobs_roll_back_only_their_own_changes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let connection = open_connection(&dir.path().join("state.sqlite")).expect("open");
        let replies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut batch = vec![
            job("/a", false, replies.clone()),
            job("/b", true, replies.clone()),
            job("/c", false, replies.clone()),
            job("/d", true, replies.clone()),
        ];
        let mut changes = Vec::new();
        run_batch(&connection, &mut batch, &Default::default(), &mut changes).expect("batch");
        let mut kept = Vec::new();
        {
            let mut statement = connection
                .prepare("SELECT canonical_path FROM projects ORDER BY canonical_path")
                .expect("prepare");
            let rows = statement
                .query_map([], |row| row.get::<_, String>(0))
                .expect("query");
            for row in rows {
                kept.push(row.expect("row"));
            }
        }
        assert_eq!(kept, ["/b", "/d"]);
        assert!(connection.is_autocommit(), "the batch's transaction ended");
        // A batch whose only job is discarded commits nothing.
        let mut batch = vec![job("/e", false, replies.clone())];
        run_batch(&connection, &mut batch, &Default::default(), &mut changes).expect("batch");
        let count: i64 = connection
            .query_row("SELECT COUNT(*) FROM projects", [], |row| row.get(0))
            .expect("count");
        assert_eq!(count, 2);
        assert!(connection.is_autocommit());
    }
}
