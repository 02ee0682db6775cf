//! The state directory: `PI_WORKFLOWS_HOME` with `state.sqlite` and the
//! user-only `host/` directory (socket, lock, `server.log`, runner logs in
//! `logs/`, see `runner_logs`).
//!
//! Invariants:
//! - `host/` and `host/logs/` are mode 0700; the socket is 0600; logs are 0600.
//! - One global lock file guards the server: only the process holding its
//!   exclusive lock may open the database for writing, bind the socket or
//!   take the server epoch. The operating system releases the lock when its
//!   holder exits, however it exits, so holding it proves that every earlier
//!   server process is gone (`kernel::epoch::ServerLockHeld`). The lock file
//!   is never removed.
//! - A start refuses at once only while a server answers on the socket. A
//!   lock that no answering server holds is waited for, up to
//!   [`LOCK_HANDOFF_WAIT`]: a SIGKILLed server's child caught between fork
//!   and exec still shares the lock's open file description for a moment,
//!   and a restart right after the crash must not be refused for it.

use crate::config::Config;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a start waits for a lock that no answering server holds.
pub const LOCK_HANDOFF_WAIT: Duration = Duration::from_secs(2);

/// Creates the state directories with private permissions.
pub fn prepare(config: &Config) -> io::Result<()> {
    create_private_dir(&config.home)?;
    create_private_dir(&config.host_dir())?;
    create_private_dir(&config.log_dir())?;
    Ok(())
}

fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
}

/// The held global server lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct ServerLock {
    _file: File,
}

/// Why the lock could not be taken.
#[derive(Debug)]
pub enum LockError {
    /// Another live server holds it.
    Held,
    Io(io::Error),
}

/// Takes the exclusive server lock: at once, or (no server answering on the
/// socket) within [`LOCK_HANDOFF_WAIT`]. Blocks the calling thread while it
/// waits (the server has nothing else to do before it holds the lock).
pub fn lock(config: &Config) -> Result<ServerLock, LockError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(config.lock_path())
        .map_err(LockError::Io)?;
    let deadline = Instant::now() + LOCK_HANDOFF_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(ServerLock { _file: file }),
            Err(fs::TryLockError::WouldBlock)
                if Instant::now() < deadline && !server_answers(config) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(fs::TryLockError::WouldBlock) => return Err(LockError::Held),
            Err(fs::TryLockError::Error(error)) => return Err(LockError::Io(error)),
        }
    }
}

/// Whether a server accepts connections on the socket.
fn server_answers(config: &Config) -> bool {
    std::os::unix::net::UnixStream::connect(config.socket_path()).is_ok()
}

/// Opens a user-only append log file (`host/server.log`).
pub fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(home: &Path) -> Config {
        let home = home.to_string_lossy().into_owned();
        Config::from_lookup(|name| (name == "PI_WORKFLOWS_HOME").then(|| home.clone())).unwrap()
    }

    #[test]
    fn directories_are_private_and_the_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(&dir.path().join("state"));
        prepare(&config).unwrap();
        let mode = fs::metadata(config.host_dir())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
        let held = lock(&config).unwrap();
        assert!(matches!(lock(&config), Err(LockError::Held)));
        drop(held);
        assert!(lock(&config).is_ok());
    }
}
