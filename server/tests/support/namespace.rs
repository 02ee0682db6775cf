//! A private user and mount namespace with a small tmpfs, for full-disk
//! tests: a test re-runs its own binary for exactly itself inside
//! `unshare --user --map-root-user --mount`, so no mount outlives the test
//! and no root privilege is needed where unprivileged user namespaces are
//! allowed. A machine that allows neither fails these tests; they never
//! skip.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const NAMESPACE_MARK: &str = "PI_WORKFLOWS_TEST_IN_NAMESPACE";

/// Whether this process is the namespaced re-run of test `name`; if not,
/// re-runs the test binary for exactly `name` inside `unshare --user
/// --map-root-user --mount` and asserts that the re-run passed.
pub fn in_private_namespace(name: &str) -> bool {
    if std::env::var(NAMESPACE_MARK).as_deref() == Ok(name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let status = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--propagation", "private", "--"])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(NAMESPACE_MARK, name)
        .status()
        .unwrap_or_else(|error| {
            panic!("this test needs `unshare` (util-linux) to mount a small tmpfs in a private namespace: {error}")
        });
    assert!(
        status.success(),
        "the namespaced run of {name} failed ({status}); its output is above. A failure to \
         create the namespace or mount the tmpfs means this machine allows neither \
         unprivileged user namespaces nor root mounts: the test needs one of them"
    );
    false
}

/// Mounts a `size` tmpfs (e.g. `"16m"`) at `dir` (inside the private namespace).
pub fn mount_tmpfs(dir: &Path, size: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let output = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .output()
        .expect("run mount");
    assert!(
        output.status.success(),
        "mounting a {size} tmpfs at the state home failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Fills the filesystem of `dir` with one file until the disk is full and
/// returns its path.
pub fn fill_disk(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create the filler");
    for chunk in [1 << 20, 1 << 12, 1] {
        let block = vec![0u8; chunk];
        while file.write_all(&block).is_ok() {}
    }
    let _ = file.sync_all();
    let stat = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    assert_eq!(stat.blocks_available(), 0, "the disk is full");
    path
}
