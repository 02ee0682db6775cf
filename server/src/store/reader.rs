//! The reader: every `Store::read` runs on a thread of its own, on a
//! read-only connection of its own, so a view delivery, a page or
//! `server.status` never queues behind the writer's commits.
//!
//! Invariants:
//! - One snapshot per read: a read's closure runs inside one read
//!   transaction, so all of its statements see the same committed state.
//! - A read sees every write whose reply came before the read was asked
//!   for: the writer replies only after `COMMIT` returned, and a read's
//!   transaction begins after it was asked for (in WAL mode a transaction
//!   sees every commit that finished before it began). It never sees a
//!   write that has not committed.
//! - A read never waits for a commit: in WAL mode a reader takes no lock the
//!   writer holds, and this thread is not the writer's.
//! - The connection is opened read-only: a read cannot change the database
//!   (a statement that tries fails the read).
//! - A failed read is an error to its caller, never a default value; the
//!   reader logs one bounded line without values (the same line at most once
//!   a minute).
//! - A read holds its snapshot only while its closure runs, so it delays a
//!   WAL checkpoint by at most one read (the writer retries a checkpoint a
//!   reader kept from completing).

use super::{RepeatedLog, StoreError, control};
use rusqlite::Connection;
use std::sync::mpsc;
use std::thread;

/// A read as the reader thread runs it: the closure answers its caller and
/// returns the log phrase of the error that failed it, if one did.
pub(super) type Read = Box<dyn FnOnce(&Connection) -> Option<String> + Send>;

/// Starts the reader thread on `connection` (read-only); reads sent to the
/// returned channel run in order, one snapshot each.
pub(super) fn start(connection: Connection) -> Result<mpsc::Sender<Read>, StoreError> {
    let (reads, receiver) = mpsc::channel::<Read>();
    thread::Builder::new()
        .name("state-reader".into())
        .spawn(move || {
            let mut log = RepeatedLog::default();
            for read in receiver {
                if let Some(phrase) = read(&connection) {
                    log.line(&format!(
                        "a state read failed ({phrase}); its request got an error"
                    ));
                }
            }
        })
        .map_err(|_| StoreError::Closed)?;
    Ok(reads)
}

/// Runs `read` inside one read transaction (one snapshot).
pub(super) fn snapshot<R>(
    connection: &Connection,
    read: impl FnOnce(&Connection) -> rusqlite::Result<R>,
) -> rusqlite::Result<R> {
    control(connection, "BEGIN")?;
    let value = read(connection);
    // A read transaction has nothing to keep: ending it only releases the
    // snapshot (and must, or the next read could not begin its own).
    let ended = if connection.is_autocommit() {
        Ok(())
    } else {
        control(connection, "COMMIT").inspect_err(|_| {
            let _ = control(connection, "ROLLBACK");
        })
    };
    let value = value?;
    ended.map(|()| value)
}
