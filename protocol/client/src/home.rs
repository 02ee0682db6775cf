//! Where a client finds the server: the state directory
//! (`PI_WORKFLOWS_HOME`, default `~/.pi/agent/workflows`), its user-only
//! `host/` directory, the socket `host/server.sock`, the lock
//! `host/server.lock` and the log `host/server.log`. The CLI, `piw` and the
//! tests take these paths from here and nowhere else.
//!
//! Invariants:
//! - The rule is the server's (`docs/PROTOCOL.md`, `docs/CLIENT.md`): an
//!   empty `PI_WORKFLOWS_HOME` counts as unset; without it and without
//!   `HOME` there is no default, and the error says which variable to set.
//! - Directories a client creates (before starting a server) are mode 0700.
//! - A client never opens `state.sqlite`; it may test the server lock to
//!   learn that no server process is left (the lock is released by the
//!   operating system when its holder exits).

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The state directory of one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

/// A client setting that cannot be used: one line naming the variable and
/// the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError(pub String);

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingError {}

impl Home {
    /// The state directory at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The state directory named by `lookup` (the process environment in
    /// production): `PI_WORKFLOWS_HOME`, else `$HOME/.pi/agent/workflows`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        if let Some(path) = lookup("PI_WORKFLOWS_HOME").filter(|path| !path.is_empty()) {
            return Ok(Self::at(path));
        }
        let home = lookup("HOME")
            .filter(|home| !home.is_empty())
            .ok_or_else(|| {
                SettingError("HOME is not set; set PI_WORKFLOWS_HOME to a private directory".into())
            })?;
        Ok(Self::at(
            PathBuf::from(home)
                .join(".pi")
                .join("agent")
                .join("workflows"),
        ))
    }

    /// [`Home::from_lookup`] over the process environment.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The state directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The user-only `host/` directory.
    pub fn host_dir(&self) -> PathBuf {
        self.root.join("host")
    }

    /// The client socket.
    pub fn socket_path(&self) -> PathBuf {
        self.host_dir().join("server.sock")
    }

    /// The global server lock.
    pub fn lock_path(&self) -> PathBuf {
        self.host_dir().join("server.lock")
    }

    /// The server's stderr log (written by a server a client started).
    pub fn server_log_path(&self) -> PathBuf {
        self.host_dir().join("server.log")
    }

    /// Creates the state directory, `host/` and `host/logs/` with mode 0700
    /// (what a server started by a client expects to find or create).
    pub fn prepare(&self) -> io::Result<()> {
        for dir in [
            self.root.clone(),
            self.host_dir(),
            self.host_dir().join("logs"),
        ] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }

    /// Whether no server process holds the lock: true once every server of
    /// this directory has exited, however it exited.
    pub fn server_lock_is_free(&self) -> bool {
        let Ok(file) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(self.lock_path())
        else {
            return false;
        };
        // Dropping the file releases the lock again at once.
        file.try_lock().is_ok()
    }
}

/// `PI_WORKFLOWS_CLI_TIMEOUT_MS` (default 60 000): how long the CLI waits
/// for each answer of the server (the hello, every response).
pub const CLI_TIMEOUT_VARIABLE: &str = "PI_WORKFLOWS_CLI_TIMEOUT_MS";

/// The default of [`CLI_TIMEOUT_VARIABLE`].
pub const DEFAULT_CLI_TIMEOUT: Duration = Duration::from_millis(60_000);

/// A positive number of milliseconds from `name` in `lookup`, or `default`
/// when it is unset; anything else is an error that names the variable.
pub fn positive_millis(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: Duration,
) -> Result<Duration, SettingError> {
    match lookup(name) {
        None => Ok(default),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(value) if value > 0 => Ok(Duration::from_millis(value)),
            _ => Err(SettingError(format!(
                "{name} must be a positive integer (got {:?})",
                text.chars().take(32).collect::<String>()
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    #[test]
    fn the_home_is_pi_workflows_home_or_under_home() {
        let home = Home::from_lookup(lookup(&[("HOME", "/home/u")])).unwrap();
        assert_eq!(
            home.socket_path(),
            PathBuf::from("/home/u/.pi/agent/workflows/host/server.sock")
        );
        let home =
            Home::from_lookup(lookup(&[("HOME", "/h"), ("PI_WORKFLOWS_HOME", "/tmp/x")])).unwrap();
        assert_eq!(home.socket_path(), PathBuf::from("/tmp/x/host/server.sock"));
        assert_eq!(home.lock_path(), PathBuf::from("/tmp/x/host/server.lock"));
        let empty =
            Home::from_lookup(lookup(&[("HOME", "/h"), ("PI_WORKFLOWS_HOME", "")])).unwrap();
        assert_eq!(empty.root(), Path::new("/h/.pi/agent/workflows"));
        let error = Home::from_lookup(lookup(&[])).unwrap_err();
        assert!(error.0.contains("set PI_WORKFLOWS_HOME"), "{error}");
    }

    #[test]
    fn a_timeout_must_be_a_positive_integer() {
        let default = DEFAULT_CLI_TIMEOUT;
        assert_eq!(
            positive_millis(&lookup(&[]), CLI_TIMEOUT_VARIABLE, default),
            Ok(default)
        );
        assert_eq!(
            positive_millis(
                &lookup(&[(CLI_TIMEOUT_VARIABLE, "1500")]),
                CLI_TIMEOUT_VARIABLE,
                default
            ),
            Ok(Duration::from_millis(1500))
        );
        for bad in [
            &[(CLI_TIMEOUT_VARIABLE, "0")][..],
            &[(CLI_TIMEOUT_VARIABLE, "-1")],
            &[(CLI_TIMEOUT_VARIABLE, "soon")],
        ] {
            let vars: &'static [(&str, &str)] = Box::leak(bad.to_vec().into_boxed_slice());
            let error = positive_millis(&lookup(vars), CLI_TIMEOUT_VARIABLE, default).unwrap_err();
            assert!(
                error
                    .0
                    .starts_with("PI_WORKFLOWS_CLI_TIMEOUT_MS must be a positive integer"),
                "{error}"
            );
        }
    }

    #[test]
    fn prepared_directories_are_private_and_the_lock_shows_a_live_holder() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("state"));
        home.prepare().unwrap();
        let mode = fs::metadata(home.host_dir()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(home.server_lock_is_free());
        let held = OpenOptions::new()
            .read(true)
            .write(true)
            .open(home.lock_path())
            .unwrap();
        held.lock().unwrap();
        assert!(!home.server_lock_is_free());
        drop(held);
        assert!(home.server_lock_is_free());
    }
}
