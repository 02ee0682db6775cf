//! Runner logs: what each runner and resolver process writes to stderr, in
//! `host/logs/<name>.log`.
//!
//! Invariants:
//! - A process's stderr is a pipe the server copies into its log, so the
//!   server alone writes log files. A log holds at most [`LOG_CAP_BYTES`]:
//!   when more arrives, the log is rewritten with one line saying how many
//!   earlier bytes were dropped, followed by the newest bytes (about half the
//!   cap, starting at a line boundary).
//! - The directory keeps at most [`LOGS_KEPT`] logs: opening a log removes
//!   the oldest (by modification time) beyond that, never one a live process
//!   still writes.
//! - Logs (and the temporary file a rewrite goes through) are mode 0600 in
//!   the 0700 `host/logs/` directory.
//! - A live log can be renamed (`LogName::rename`: a resolver handed its run
//!   becomes that runner epoch's log); the copy keeps appending to the same
//!   file under its new name, and the live set follows the rename.
//! - Copying never blocks the process: a log that cannot be written (disk
//!   full) drops what it cannot hold and keeps draining the pipe. After the
//!   server dies, a process's later stderr writes fail (`EPIPE`) and are lost.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

/// The most bytes one log holds.
pub const LOG_CAP_BYTES: u64 = 1024 * 1024;

/// The most logs `host/logs/` keeps.
pub const LOGS_KEPT: usize = 100;

/// The logs of one state directory, and which of them live processes write.
#[derive(Clone, Debug)]
pub struct RunnerLogs {
    dir: PathBuf,
    live: Arc<Mutex<HashSet<String>>>,
}

impl RunnerLogs {
    /// The logs in `dir` (`host/logs/`, created by `home::prepare`).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            live: Arc::default(),
        }
    }

    /// Opens the log `<name>.log` for a process about to start: removes the
    /// oldest logs over [`LOGS_KEPT`], creates the log, and returns the
    /// child's stderr and the copy to start once the child runs.
    pub fn open(&self, name: &str) -> io::Result<(Stdio, Capture)> {
        let file_name = format!("{name}.log");
        self.live
            .lock()
            .expect("runner logs lock")
            .insert(file_name.clone());
        let registered = Registered {
            live: self.live.clone(),
            file_name: Some(file_name.clone()),
        };
        self.prune();
        let log = CappedLog::open(self.dir.join(&file_name), LOG_CAP_BYTES)?;
        let (reader, writer) = io::pipe()?;
        Ok((
            Stdio::from(writer),
            Capture {
                reader,
                shared: Arc::new(Mutex::new(Shared { log, registered })),
                dir: self.dir.clone(),
            },
        ))
    }

    /// Removes the oldest logs no live process writes, leaving room for one
    /// more under [`LOGS_KEPT`].
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let live = self.live.lock().expect("runner logs lock").clone();
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
            .filter_map(|entry| {
                let modified = entry.metadata().and_then(|meta| meta.modified()).ok()?;
                Some((modified, entry.path()))
            })
            .collect();
        if files.len() < LOGS_KEPT {
            return;
        }
        files.sort();
        let mut excess = files.len() + 1 - LOGS_KEPT;
        for (_, path) in files {
            if excess == 0 {
                break;
            }
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or_default();
            let owner = name.strip_suffix(".tmp").unwrap_or(name);
            if live.contains(owner) {
                continue;
            }
            if fs::remove_file(&path).is_ok() {
                excess -= 1;
            }
        }
    }
}

/// A log's place in the live set, until it is released (or dropped).
#[derive(Debug)]
struct Registered {
    live: Arc<Mutex<HashSet<String>>>,
    file_name: Option<String>,
}

impl Registered {
    /// Leaves the live set.
    fn release(&mut self) {
        if let Some(file_name) = self.file_name.take() {
            self.live
                .lock()
                .expect("runner logs lock")
                .remove(&file_name);
        }
    }

