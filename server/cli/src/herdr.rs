//! `pi-workflows herdr sync [--json]` (alias `setup`): links the Herdr
//! plugin whose pane runs `piw --herdr-pane` (the manifest,
//! `server/cli/herdr-plugin.toml`, is compiled in and written to
//! `$PI_WORKFLOWS_HOME/herdr-plugin/`), so that `/piw` and Ctrl+Shift+R in
//! Pi can open piw inside Herdr.
//!
//! Invariants:
//! - The outcome is decided from what `herdr plugin list` reports, before
//!   and after: not linked → link; linked here but disabled → enable;
//!   linked elsewhere or another version → unlink and link; already linked
//!   here and enabled → nothing changes. A change is reported only after
//!   Herdr lists the plugin as linked here and enabled.
//! - Every herdr command is bounded by [`COMMAND_LIMIT`]; no output names
//!   a path.

use super::{Exit, Failure};
use serde_json::{Value, json};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The plugin id (the extension's `HERDR_PLUGIN_ID`).
pub(crate) const PLUGIN_ID: &str = "osolmaz.pi-workflows";
/// The manifest, as written into the plugin directory.
pub(crate) const MANIFEST: &str = include_str!("../herdr-plugin.toml");
const MANIFEST_NAME: &str = "herdr-plugin.toml";
const SCHEMA: &str = "pi-workflows.herdr-sync.v1";
/// The longest one herdr command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(10);
/// The most output read from one herdr command.
const MAX_OUTPUT: u64 = 1024 * 1024;

/// What the sync did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Synced {
    Linked,
    Enabled,
    Relinked,
    Unchanged,
}

impl Synced {
    fn name(self) -> &'static str {
        match self {
            Self::Linked => "linked",
            Self::Enabled => "enabled",
            Self::Relinked => "relinked",
            Self::Unchanged => "unchanged",
        }
    }

    fn line(self) -> String {
        let what = match self {
            Self::Linked => format!("Linked the Herdr plugin {PLUGIN_ID}"),
            Self::Enabled => format!("Enabled the Herdr plugin {PLUGIN_ID}"),
            Self::Relinked => format!(
                "Relinked the Herdr plugin {PLUGIN_ID} (it was linked elsewhere or at another version)"
            ),
            Self::Unchanged => {
                format!("The Herdr plugin {PLUGIN_ID} is already linked and enabled")
            }
        };
        format!("{what}; /piw and Ctrl+Shift+R in Pi open piw in a Herdr pane")
    }
}

/// `herdr sync`: prints the outcome (a line, or one JSON document).
pub(crate) fn main(home_root: &Path, json: bool) -> Result<Exit, Failure> {
    let outcome = sync(home_root, Path::new("herdr"));
    match (outcome, json) {
        (Ok(synced), false) => println!("{}", synced.line()),
        (Ok(synced), true) => println!(
            "{}",
            json!({"schema": SCHEMA, "status": synced.name(), "changed": synced != Synced::Unchanged, "pluginId": PLUGIN_ID, "version": env!("CARGO_PKG_VERSION")})
        ),
        (Err(failure), true) if failure.exit == Exit::Unavailable => {
            println!(
                "{}",
                json!({"schema": SCHEMA, "status": "unavailable", "changed": false, "pluginId": PLUGIN_ID, "version": env!("CARGO_PKG_VERSION")})
            );
            return Err(failure);
        }
        (Err(failure), _) => return Err(failure),
    }
    Ok(Exit::Ok)
}

