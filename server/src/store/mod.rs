//! The SQLite store: one database file, one writer thread, group commit,
//! the WAL's checkpoints, and one reader thread (`reader`).
//!
//! Invariants:
//! - Only the writer thread opens the database for writing (`open` verifies
//!   an existing file first and refuses it before any mutation). Every write
//!   is a job: the handler's closure runs inside one `BEGIN IMMEDIATE`
//!   transaction (its own savepoint when a kept job precedes it in the
//!   commit) and its reply is sent only after `COMMIT` returned.
//! - Reads (`Store::read`) never run on the writer thread: the reader runs
//!   each one in its own snapshot on a read-only connection, beside the
//!   writer's transactions, and sees every write whose reply came before it.
//! - Jobs that arrive together share one commit (group commit); a job whose
//!   closure discards rolls back only its own changes.
//! - Any SQL error inside a job (its closure, its presentation flush, its
//!   savepoint) fails that job: its reply is an error, never its value, and
//!   the writer logs one bounded line without values. When SQLite rolls the
//!   whole transaction back on its own (a full disk, an I/O error), every
//!   job kept in it fails too; a failed `COMMIT` fails every kept job.
//! - A full disk is `StoreError::DiskFull`, never a generic failure. The
//!   writer logs one line when a write first fails for it and one when a
//!   write commits with `disk::ROOM_AGAIN_BYTES` free again (writes that fit
//!   in the WAL's existing space may commit in between), and meanwhile
//!   commits each job alone, so a job that writes nothing (a refused
//!   command) still succeeds beside writes that cannot.
//! - The WAL is checkpointed by the writer between jobs: truncated once the
//!   writer has been idle for `IDLE_CHECKPOINT_AFTER` and the WAL holds at
//!   least `CHECKPOINT_MIN_WAL_BYTES`, and checkpointed (without waiting for
//!   readers) at most every `PASSIVE_CHECKPOINT_EVERY` while busy. A
//!   checkpoint never waits for a reader and a failed one is retried later.
//! - No process, network or hashing work happens inside a job: the caller
//!   computes digests before it submits the closure.

pub mod attempts;
pub mod backup;
pub mod blobs;
pub(crate) mod capture;
pub(crate) mod channels;
mod codec;
pub mod commands;
pub mod consistency;
pub mod counts;
pub mod decisions;
mod disk;
pub(crate) mod follow_ups;
pub mod host;
pub(crate) mod intents;
pub(crate) mod launches;
pub mod meta;
mod open;
pub mod processes;
mod reader;
pub mod resources;
pub mod retention;
pub mod runs;
pub mod schema;
pub mod sessions;
pub(crate) mod settings;
pub mod submissions;
pub(crate) mod terminal;
pub mod updates;
pub mod view_facts;
pub mod view_reads;
pub mod viewer;
pub mod why;

use rusqlite::{Connection, Params, Row};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The exact instruction shown for an incompatible database.
pub const INCOMPATIBLE_STATE: &str = "Pi Workflows durable state is incompatible. Back up and move state.sqlite with its -wal and -shm files, then start Pi Workflows to create a new state.sqlite database. The incompatible state was not changed.";

/// How many jobs may share one commit.
const MAX_JOBS_PER_COMMIT: usize = 256;

/// How long the writer waits without a job before it truncates the WAL.
const IDLE_CHECKPOINT_AFTER: Duration = Duration::from_millis(200);

/// How often a busy writer checkpoints (passively) at most.
const PASSIVE_CHECKPOINT_EVERY: Duration = Duration::from_secs(10);

/// A smaller WAL is left alone (an idle server's lease renewals add a few
/// pages at a time; truncating after each one would only add fsyncs).
const CHECKPOINT_MIN_WAL_BYTES: u64 = 64 * 1024;

/// After a checkpoint failed or was blocked, the next try waits this long.
const CHECKPOINT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The same failure is logged at most once in this period.
const REPEATED_LOG_AFTER: Duration = Duration::from_secs(60);