    /// Moves the live entry to `file_name` (while still live).
    fn rename(&mut self, file_name: String) {
        if self.file_name.is_none() {
            return;
        }
        let mut live = self.live.lock().expect("runner logs lock");
        if let Some(old) = self.file_name.take() {
            live.remove(&old);
        }
        live.insert(file_name.clone());
        self.file_name = Some(file_name);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.release();
    }
}

/// A log and its live entry, shared by the copy thread and the log's name.
#[derive(Debug)]
struct Shared {
    log: CappedLog,
    registered: Registered,
}

/// The copy of one process's stderr into its log, not started yet.
#[derive(Debug)]
pub struct Capture {
    reader: io::PipeReader,
    shared: Arc<Mutex<Shared>>,
    dir: PathBuf,
}

impl Capture {
    /// Copies the pipe into the log on a thread of its own until every
    /// writer of the pipe (the process and whatever inherited its stderr)
    /// closed it. Returns the log's name, to rename it while it is copied.
    pub fn start(self) -> LogName {
        let Self {
            mut reader,
            shared,
            dir,
        } = self;
        let copy = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("runner-log".into())
            .spawn(move || {
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    match reader.read(&mut chunk) {
                        Ok(0) => break,
                        // A log that cannot be written loses these bytes; the
                        // pipe keeps draining so the process never blocks.
                        Ok(count) => {
                            let _ = copy.lock().expect("log lock").log.append(&chunk[..count]);
                        }
                        Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                copy.lock().expect("log lock").registered.release();
            });
        // Without a thread nobody reads the pipe: the process's stderr
        // writes then fail (the reader end was dropped with the closure).
        let _ = spawned;
        LogName { shared, dir }
    }
}

/// The name of a started log.
#[derive(Debug)]
pub struct LogName {
    shared: Arc<Mutex<Shared>>,
    dir: PathBuf,
}

impl LogName {
    /// Renames the log to `<name>.log`: the file, where the copy appends
    /// from now on, and its live entry.
    pub fn rename(&self, name: &str) -> io::Result<()> {
        let file_name = format!("{name}.log");
        let to = self.dir.join(&file_name);
        let mut shared = self.shared.lock().expect("log lock");
        fs::rename(&shared.log.path, &to)?;
        shared.log.path = to;
        shared.registered.rename(file_name);
        Ok(())
    }
}

/// An append-only file of at most `cap` bytes that keeps its newest bytes.
#[derive(Debug)]
struct CappedLog {
    path: PathBuf,
    file: File,
    len: u64,
    cap: u64,
    /// Bytes dropped from this log so far.
    dropped: u64,
}

impl CappedLog {
    fn open(path: PathBuf, cap: u64) -> io::Result<Self> {
        let file = private(&path, false)?;
        let len = file.metadata()?.len();
        Ok(Self {
            path,
            file,
            len,
            cap,
            dropped: 0,
        })
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.len + bytes.len() as u64 <= self.cap {
            self.file.write_all(bytes)?;
            self.len += bytes.len() as u64;
            return Ok(());
        }
        self.rewrite_with_tail(bytes)
    }

