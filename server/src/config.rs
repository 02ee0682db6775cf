//! Server configuration from the environment, validated once at startup.
//!
//! Every value has a documented default; anything malformed is a one-line
//! startup error that names the variable and what it accepts.

use std::path::PathBuf;
use std::time::Duration;

/// Where state lives and how the server behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// `PI_WORKFLOWS_HOME` (default `~/.pi/agent/workflows`).
    pub home: PathBuf,
    /// `PI_WORKFLOWS_MAX_WORKERS` (default 4): execution workers including pending launches.
    pub max_workers: u32,
    /// `PI_WORKFLOWS_CLAIM_TTL_MS` (default 30000): run claim lifetime.
    pub claim_ttl_ms: u64,
    /// `PI_WORKFLOWS_SERVER_LEASE_MS` (default 15000): server epoch lease lifetime.
    pub server_lease_ms: u64,
    /// `PI_WORKFLOWS_RECONCILE_TIMEOUT_MS` (default
    /// `kernel::reconcile::defaults::RECONCILE_TIMEOUT_MS`): a reconcile
    /// pass's deadline (its launch's `timeoutMs`; the server kills the
    /// child's group a grace after it).
    pub reconcile_timeout_ms: u64,
    /// `PI_WORKFLOWS_IDLE_EXIT_MS` (default 300000): exit after this long with nothing to do.
    pub idle_exit_ms: u64,
    /// `PI_WORKFLOWS_READY_TIMEOUT_MS` (default 30000): runner startup handshake deadline.
    pub runner_ready_timeout_ms: u64,
    /// `PI_WORKFLOWS_STOP_GRACE_MS` (default 5000): SIGTERM to SIGKILL escalation.
    pub stop_grace_ms: u64,
    /// `PI_WORKFLOWS_RUNNER` (default: the TypeScript runner): the runner program and arguments.
    pub runner_command: Vec<String>,
    /// `PI_WORKFLOWS_CONTROLLER_RUNNER` (default: the TypeScript controller
    /// child, `pi-workflows-controller`): the controller child program and
    /// arguments (resolve and reconcile passes).
    pub controller_command: Vec<String>,
    /// The user's home directory (`HOME`), for `~/.pi/agent/workflows/` discovery.
    pub user_home: Option<PathBuf>,
    /// Limits of the client socket's connections.
    pub connections: ConnectionLimits,
    /// `PI_WORKFLOWS_CHANNEL_ADAPTER` (default: `pi-workflows-telegram-adapter`
    /// beside this binary): the Telegram channel adapter program.
    pub channel_adapter: PathBuf,
    /// `PI_WORKFLOWS_CHANNEL_POLL_MS` (default 500): how often a running
    /// adapter's supervisor looks for decisions to present.
    pub channel_poll_ms: u64,
}

/// How the server bounds what one client can hold (docs/PROTOCOL.md,
/// "Connection limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `PI_WORKFLOWS_MAX_CONNECTIONS` (default 256): connections served at
    /// once; one more gets a refusal frame and is closed.
    pub max_connections: usize,
    /// `PI_WORKFLOWS_FRAME_TIMEOUT_MS` (default 30000): a started frame, and
    /// a new connection's hello, must be complete within this.
    pub frame_timeout_ms: u64,
    /// `PI_WORKFLOWS_CONNECTION_IDLE_MS` (default 300000): a connection with
    /// no subscription and no request in flight is closed after this long
    /// without a byte read or written.
    pub idle_ms: u64,
    /// `PI_WORKFLOWS_STALLED_CLIENT_MS` (default 30000): a connection whose
    /// requests are at their bound (or that is closing) is closed when none
    /// of its replies could be written for this long.
    pub stalled_client_ms: u64,
}