/// A thread's log of failures: the same line at most once per
/// `REPEATED_LOG_AFTER`.
#[derive(Debug, Default)]
struct RepeatedLog {
    last: Option<(String, Instant)>,
}

impl RepeatedLog {
    fn line(&mut self, text: &str) {
        if let Some((last, at)) = &self.last
            && last == text
            && at.elapsed() < REPEATED_LOG_AFTER
        {
            return;
        }
        crate::log::line(text);
        self.last = Some((text.to_owned(), Instant::now()));
    }
}

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

/// Why the store could not be opened or used. Every refusal at open leaves
/// the files as they were.
#[derive(Debug)]
pub enum StoreError {
    /// The installed database is another schema (name, version or DDL
    /// digest): the back-up-and-move instruction.
    Incompatible,
    /// The database is ours but damaged.
    Damaged(Damage),
    /// `state.sqlite` is an empty file.
    Empty,
    /// `state.sqlite` is missing but its `-wal` holds frames: they belong to
    /// a database that was moved or deleted, and SQLite would apply them to
    /// a new one.
    WalWithoutDatabase,
    /// `state.sqlite` is not a usable SQLite file.
    Unusable(Unusable),
    /// The disk holding the database is full; about `needed_bytes` must be
    /// freed (an estimate, see `disk`).
    DiskFull { needed_bytes: u64 },
    /// SQLite failed.
    Sqlite(rusqlite::Error),
    /// The writer thread is gone (server shutting down).
    Closed,
}

/// What is wrong with a damaged database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// SQLite's quick check fails (or SQLite reports corruption).
    IntegrityCheck,
    /// Without a WAL, the file is shorter than its own page count.
    Truncated,
    /// The schema differs from the DDL its digest names (the phrase says how).
    SchemaChanged(String),
}

/// Why `state.sqlite` cannot be used at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// It is a directory or another non-file.
    NotAFile,
    /// It is a file, but not an SQLite database.
    NotADatabase,
    /// It cannot be read (permissions, an I/O error).
    Unreadable,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Incompatible => f.write_str(INCOMPATIBLE_STATE),
            Self::Damaged(damage) => {
                let detail = match damage {
                    Damage::IntegrityCheck => "fails SQLite's integrity check",
                    Damage::Truncated => "is shorter than its own pages (it was truncated)",
                    Damage::SchemaChanged(how) => how.as_str(),
                };
                write!(
                    f,
                    "Pi Workflows durable state is damaged: state.sqlite {detail}. It was not changed; keep it with its -wal and -shm files and restore a backup (starting with a new database would discard every run)"
                )
            }
            Self::Empty => f.write_str(
                "state.sqlite in PI_WORKFLOWS_HOME is an empty file, not a Pi Workflows database, and was not changed; restore it from a backup, or delete it so that Pi Workflows creates a new database",
            ),
            Self::WalWithoutDatabase => f.write_str(
                "state.sqlite in PI_WORKFLOWS_HOME is missing but its state.sqlite-wal is not: that file holds changes of a database that was moved or deleted, and a new database would take them for its own. Nothing was changed; move state.sqlite-wal and state.sqlite-shm to where state.sqlite went (or delete them if that database is gone for good), then start Pi Workflows again",
            ),
            Self::Unusable(Unusable::NotAFile) => f.write_str(
                "state.sqlite in PI_WORKFLOWS_HOME is not a file and was not changed; move it away so that Pi Workflows can create its database there",
            ),
            Self::Unusable(Unusable::NotADatabase) => f.write_str(
                "state.sqlite in PI_WORKFLOWS_HOME is not an SQLite database and was not changed; restore it from a backup, or move it away so that Pi Workflows creates a new database",
            ),
            Self::Unusable(Unusable::Unreadable) => f.write_str(
                "state.sqlite in PI_WORKFLOWS_HOME cannot be read and was not changed; check its permissions and the disk, then start Pi Workflows again",
            ),
            Self::DiskFull { needed_bytes } => write!(
                f,
                "the disk holding PI_WORKFLOWS_HOME is full: free at least {} MiB there",
                disk::mebibytes(*needed_bytes)
            ),
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

