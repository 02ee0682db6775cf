//! Real Pi for the Pi lane: the TypeScript runner the server launches, the
//! mock model (`sdk-ts/test-support/mock-model-cli.ts`, one process per
//! trial) and a sandboxed `pi` executable (Pi 1.6 on Node 22 from
//! `scripts/install-pi.sh`, its own HOME and agent dir whose `models.json`
//! points at the mock). Nothing is skipped: a missing part fails the lane
//! with one line saying what to run. The mock submits the step contract's
//! output for every agent step, and says "Done." once it was accepted.
// The scripted lane's binary (`tests/torture/`) compiles this module too
// (the trial refers to it) without starting Pi.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What the lane needs on disk, or the one line that says how to get it.
pub(crate) struct Parts {
    /// `node`: the system Node (20+) the runner and the mock run on.
    node: PathBuf,
    runner: PathBuf,
    mock_cli: PathBuf,
    pi_node: PathBuf,
    pi_cli: PathBuf,
}

impl Parts {
    pub(crate) fn find() -> Result<Self, String> {
        let sdk = repo().join("sdk-ts");
        let runner = sdk.join("build/src/runner/bin.js");
        let mock_cli = sdk.join("build/test-support/mock-model-cli.js");
        for path in [&runner, &mock_cli] {
            if !path.exists() {
                return Err(format!(
                    "{} is missing: build sdk-ts first (cd sdk-ts && npm ci && npm run build && npx tsc -p tsconfig.pi.json)",
                    path.display()
                ));
            }
        }
        let env_file = repo().join(".e2e/pi/env");
        let text = std::fs::read_to_string(&env_file).map_err(|_| {
            format!(
                "real Pi is not installed ({} is missing): run scripts/install-pi.sh",
                env_file.display()
            )
        })?;
        let value = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(&format!("{key}=")))
                .map(PathBuf::from)
                .filter(|path| path.exists())
                .ok_or_else(|| {
                    format!(
                        "{key} in {} is missing or gone: run scripts/install-pi.sh",
                        env_file.display()
                    )
                })
        };
        let node = std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join("node"))
                    .find(|node| node.is_file())
            })
            .ok_or(
                "node is not on PATH: install Node 20+ (the runner and the mock model run on it)",
            )?;
        Ok(Self {
            node,
            runner,
            mock_cli,
            pi_node: value("PI_E2E_NODE")?,
            pi_cli: value("PI_E2E_CLI")?,
        })
    }

    /// `PI_WORKFLOWS_RUNNER`: the TypeScript runner on the system Node.
    pub(crate) fn runner_command(&self) -> String {
        format!("{} {}", self.node.display(), self.runner.display())
    }
}

/// The mock model and the sandbox of one trial; the mock stops on drop.
pub(crate) struct Rig {
    mock: Child,
    /// The sandbox's agent dir: every Pi of this trial has it in its
    /// environment (`PI_CODING_AGENT_DIR`), which finds a leftover one.
    pub(crate) agent_dir: PathBuf,
    /// `PI_WORKFLOWS_PI`.
    pub(crate) pi: PathBuf,
}

impl Rig {
    /// Starts the mock model and writes the sandbox under `dir/pi`.
    pub(crate) fn start(parts: &Parts, dir: &Path) -> Self {
        let root = dir.join("pi");
        let home = root.join("home");
        let agent_dir = home.join(".pi").join("agent");
        std::fs::create_dir_all(&agent_dir).unwrap();
        let rules = serde_json::json!([
            {"name": "done", "lastRole": "tool", "when": "Output accepted for step",
             "reply": {"kind": "text", "text": "Done."}},
            {"name": "submit", "reply": {"kind": "submitStep", "output": {"verdict": super::workload::VERDICT}}},
        ]);
        let rules_file = root.join("rules.json");
        std::fs::write(&rules_file, rules.to_string()).unwrap();
        let mut mock = Command::new(&parts.node)
            .arg(&parts.mock_cli)
            .arg("--rules")
            .arg(&rules_file)
            .arg("--log")
            .arg(root.join("model.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the mock model starts");
        let mut line = String::new();
        BufReader::new(mock.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("MOCK_MODEL_LISTENING ")
            .unwrap_or_else(|| panic!("the mock model's first line: {line:?}"))
            .to_owned();
        let models = serde_json::json!({"providers": {"mock": {
            "baseUrl": format!("http://127.0.0.1:{port}/v1"),
            "api": "openai-completions",
            "apiKey": "mock-key",
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": "mock-model", "name": "Mock Model", "contextWindow": 32000, "maxTokens": 1024}],
        }}});
        let settings = serde_json::json!({
            "defaultProvider": "mock", "defaultModel": "mock-model", "quietStartup": true,
            "enableInstallTelemetry": false, "retry": {"enabled": false},
        });
        std::fs::write(agent_dir.join("models.json"), models.to_string()).unwrap();
        std::fs::write(agent_dir.join("settings.json"), settings.to_string()).unwrap();
        let quote = |path: &Path| format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"));
        let pi = root.join("pi");
        std::fs::write(
            &pi,
            format!(
                "#!/bin/sh\nexport HOME={}\nexport PI_CODING_AGENT_DIR={}\nexport PI_OFFLINE=1 PI_TELEMETRY=0 PI_SKIP_VERSION_CHECK=1\nexec {} {} --no-skills --no-prompt-templates --no-context-files --no-themes --no-mcp --offline \"$@\"\n",
                quote(&home),
                quote(&agent_dir),
                quote(&parts.pi_node),
                quote(&parts.pi_cli)
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pi, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self {
            mock,
            agent_dir,
            pi,
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.mock.kill();
        let _ = self.mock.wait();
    }
}

/// The processes (pid and command line) whose environment has `needle`
/// (`KEY=value`), other than `except`: a runner, shell command or Pi of
/// one trial carries its state home or agent dir there.
pub(crate) fn processes_with_env(needle: &str, except: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == except || pid == std::process::id() {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|byte| *byte == 0)
            .any(|var| var == needle.as_bytes())
        {
            let state = std::fs::read_to_string(entry.path().join("stat"))
                .unwrap_or_default()
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            if state == "Z" {
                // Exited; its parent has not reaped it yet.
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "{pid} {}",
                String::from_utf8_lossy(&cmdline).replace('\0', " ").trim()
            ));
        }
    }
    found
}