/// Writes the manifest under `home_root` and links it with `herdr` (the
/// program to run; `herdr` from PATH in production).
pub(crate) fn sync(home_root: &Path, herdr: &Path) -> Result<Synced, Failure> {
    let dir = write_manifest(home_root)?;
    let version = env!("CARGO_PKG_VERSION");
    let before = listed(herdr)?;
    let synced = match &before {
        None => {
            run(herdr, &["plugin", "link", path_arg(&dir)?])?;
            Synced::Linked
        }
        Some(plugin) if plugin.root == dir && plugin.version == version && plugin.enabled => {
            return Ok(Synced::Unchanged);
        }
        Some(plugin) if plugin.root == dir && plugin.version == version => {
            run(herdr, &["plugin", "enable", PLUGIN_ID])?;
            Synced::Enabled
        }
        Some(_) => {
            run(herdr, &["plugin", "unlink", PLUGIN_ID])?;
            run(herdr, &["plugin", "link", path_arg(&dir)?])?;
            Synced::Relinked
        }
    };
    match listed(herdr)? {
        Some(plugin) if plugin.root == dir && plugin.version == version && plugin.enabled => {
            Ok(synced)
        }
        _ => Err(Failure::new(
            Exit::Refused,
            format!(
                "Herdr does not list the plugin {PLUGIN_ID} as linked and enabled after `herdr plugin link`; see `herdr plugin list`, then run `pi-workflows herdr sync` again"
            ),
        )),
    }
}

/// `$home/herdr-plugin/herdr-plugin.toml` with [`MANIFEST`]; the directory,
/// canonical.
fn write_manifest(home_root: &Path) -> Result<PathBuf, Failure> {
    let cannot = |_| {
        Failure::new(
            Exit::Usage,
            "cannot write the Herdr plugin manifest into PI_WORKFLOWS_HOME; check that it is writable",
        )
    };
    let dir = home_root.join("herdr-plugin");
    std::fs::create_dir_all(&dir).map_err(cannot)?;
    let manifest = dir.join(MANIFEST_NAME);
    if std::fs::read_to_string(&manifest).ok().as_deref() != Some(MANIFEST) {
        std::fs::write(&manifest, MANIFEST).map_err(cannot)?;
    }
    dir.canonicalize().map_err(cannot)
}

fn path_arg(path: &Path) -> Result<&str, Failure> {
    path.to_str().ok_or_else(|| {
        Failure::new(
            Exit::Usage,
            "PI_WORKFLOWS_HOME is not valid UTF-8, which herdr cannot take; set it to a UTF-8 path",
        )
    })
}

/// The plugin as `herdr plugin list` reports it.
struct Listed {
    root: PathBuf,
    version: String,
    enabled: bool,
}

/// `herdr plugin list --plugin ID --json`: the plugin, or none.
fn listed(herdr: &Path) -> Result<Option<Listed>, Failure> {
    let stdout = run(herdr, &["plugin", "list", "--plugin", PLUGIN_ID, "--json"])?;
    let value: Value = serde_json::from_str(&stdout).map_err(|_| invalid())?;
    let plugins = value
        .pointer("/result/plugins")
        .and_then(Value::as_array)
        .ok_or_else(invalid)?;
    let mut ours = plugins
        .iter()
        .filter(|plugin| plugin.get("plugin_id").and_then(Value::as_str) == Some(PLUGIN_ID));
    let Some(plugin) = ours.next() else {
        return Ok(None);
    };
    if ours.next().is_some() {
        return Err(Failure::new(
            Exit::Refused,
            format!(
                "Herdr lists {PLUGIN_ID} twice; unlink it with `herdr plugin unlink {PLUGIN_ID}`, then run `pi-workflows herdr sync` again"
            ),
        ));
    }
    let root = plugin
        .get("plugin_root")
        .and_then(Value::as_str)
        .ok_or_else(invalid)?;
    let root = Path::new(root);
    Ok(Some(Listed {
        root: root.canonicalize().unwrap_or_else(|_| root.to_path_buf()),
        version: plugin
            .get("version")
            .and_then(Value::as_str)
            .ok_or_else(invalid)?
            .to_owned(),
        enabled: plugin
            .get("enabled")
            .and_then(Value::as_bool)
            .ok_or_else(invalid)?,
    }))
}

fn invalid() -> Failure {
    Failure::new(
        Exit::Refused,
        "herdr plugin list --json answered something other than Herdr 0.7's plugin list; install Herdr 0.7 or newer",
    )
}