impl StoreError {
    /// The error code and one-line message a client gets for a command this
    /// error failed: nothing of the command was stored.
    pub fn refusal(&self) -> (protocol::ErrorCode, String) {
        match self {
            Self::DiskFull { needed_bytes } => (
                protocol::ErrorCode::Unavailable,
                format!(
                    "the disk holding PI_WORKFLOWS_HOME is full, so nothing was stored; free at least {} MiB there",
                    disk::mebibytes(*needed_bytes)
                ),
            ),
            _ => (
                protocol::ErrorCode::Internal,
                "the state database failed; retry the same request".into(),
            ),
        }
    }
}

/// SQLite messages can quote values; report only the error class.
fn safe_sqlite_message(error: &rusqlite::Error) -> String {
    match error {
        rusqlite::Error::SqliteFailure(code, _) => format!("{:?}", code.code),
        other => error_class(other),
    }
}

/// The variant of a non-SQLite error (its text before the first colon).
fn error_class(error: &rusqlite::Error) -> String {
    let text = error.to_string();
    text.split(':')
        .next()
        .unwrap_or("unknown")
        .chars()
        .take(80)
        .collect()
}

/// A log phrase for a failed statement: SQLite's code and message (which
/// name schema objects and constraints, never bound values), bounded.
fn log_phrase(error: &rusqlite::Error) -> String {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            let message: String = message.as_deref().unwrap_or("").chars().take(100).collect();
            format!("{code}: {message}")
        }
        other => error_class(other),
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

/// A job's closure: `Ok(true)` keeps its changes, `Ok(false)` discards them,
/// `Err` fails the job.
type WriteFn = Box<dyn FnOnce(&Connection) -> rusqlite::Result<bool> + Send>;
type ReplyFn = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

struct Job {
    run: WriteFn,
    reply: ReplyFn,
    /// Runs alone, outside any transaction (`Store::without_transaction`).
    alone: bool,
}

/// A committed presentation change, announced after its commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// The run and its new presentation revision.
    Revised(kernel::ids::RunId, u64),
    /// State retention deleted the run (with its whole tree).
    Deleted(kernel::ids::RunId),
}

impl Published {
    /// The run the change is about.
    pub fn run_id(&self) -> &kernel::ids::RunId {
        match self {
            Self::Revised(run_id, _) | Self::Deleted(run_id) => run_id,
        }
    }
}