/// A configuration error: one line naming the variable and the fix.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Config {
    /// Reads the configuration from `lookup` (the process environment in production).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let home = match lookup("PI_WORKFLOWS_HOME") {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => {
                let home = lookup("HOME").filter(|h| !h.is_empty()).ok_or_else(|| {
                    ConfigError(
                        "HOME is not set; set PI_WORKFLOWS_HOME to a private directory".into(),
                    )
                })?;
                PathBuf::from(home)
                    .join(".pi")
                    .join("agent")
                    .join("workflows")
            }
        };
        let max_workers = positive(&lookup, "PI_WORKFLOWS_MAX_WORKERS", 4)?;
        let runner_command = match lookup("PI_WORKFLOWS_RUNNER") {
            Some(text) if !text.trim().is_empty() => {
                text.split_whitespace().map(str::to_owned).collect()
            }
            _ => default_runner_command(),
        };
        let controller_command = match lookup("PI_WORKFLOWS_CONTROLLER_RUNNER") {
            Some(text) if !text.trim().is_empty() => {
                text.split_whitespace().map(str::to_owned).collect()
            }
            _ => default_controller_command(),
        };
        let channel_adapter = match lookup("PI_WORKFLOWS_CHANNEL_ADAPTER") {
            Some(path) if !path.trim().is_empty() => PathBuf::from(path),
            _ => default_channel_adapter(),
        };
        Ok(Self {
            channel_adapter,
            channel_poll_ms: positive(&lookup, "PI_WORKFLOWS_CHANNEL_POLL_MS", 500)?,
            home,
            max_workers: u32::try_from(max_workers)
                .map_err(|_| ConfigError("PI_WORKFLOWS_MAX_WORKERS is too large".into()))?,
            claim_ttl_ms: positive(
                &lookup,
                "PI_WORKFLOWS_CLAIM_TTL_MS",
                kernel::claim::CLAIM_TTL_MS,
            )?,
            server_lease_ms: positive(
                &lookup,
                "PI_WORKFLOWS_SERVER_LEASE_MS",
                kernel::epoch::SERVER_LEASE_TTL_MS,
            )?,
            reconcile_timeout_ms: positive(
                &lookup,
                "PI_WORKFLOWS_RECONCILE_TIMEOUT_MS",
                kernel::reconcile::defaults::RECONCILE_TIMEOUT_MS,
            )?,
            idle_exit_ms: positive(&lookup, "PI_WORKFLOWS_IDLE_EXIT_MS", 300_000)?,
            runner_ready_timeout_ms: positive(&lookup, "PI_WORKFLOWS_READY_TIMEOUT_MS", 30_000)?,
            stop_grace_ms: positive(&lookup, "PI_WORKFLOWS_STOP_GRACE_MS", 5_000)?,
            runner_command,
            controller_command,
            user_home: lookup("HOME")
                .filter(|home| !home.is_empty())
                .map(PathBuf::from),
            connections: ConnectionLimits {
                max_connections: usize::try_from(positive(
                    &lookup,
                    "PI_WORKFLOWS_MAX_CONNECTIONS",
                    256,
                )?)
                .map_err(|_| ConfigError("PI_WORKFLOWS_MAX_CONNECTIONS is too large".into()))?,
                frame_timeout_ms: positive(&lookup, "PI_WORKFLOWS_FRAME_TIMEOUT_MS", 30_000)?,
                idle_ms: positive(&lookup, "PI_WORKFLOWS_CONNECTION_IDLE_MS", 300_000)?,
                stalled_client_ms: positive(&lookup, "PI_WORKFLOWS_STALLED_CLIENT_MS", 30_000)?,
            },
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// `state.sqlite` under the home directory.
    pub fn database_path(&self) -> PathBuf {
        self.home.join("state.sqlite")
    }

    /// The user-only `host/` directory: socket, lock and runner logs.
    pub fn host_dir(&self) -> PathBuf {
        self.home.join("host")
    }

    /// The client socket.
    pub fn socket_path(&self) -> PathBuf {
        self.host_dir().join("server.sock")
    }

    /// The global server lock.
    pub fn lock_path(&self) -> PathBuf {
        self.host_dir().join("server.lock")
    }

    /// The user-only channel configuration: `channels/channels.json`
    /// (docs/CHANNELS.md).
    pub fn channels_dir(&self) -> PathBuf {
        self.home.join("channels")
    }

    /// Runner stdout/stderr logs.
    pub fn log_dir(&self) -> PathBuf {
        self.host_dir().join("logs")
    }

    /// Claim renewal period: a third of the claim lifetime.
    pub fn claim_renew_interval(&self) -> Duration {
        Duration::from_millis((self.claim_ttl_ms / 3).max(1))
    }

    /// Server lease renewal period: a fifth of the lease lifetime.
    pub fn server_lease_renew_interval(&self) -> Duration {
        Duration::from_millis((self.server_lease_ms / 5).max(1))
    }
}

fn positive(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u64,
) -> Result<u64, ConfigError> {
    match lookup(name) {
        None => Ok(default),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(value) if value > 0 => Ok(value),
            _ => Err(ConfigError(format!(
                "{name} must be a positive integer (got {:?})",
                truncate(&text)
            ))),
        },
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(32).collect()
}

/// The adapter binary installed beside this one.
fn default_channel_adapter() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.parent()
                .map(|dir| dir.join("pi-workflows-telegram-adapter"))
        })
        .unwrap_or_else(|| PathBuf::from("pi-workflows-telegram-adapter"))
}