    /// Rewrites the log as a note of what was dropped plus the newest half
    /// of the cap of (log + `incoming`), from its first line start.
    fn rewrite_with_tail(&mut self, incoming: &[u8]) -> io::Result<()> {
        let keep = usize::try_from(self.cap / 2).unwrap_or(usize::MAX);
        let mut tail = if incoming.len() >= keep {
            incoming[incoming.len() - keep..].to_vec()
        } else {
            let from_file = (keep - incoming.len()).min(usize::try_from(self.len).unwrap_or(0));
            let mut tail = vec![0u8; from_file];
            let mut reader = File::open(&self.path)?;
            reader.seek(SeekFrom::Start(self.len - from_file as u64))?;
            reader.read_exact(&mut tail)?;
            tail.extend_from_slice(incoming);
            tail
        };
        // Start at a line boundary when the tail holds one.
        if let Some(newline) = tail.iter().position(|&byte| byte == b'\n')
            && newline + 1 < tail.len()
        {
            tail.drain(..=newline);
        }
        self.dropped += self.len + incoming.len() as u64 - tail.len() as u64;
        let note = format!(
            "[pi-workflows: {} earlier bytes of this log were dropped; a log keeps at most {} bytes]\n",
            self.dropped, self.cap
        );
        let temporary = self.path.with_extension("log.tmp");
        let mut rewritten = private(&temporary, true)?;
        rewritten.write_all(note.as_bytes())?;
        rewritten.write_all(&tail)?;
        fs::rename(&temporary, &self.path)?;
        self.file = private(&self.path, false)?;
        self.len = (note.len() + tail.len()) as u64;
        Ok(())
    }
}

/// Opens `path` for appending (or truncated, for a rewrite), user-only.
fn private(path: &Path, truncate: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).mode(0o600);
    if truncate {
        options.write(true).truncate(true);
    } else {
        options.append(true);
    }
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_log_past_its_cap_keeps_its_newest_lines_after_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let mut log = CappedLog::open(path.clone(), 1000).unwrap();
        for line in 0..100 {
            log.append(format!("line {line:04} .........\n").as_bytes())
                .unwrap();
            assert!(fs::metadata(&path).unwrap().len() <= 1000);
        }
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[pi-workflows: "), "{text}");
        assert!(text.ends_with("line 0099 .........\n"), "{text}");
        assert!(!text.contains("line 0000"), "{text}");
        // Every kept line is whole.
        for line in text.lines().skip(1) {
            assert!(line.starts_with("line ") && line.len() == 19, "{line:?}");
        }
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!path.with_extension("log.tmp").exists());
    }

    #[test]
    fn a_chunk_larger_than_the_cap_keeps_its_own_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.log");
        let mut log = CappedLog::open(path.clone(), 1000).unwrap();
        let chunk: Vec<u8> = (0..5000u32)
            .flat_map(|i| format!("{:03}\n", i % 1000).into_bytes())
            .collect();
        log.append(&chunk).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.len() <= 1000, "{}", text.len());
        assert!(text.ends_with("999\n"));
    }

    #[test]
    fn a_renamed_log_is_written_under_its_new_name_and_stays_live() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let logs = RunnerLogs::new(dir.path().to_path_buf());
        let (stderr, capture) = logs.open("resolve-1").unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "echo before >&2; read line; echo after >&2"])
            .stdin(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let name = capture.start();
        let old = dir.path().join("resolve-1.log");
        while !fs::read_to_string(&old)
            .unwrap_or_default()
            .contains("before")
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        name.rename("re-1").unwrap();
        let live = || logs.live.lock().unwrap().clone();
        assert_eq!(live(), HashSet::from(["re-1.log".to_owned()]));
        child.stdin.take().unwrap().write_all(b"\n").unwrap();
        child.wait().unwrap();
        let new = dir.path().join("re-1.log");
        while live().contains("re-1.log") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(fs::read_to_string(&new).unwrap(), "before\nafter\n");
        assert!(!old.exists());
    }

    #[test]
    fn pruning_removes_the_oldest_logs_but_never_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let logs = RunnerLogs::new(dir.path().to_path_buf());
        // The oldest log stays open (a live runner) while many others come and go.
        let (_stderr, oldest) = logs.open("live-oldest").unwrap();
        for i in 0..LOGS_KEPT + 20 {
            let (_stderr, capture) = logs.open(&format!("run-{i:04}")).unwrap();
            drop(capture);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.len() <= LOGS_KEPT, "{}", names.len());
        assert!(names.contains(&"live-oldest.log".to_owned()));
        assert!(names.contains(&format!("run-{:04}.log", LOGS_KEPT + 19)));
        assert!(!names.contains(&"run-0000.log".to_owned()));
        drop(oldest);
    }
}