/// Runs `herdr args…` within [`COMMAND_LIMIT`]; its stdout on success.
fn run(herdr: &Path, args: &[&str]) -> Result<String, Failure> {
    let what = args
        .iter()
        .take_while(|arg| !arg.starts_with("--"))
        .take(2)
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(herdr)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => Failure::new(
                Exit::Unavailable,
                "herdr is not installed (not on PATH); install Herdr 0.7 or newer, then run `pi-workflows herdr sync` again",
            ),
            kind => Failure::new(
                Exit::Unavailable,
                format!("cannot run herdr ({kind}); check the herdr on PATH, then run `pi-workflows herdr sync` again"),
            ),
        })?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut stdout).take(MAX_OUTPUT).read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut stderr).take(MAX_OUTPUT).read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < COMMAND_LIMIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::new(
                    Exit::TimedOut,
                    format!(
                        "`herdr {what}` did not finish within {} s; check that Herdr runs, then run `pi-workflows herdr sync` again",
                        COMMAND_LIMIT.as_secs()
                    ),
                ));
            }
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        let reason: String = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
        let reason: String = reason.chars().take(200).collect();
        return Err(Failure::new(
            Exit::Refused,
            format!(
                "`herdr {what}` failed ({reason}); fix that in Herdr, then run `pi-workflows herdr sync` again"
            ),
        ));
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    //! Against the fake herdr of scripts/fake-herdr.mjs (a real process):
    //! each starting state leads to its calls and outcome.
    use super::*;

    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new(plugin: Option<Value>) -> Self {
            let dir = tempfile::tempdir().expect("a temp dir");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fake-herdr.mjs");
            std::os::unix::fs::symlink(script, dir.path().join("herdr")).expect("link herdr");
            let state = json!({"panes": [{"pane_id": "w1:p1", "tab_id": "w1:t1", "workspace_id": "w1", "label": "pi"}], "plugin": plugin, "fail": [], "next": 2});
            std::fs::write(dir.path().join("herdr-state.json"), state.to_string()).expect("state");
            Self { dir }
        }

        fn herdr(&self) -> PathBuf {
            self.dir.path().join("herdr")
        }

        fn home(&self) -> PathBuf {
            let home = self.dir.path().join("home");
            std::fs::create_dir_all(&home).expect("home");
            home
        }

        fn plugin_dir(&self) -> String {
            self.home()
                .join("herdr-plugin")
                .canonicalize()
                .expect("plugin dir")
                .to_str()
                .expect("utf-8")
                .to_owned()
        }

        fn calls(&self) -> Vec<String> {
            std::fs::read_to_string(self.dir.path().join("herdr-calls.ndjson"))
                .unwrap_or_default()
                .lines()
                .map(|line| {
                    let call: Value = serde_json::from_str(line).expect("a call");
                    call["argv"]
                        .as_array()
                        .expect("argv")
                        .iter()
                        .map(|arg| arg.as_str().expect("arg"))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect()
        }

        fn set_plugin(&self, plugin: Value) {
            let state = json!({"panes": [], "plugin": plugin, "fail": [], "next": 2});
            std::fs::write(self.dir.path().join("herdr-state.json"), state.to_string())
                .expect("state");
        }

        fn plugin(&self) -> Value {
            let state: Value = serde_json::from_str(
                &std::fs::read_to_string(self.dir.path().join("herdr-state.json")).expect("state"),
            )
            .expect("json");
            state["plugin"].clone()
        }
    }

    const LIST: &str = "plugin list --plugin osolmaz.pi-workflows --json";

    #[test]
    fn the_manifest_names_the_plugin_the_package_version_and_the_piw_pane() {
        assert!(MANIFEST.contains("\nid = \"osolmaz.pi-workflows\"\n"));
        assert!(MANIFEST.contains(&format!("\nversion = \"{}\"\n", env!("CARGO_PKG_VERSION"))));
        assert!(MANIFEST.contains("\nmin_herdr_version = \"0.7.0\"\n"));
        assert!(MANIFEST.contains("[[panes]]\nid = \"piw\"\n"));
        assert!(MANIFEST.contains("\ncommand = [\"piw\", \"--herdr-pane\"]\n"));
    }

    #[test]
    fn a_herdr_without_the_plugin_gets_it_linked_from_the_home_and_a_second_sync_changes_nothing() {
        let fake = Fake::new(None);
        assert_eq!(
            sync(&fake.home(), &fake.herdr()).expect("linked"),
            Synced::Linked
        );
        let dir = fake.plugin_dir();
        assert_eq!(
            fake.calls(),
            [
                LIST.to_owned(),
                format!("plugin link {dir}"),
                LIST.to_owned()
            ]
        );
        assert_eq!(
            std::fs::read_to_string(Path::new(&dir).join("herdr-plugin.toml")).expect("manifest"),
            MANIFEST
        );
        assert_eq!(fake.plugin()["enabled"], true);

        assert_eq!(
            sync(&fake.home(), &fake.herdr()).expect("unchanged"),
            Synced::Unchanged
        );
        assert_eq!(
            fake.calls().len(),
            4,
            "one more list, nothing else: {:?}",
            fake.calls()
        );
    }

    #[test]
    fn a_disabled_plugin_is_enabled_and_one_linked_elsewhere_is_relinked_here() {
        let fake = Fake::new(None);
        let home = fake.home();
        write_manifest(&home).expect("manifest");
        let dir = fake.plugin_dir();
        fake.set_plugin(json!({"plugin_id": PLUGIN_ID, "plugin_root": dir, "manifest_path": "x", "version": env!("CARGO_PKG_VERSION"), "enabled": false}));
        assert_eq!(
            sync(&home, &fake.herdr()).expect("enabled"),
            Synced::Enabled
        );
        assert_eq!(
            fake.calls(),
            [
                LIST.to_owned(),
                format!("plugin enable {PLUGIN_ID}"),
                LIST.to_owned()
            ]
        );

        let elsewhere = Fake::new(Some(
            json!({"plugin_id": PLUGIN_ID, "plugin_root": "/old/package", "manifest_path": "/old/package/herdr-plugin.toml", "version": "0.0.9", "enabled": true}),
        ));
        assert_eq!(
            sync(&elsewhere.home(), &elsewhere.herdr()).expect("relinked"),
            Synced::Relinked
        );
        let dir = elsewhere.plugin_dir();
        assert_eq!(
            elsewhere.calls(),
            [
                LIST.to_owned(),
                format!("plugin unlink {PLUGIN_ID}"),
                format!("plugin link {dir}"),
                LIST.to_owned()
            ]
        );
        assert_eq!(elsewhere.plugin()["plugin_root"], dir.as_str());
    }

    #[test]
    fn a_missing_herdr_is_unavailable_and_a_failing_one_is_refused_each_with_one_line_and_no_path()
    {
        let fake = Fake::new(None);
        let missing = sync(&fake.home(), &fake.dir.path().join("no-herdr")).expect_err("no herdr");
        assert_eq!(missing.exit, Exit::Unavailable);
        assert_eq!(
            missing.message,
            "herdr is not installed (not on PATH); install Herdr 0.7 or newer, then run `pi-workflows herdr sync` again"
        );

        std::fs::write(
            fake.dir.path().join("herdr-state.json"),
            json!({"panes": [], "plugin": null, "fail": ["plugin link"], "next": 2}).to_string(),
        )
        .expect("state");
        let failed = sync(&fake.home(), &fake.herdr()).expect_err("link fails");
        assert_eq!(failed.exit, Exit::Refused);
        assert_eq!(
            failed.message,
            "`herdr plugin link` failed (herdr: plugin link failed (fake)); fix that in Herdr, then run `pi-workflows herdr sync` again"
        );
        assert!(
            !failed
                .message
                .contains(fake.dir.path().to_str().expect("utf-8"))
        );
    }
}