/// The TypeScript runner shipped by the SDK: `node <sdk>/dist/runner/bin.js`
/// next to the installed binary when it exists, otherwise `pi-workflows-runner` on `PATH`.
fn default_runner_command() -> Vec<String> {
    vec!["pi-workflows-runner".to_owned()]
}

fn default_controller_command() -> Vec<String> {
    vec!["pi-workflows-controller".to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_follow_the_documentation() {
        let config = config(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(config.home, PathBuf::from("/home/u/.pi/agent/workflows"));
        assert_eq!(config.max_workers, 4);
        assert_eq!(config.claim_ttl_ms, 30_000);
        assert_eq!(
            config.connections,
            ConnectionLimits {
                max_connections: 256,
                frame_timeout_ms: 30_000,
                idle_ms: 300_000,
                stalled_client_ms: 30_000,
            }
        );
        assert_eq!(
            config.socket_path(),
            PathBuf::from("/home/u/.pi/agent/workflows/host/server.sock")
        );
    }

    #[test]
    fn max_workers_must_be_a_positive_integer() {
        for bad in ["0", "-1", "four", "1.5", ""] {
            let error = config(&[("HOME", "/h"), ("PI_WORKFLOWS_MAX_WORKERS", bad)]).unwrap_err();
            assert!(
                error
                    .0
                    .starts_with("PI_WORKFLOWS_MAX_WORKERS must be a positive integer"),
                "{error}"
            );
        }
        assert_eq!(
            config(&[("HOME", "/h"), ("PI_WORKFLOWS_MAX_WORKERS", "12")])
                .unwrap()
                .max_workers,
            12
        );
    }

    #[test]
    fn connection_limits_must_be_positive_integers() {
        for name in [
            "PI_WORKFLOWS_MAX_CONNECTIONS",
            "PI_WORKFLOWS_FRAME_TIMEOUT_MS",
            "PI_WORKFLOWS_CONNECTION_IDLE_MS",
            "PI_WORKFLOWS_STALLED_CLIENT_MS",
        ] {
            let error = config(&[("HOME", "/h"), (name, "0")]).unwrap_err();
            assert!(
                error
                    .0
                    .starts_with(&format!("{name} must be a positive integer")),
                "{error}"
            );
        }
        let config = config(&[("HOME", "/h"), ("PI_WORKFLOWS_MAX_CONNECTIONS", "3")]).unwrap();
        assert_eq!(config.connections.max_connections, 3);
    }

    #[test]
    fn home_override_wins() {
        let config = config(&[("HOME", "/h"), ("PI_WORKFLOWS_HOME", "/tmp/x")]).unwrap();
        assert_eq!(config.database_path(), PathBuf::from("/tmp/x/state.sqlite"));
    }

    #[test]
    fn the_controller_runner_is_split_on_whitespace_with_a_default() {
        let default = config(&[("HOME", "/h")]).unwrap();
        assert_eq!(default.controller_command, ["pi-workflows-controller"]);
        let set = config(&[
            ("HOME", "/h"),
            ("PI_WORKFLOWS_CONTROLLER_RUNNER", " node  /x/bin.js "),
        ])
        .unwrap();
        assert_eq!(set.controller_command, ["node", "/x/bin.js"]);
    }
}