/// A handle to the writer and reader threads. Cloning shares the same
/// threads.
#[derive(Clone, Debug)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
    reads: mpsc::Sender<reader::Read>,
    path: PathBuf,
    published: tokio::sync::broadcast::Sender<Published>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Store {
    /// Opens (or creates) the database at `path` and starts the writer and
    /// reader threads.
    pub fn open(path: &Path, faults: crate::fault::Faults) -> Result<Self, StoreError> {
        let connection = open::open(path)?;
        let reads = reader::start(open::reader(path)?)?;
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (published, _) = tokio::sync::broadcast::channel(4096);
        let writer = Writer::new(connection, path.to_path_buf(), faults, published.clone());
        thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || writer.run(&receiver))
            .map_err(|_| StoreError::Closed)?;
        Ok(Self {
            jobs,
            reads,
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
    /// value after the commit. Any SQL error of the job (or of the commit) is
    /// the result instead.
    pub async fn write<R, F>(&self, write: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<Commit<R>> + Send + 'static,
    {
        self.enqueue(false, write).await
    }

    /// Runs `work` on the writer connection outside any transaction, alone
    /// (no other job shares its turn): statements SQLite cannot run inside
    /// one, such as `VACUUM` and a WAL checkpoint. Its SQL error is its
    /// result; it commits nothing of its own.
    pub async fn without_transaction<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        self.enqueue(true, move |connection| {
            work(connection).map(Commit::Discard)
        })
        .await
    }

    async fn enqueue<R, F>(&self, alone: bool, write: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<Commit<R>> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel::<Result<R, StoreError>>();
        type Slot<R> = std::sync::Arc<std::sync::Mutex<Option<R>>>;
        let slot: Slot<R> = Default::default();
        let slot_for_run = slot.clone();
        let run: WriteFn = Box::new(move |connection| {
            let (keep, value) = match write(connection)? {
                Commit::Keep(value) => (true, value),
                Commit::Discard(value) => (false, value),
            };
            *slot_for_run.lock().expect("slot lock") = Some(value);
            Ok(keep)
        });
        let reply: ReplyFn = Box::new(move |outcome| {
            let value = slot.lock().expect("slot lock").take();
            let result = outcome.and_then(|()| value.ok_or(StoreError::Closed));
            let _ = sender.send(result);
        });
        self.jobs
            .send(Job { run, reply, alone })
            .map_err(|_| StoreError::Closed)?;
        receiver.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `read` on the reader thread in one snapshot of committed state
    /// (see `reader`): it does not wait for the writer, and it sees every
    /// write whose reply came before it was called. Any SQL error of the
    /// read is the result instead.
    pub async fn read<R, F>(&self, read: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel::<Result<R, StoreError>>();
        let job: reader::Read = Box::new(move |connection| {
            let result = reader::snapshot(connection, read);
            let phrase = result.as_ref().err().map(log_phrase);
            let _ = sender.send(result.map_err(StoreError::Sqlite));
            phrase
        });
        self.reads.send(job).map_err(|_| StoreError::Closed)?;
        receiver.await.map_err(|_| StoreError::Closed)?
    }
}

/// The writer thread's state.
struct Writer {
    connection: Connection,
    path: PathBuf,
    wal_path: PathBuf,
    faults: crate::fault::Faults,
    published: tokio::sync::broadcast::Sender<Published>,
    /// Whether the last write failed because the disk is full.
    disk_full: bool,
    checkpoints: Checkpoints,
    log: RepeatedLog,
    /// A job that must run alone, taken while a batch was gathered: it runs
    /// next.
    held: Option<Job>,
}

/// The WAL checkpoint schedule.
struct Checkpoints {
    /// A commit happened since the last complete checkpoint.
    written: bool,
    last_passive: Instant,
    /// No checkpoint before this instant (one failed or was blocked).
    not_before: Option<Instant>,
}

impl Writer {
    fn new(
        connection: Connection,
        path: PathBuf,
        faults: crate::fault::Faults,
        published: tokio::sync::broadcast::Sender<Published>,
    ) -> Self {
        let mut wal_path = path.clone().into_os_string();
        wal_path.push("-wal");
        Self {
            connection,
            path,
            wal_path: PathBuf::from(wal_path),
            faults,
            published,
            disk_full: false,
            checkpoints: Checkpoints {
                written: true,
                last_passive: Instant::now(),
                not_before: None,
            },
            log: RepeatedLog::default(),
            held: None,
        }
    }

    fn run(mut self, receiver: &mpsc::Receiver<Job>) {
        loop {
            let next = if let Some(job) = self.held.take() {
                Ok(job)
            } else if self.wants_idle_checkpoint() {
                receiver.recv_timeout(IDLE_CHECKPOINT_AFTER)
            } else {
                receiver
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
            };
            let first = match next {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.checkpoint(Checkpoint::Truncate);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            if first.alone {
                self.run_alone(first);
                continue;
            }
            let limit = if self.disk_full {
                1
            } else {
                MAX_JOBS_PER_COMMIT
            };
            let mut batch = vec![first];
            while batch.len() < limit {
                match receiver.try_recv() {
                    Ok(job) if job.alone => {
                        self.held = Some(job);
                        break;
                    }
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.run_jobs(batch);
            if self.checkpoints.written
                && self.checkpoints.last_passive.elapsed() >= PASSIVE_CHECKPOINT_EVERY
            {
                self.checkpoints.last_passive = Instant::now();
                self.checkpoint(Checkpoint::Passive);
            }
        }
    }

    /// Runs one batch, replies to every job, and publishes its changes.
    fn run_jobs(&mut self, mut batch: Vec<Job>) {
        let mut changes = Vec::new();
        let outcome = run_batch(&self.connection, &mut batch, &self.faults, &mut changes);
        self.faults.hit(crate::fault::FaultPoint::AfterCommit);
        for change in changes {
            let _ = self.published.send(change);
        }
        if outcome.committed_kept {
            self.checkpoints.written = true;
            // A small write can commit into WAL space SQLite already has
            // while the disk is still full: the episode ends only when the
            // disk has room again.
            if self.disk_full
                && disk::free_bytes(&self.path).is_none_or(|free| free >= disk::ROOM_AGAIN_BYTES)
            {
                self.disk_full = false;
                crate::log::line(
                    "disk space is available again: writes to the state database resume",
                );
            }
        }
        let first_full = outcome
            .failures
            .iter()
            .flatten()
            .find(|error| disk::is_full(error, &self.path));
        let needed_bytes = first_full.map(|_| disk::needed_bytes(&self.connection, &self.path));
        if let Some(needed_bytes) = needed_bytes
            && !self.disk_full
        {
            self.disk_full = true;
            crate::log::line(&format!(
                "disk full: writes to state.sqlite in PI_WORKFLOWS_HOME fail (about {} MiB more are needed); reads go on, and writes resume by themselves once space is free",
                disk::mebibytes(needed_bytes)
            ));
        }
        for (job, failure) in batch.into_iter().zip(outcome.failures) {
            let result = match failure {
                None => Ok(()),
                Some(error) if disk::is_full(&error, &self.path) => Err(StoreError::DiskFull {
                    needed_bytes: needed_bytes.unwrap_or(0),
                }),
                Some(error) => {
                    self.log.line(&format!(
                        "a state write failed ({}); its command was not stored",
                        log_phrase(&error)
                    ));
                    Err(StoreError::Sqlite(error))
                }
            };
            (job.reply)(result);
        }
    }

    /// Runs a job outside any transaction (`Store::without_transaction`).
    fn run_alone(&mut self, mut job: Job) {
        let run = std::mem::replace(&mut job.run, Box::new(|_| Ok(false)));
        let result = match run(&self.connection) {
            Ok(_) => Ok(()),
            Err(error) if disk::is_full(&error, &self.path) => Err(StoreError::DiskFull {
                needed_bytes: disk::needed_bytes(&self.connection, &self.path),
            }),
            Err(error) => Err(StoreError::Sqlite(error)),
        };
        // A checkpoint or `VACUUM` changed the WAL: the idle checkpoint
        // looks at it again.
        self.checkpoints.written = true;
        (job.reply)(result);
    }

    fn wal_bytes(&self) -> u64 {
        std::fs::metadata(&self.wal_path).map_or(0, |meta| meta.len())
    }

    fn wants_idle_checkpoint(&self) -> bool {
        self.checkpoints.written
            && self
                .checkpoints
                .not_before
                .is_none_or(|at| Instant::now() >= at)
    }

    /// Checkpoints the WAL if it holds at least `CHECKPOINT_MIN_WAL_BYTES`,
    /// without waiting for a reader.
    fn checkpoint(&mut self, mode: Checkpoint) {
        if self.wal_bytes() < CHECKPOINT_MIN_WAL_BYTES {
            if mode == Checkpoint::Truncate {
                self.checkpoints.written = false;
            }
            return;
        }
        let sql = match mode {
            Checkpoint::Truncate => "PRAGMA wal_checkpoint(TRUNCATE)",
            Checkpoint::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
        };
        let _ = self.connection.busy_timeout(Duration::ZERO);
        let done = self
            .connection
            .query_row(sql, [], |row| row.get::<_, i64>(0));
        let _ = self.connection.busy_timeout(Duration::from_secs(5));
        match done {
            // Complete: every frame is in the main file (and, for TRUNCATE,
            // the WAL is empty).
            Ok(0) => {
                self.checkpoints.not_before = None;
                if mode == Checkpoint::Truncate {
                    self.checkpoints.written = false;
                }
            }
            // A reader or writer kept it from completing: try again later.
            Ok(_) => self.checkpoints.not_before = Some(Instant::now() + CHECKPOINT_RETRY_AFTER),
            Err(error) => {
                self.checkpoints.not_before = Some(Instant::now() + CHECKPOINT_RETRY_AFTER);
                if !disk::is_full(&error, &self.path) {
                    self.log.line(&format!(
                        "a WAL checkpoint failed ({}); it is retried later",
                        log_phrase(&error)
                    ));
                }
            }
        }
    }
}

/// Which checkpoint the writer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checkpoint {
    /// Copies every frame it can without waiting (while busy).
    Passive,
    /// Copies every frame and empties the WAL file (when idle).
    Truncate,
}

fn clone_error(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        _ => rusqlite::Error::InvalidQuery,
    }
}

/// What happened to a batch.
#[derive(Debug)]
struct BatchOutcome {
    /// One entry per job: `None` when the job committed (or discarded, as it
    /// asked), the error that failed it otherwise.
    failures: Vec<Option<rusqlite::Error>>,
    /// Whether a kept job committed.
    committed_kept: bool,
}

/// Runs `batch` in one transaction (see the module invariants). The
/// presentation changes of committed jobs are appended to `changes`.
fn run_batch(
    connection: &Connection,
    batch: &mut [Job],
    faults: &crate::fault::Faults,
    changes: &mut Vec<Published>,
) -> BatchOutcome {
    let mut failures: Vec<Option<rusqlite::Error>> = batch.iter().map(|_| None).collect();
    // The kept jobs of the open transaction and their presentation changes.
    let mut kept: Vec<usize> = Vec::new();
    let mut pending: Vec<Published> = Vec::new();
    if let Err(error) = control(connection, "BEGIN IMMEDIATE") {
        for failure in &mut failures {
            *failure = Some(clone_error(&error));
        }
        return BatchOutcome {
            failures,
            committed_kept: false,
        };
    }
    for index in 0..batch.len() {
        if connection.is_autocommit() {
            // The transaction could not be begun again: this job cannot run.
            failures[index] = Some(aborted("the write transaction could not be begun"));
            continue;
        }
        let run = std::mem::replace(&mut batch[index].run, Box::new(|_| Ok(false)));
        // A job after a kept one gets a savepoint; the others need none: when
        // nothing kept precedes them, rolling the transaction back and
        // beginning a new one undoes exactly their changes (and spares every
        // single-job batch its savepoint journal).
        let savepoint = !kept.is_empty();
        let decided = (|| {
            if savepoint {
                control(connection, "SAVEPOINT job")?;
            }
            if !run(connection)? {
                return Ok(None);
            }
            // Every run the job changed gets its presentation revision and
            // patch inside the job's savepoint.
            viewer::flush(connection).map(Some)
        })();
        viewer::discard();
        let ended = match decided {
            Ok(Some(published)) => {
                let released = if savepoint {
                    control(connection, "RELEASE job")
                } else {
                    Ok(())
                };
                released.map(|()| {
                    kept.push(index);
                    pending.extend(published);
                })
            }
            Ok(None) => undo(connection, savepoint),
            Err(error) => {
                let undone = undo(connection, savepoint);
                failures[index] = Some(error);
                undone
            }
        };
        // The cause, when the transaction is gone: the job's own error if it
        // had one (a full disk), else what ended it.
        let cause = |ended: rusqlite::Error| failures[index].as_ref().map_or(ended, clone_error);
        let lost = match ended {
            Err(error) => Some(cause(error)),
            // SQLite rolled the whole transaction back on its own (its
            // error may even have been swallowed by the closure).
            Ok(()) if connection.is_autocommit() => {
                Some(cause(aborted("SQLite rolled the write transaction back")))
            }
            Ok(()) => None,
        };
        if let Some(error) = lost {
            // The kept jobs' changes are gone with the transaction.
            for job in kept.drain(..) {
                failures[job] = Some(clone_error(&error));
            }
            if failures[index].is_none() {
                failures[index] = Some(error);
            }
            pending.clear();
            if !connection.is_autocommit() {
                let _ = control(connection, "ROLLBACK");
            }
            let _ = control(connection, "BEGIN IMMEDIATE");
        }
    }
    faults.hit(crate::fault::FaultPoint::BeforeCommit);
    if connection.is_autocommit() {
        return BatchOutcome {
            failures,
            committed_kept: false,
        };
    }
    if let Err(error) = control(connection, "COMMIT") {
        if !connection.is_autocommit() {
            let _ = control(connection, "ROLLBACK");
        }
        for job in kept {
            failures[job] = Some(clone_error(&error));
        }
        return BatchOutcome {
            failures,
            committed_kept: false,
        };
    }
    changes.extend(pending);
    BatchOutcome {
        failures,
        committed_kept: !kept.is_empty(),
    }
}

/// An `SQLITE_ABORT` error saying why a job could not run or keep its changes.
fn aborted(why: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some(why.into()),
    )
}

/// Rolls back the current job: to its savepoint, or (nothing kept before
/// it) the whole transaction, which begins again.
fn undo(connection: &Connection, savepoint: bool) -> rusqlite::Result<()> {
    if savepoint {
        control(connection, "ROLLBACK TO job")?;
        control(connection, "RELEASE job")
    } else {
        if !connection.is_autocommit() {
            control(connection, "ROLLBACK")?;
        }
        control(connection, "BEGIN IMMEDIATE")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Replies = std::sync::Arc<std::sync::Mutex<Vec<bool>>>;

    fn job(path: &'static str, keep: bool, replies: Replies) -> Job {
        Job {
            run: Box::new(move |connection| {
                connection.execute_cached(
                    "INSERT INTO projects (project_id, canonical_path, created_at_ms) VALUES (?1, ?1, 0)",
                    [path],
                )?;
                Ok(keep)
            }),
            reply: Box::new(move |committed| replies.lock().expect("lock").push(committed.is_ok())),
            alone: false,
        }
    }

    fn paths(connection: &Connection) -> Vec<String> {
        let mut statement = connection
            .prepare("SELECT canonical_path FROM projects ORDER BY canonical_path")
            .expect("prepare");
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))
            .expect("query");
        rows.map(|row| row.expect("row")).collect()
    }

    fn database() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().expect("temp dir");
        let connection = open::open(&dir.path().join("state.sqlite")).expect("open");
        (dir, connection)
    }

    /// A discarded job leaves nothing behind and the kept ones around it all
    /// commit, whether it is the batch's first job (no savepoint: the
    /// transaction is rolled back and begun again) or a later one.
    #[test]
    fn discarded_jobs_roll_back_only_their_own_changes() {
        let (_dir, connection) = database();
        let replies = Replies::default();
        let mut batch = vec![
            job("/a", false, replies.clone()),
            job("/b", true, replies.clone()),
            job("/c", false, replies.clone()),
            job("/d", true, replies.clone()),
        ];
        let mut changes = Vec::new();
        let outcome = run_batch(&connection, &mut batch, &Default::default(), &mut changes);
        assert!(outcome.failures.iter().all(Option::is_none));
        assert!(outcome.committed_kept);
        assert_eq!(paths(&connection), ["/b", "/d"]);
        assert!(connection.is_autocommit(), "the batch's transaction ended");
        // A batch whose only job is discarded commits nothing.
        let mut batch = vec![job("/e", false, replies.clone())];
        let outcome = run_batch(&connection, &mut batch, &Default::default(), &mut changes);
        assert!(!outcome.committed_kept);
        assert_eq!(paths(&connection).len(), 2);
        assert!(connection.is_autocommit());
    }

    /// A read runs beside a write transaction that has not committed: it
    /// returns without waiting for the writer and sees only committed state.
    /// And a read submitted after a write's reply sees that write, every
    /// time, also while other writes commit around it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_does_not_wait_for_the_writer_and_sees_every_replied_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store =
            Store::open(&dir.path().join("state.sqlite"), Default::default()).expect("open");
        let insert = |connection: &Connection, path: &str| {
            connection.execute_cached(
                "INSERT INTO projects (project_id, canonical_path, created_at_ms) VALUES (?1, ?1, 0)",
                [path],
            )
        };
        // The writer thread waits inside its transaction until `release`.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (entered, inside) = oneshot::channel::<()>();
        let held = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(move |connection| {
                        insert(connection, "/held")?;
                        let _ = entered.send(());
                        let _ = released.recv();
                        Ok(Commit::Keep(()))
                    })
                    .await
            }
        });
        inside.await.expect("the write began");
        let read = tokio::time::timeout(Duration::from_secs(5), store.read(|c| Ok(paths(c))))
            .await
            .expect("the read waited for the writer's transaction")
            .expect("the read");
        assert!(read.is_empty(), "an uncommitted write was seen: {read:?}");
        release.send(()).expect("release the writer");
        held.await.expect("join").expect("the held write commits");
        assert_eq!(store.read(|c| Ok(paths(c))).await.expect("read"), ["/held"]);

        // Writes committing all the time beside replied writes and their reads.
        let background = tokio::spawn({
            let store = store.clone();
            async move {
                for n in 0..200 {
                    let path = format!("/background/{n:03}");
                    store
                        .write(move |connection| {
                            insert(connection, &path)?;
                            Ok(Commit::Keep(()))
                        })
                        .await
                        .expect("a background write");
                }
            }
        });
        for n in 0..200 {
            let path = format!("/replied/{n:03}");
            let written = path.clone();
            store
                .write(move |connection| {
                    insert(connection, &written)?;
                    Ok(Commit::Keep(()))
                })
                .await
                .expect("a write");
            let seen = store.read(|c| Ok(paths(c))).await.expect("a read");
            assert!(seen.contains(&path), "{path} was replied but not seen");
        }
        background.await.expect("background writes");
    }

    /// A job whose statement fails is failed (never acknowledged) and leaves
    /// nothing; the jobs around it commit.
    #[test]
    fn a_job_whose_sql_fails_is_failed_and_the_others_commit() {
        let (_dir, connection) = database();
        let replies = Replies::default();
        let failing = Job {
            run: Box::new(|connection| {
                connection.execute_cached(
                    "INSERT INTO projects (project_id, canonical_path, created_at_ms) VALUES ('/x', '/x', 0)",
                    [],
                )?;
                connection.execute_cached("INSERT INTO no_such_table VALUES (1)", [])?;
                Ok(true)
            }),
            reply: Box::new(|_| {}),
            alone: false,
        };
        let mut batch = vec![
            job("/a", true, replies.clone()),
            failing,
            job("/b", true, replies.clone()),
        ];
        let outcome = run_batch(
            &connection,
            &mut batch,
            &Default::default(),
            &mut Vec::new(),
        );
        assert!(outcome.failures[0].is_none());
        assert!(outcome.failures[1].is_some(), "the failing job is failed");
        assert!(outcome.failures[2].is_none());
        assert_eq!(paths(&connection), ["/a", "/b"]);
    }
}
