//! Process identity and process-group signalling.
//!
//! Invariants:
//! - A process is identified by its pid AND its start time (field 22 of
//!   `/proc/<pid>/stat`), so a reused pid is never mistaken for a runner and
//!   never signalled.
//! - Runners and their registered children live in their own process groups;
//!   stopping one sends SIGTERM to the whole group and, after a bounded grace
//!   period, SIGKILL to the whole group.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A pid plus its kernel start time: the identity that survives pid reuse checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
}

impl ProcessIdentity {
    /// The stored text form `pid:start_time`.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.pid, self.start_time)
    }

    /// Parses the stored text form.
    pub fn decode(text: &str) -> Option<Self> {
        let (pid, start) = text.split_once(':')?;
        Some(Self {
            pid: pid.parse().ok()?,
            start_time: start.parse().ok()?,
        })
    }
}

/// The parsed fields of `/proc/<pid>/stat` that supervision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub parent_pid: u32,
    pub process_group: u32,
    pub start_time: u64,
}

/// Parses `/proc/<pid>/stat` text. The command name may contain spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) … starttime(22) → indices 0,1,2,19.
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        parent_pid: fields.get(1)?.parse().ok()?,
        process_group: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Reads the current stat of `pid`, or `None` when it does not exist.
pub fn stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// The identity of a live process.
pub fn identity(pid: u32) -> Option<ProcessIdentity> {
    stat(pid).map(|stat| ProcessIdentity {
        pid,
        start_time: stat.start_time,
    })
}

/// Whether the exact process (same pid and start time) is still alive (zombies count as gone).
pub fn is_alive(identity: &ProcessIdentity) -> bool {
    stat(identity.pid)
        .is_some_and(|stat| stat.start_time == identity.start_time && stat.state != 'Z')
}

/// Whether the exact process is stopped (SIGSTOP or a debugger): a stalled
/// runner whose claim the server must not renew.
pub fn is_stopped(identity: &ProcessIdentity) -> bool {
    stat(identity.pid).is_some_and(|stat| {
        stat.start_time == identity.start_time && matches!(stat.state, 'T' | 't')
    })
}

/// Sends `signal` to the process group led by the exact process, if it is
/// still that process. Returns whether a signal was sent.
pub fn signal_group(identity: &ProcessIdentity, signal: Signal) -> bool {
    let Some(current) = stat(identity.pid) else {
        return false;
    };
    if current.start_time != identity.start_time || current.process_group != identity.pid {
        return false;
    }
    killpg(Pid::from_raw(identity.pid as i32), signal).is_ok()
}

/// Sends `signal` to a process group by id without an identity check. Used
/// only for a group whose leader is our own live child (we hold its handle).
pub fn signal_own_group(pgid: u32, signal: Signal) -> bool {
    killpg(Pid::from_raw(pgid as i32), signal).is_ok()
}

/// Every live descendant of the processes in group `pgid` (children of its
/// members, their children, …), with its identity, read from `/proc` in one
/// pass. Children a member started in their own process group (a tool Pi
/// runs detached) are included: they are what killing the group alone
/// would leave behind. Collect them before the group dies (their parents
/// are then reparented and the ancestry is lost).
pub fn group_descendants(pgid: u32) -> Vec<ProcessIdentity> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let processes: Vec<(u32, ProcStat)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect();
    let mut inside: std::collections::BTreeSet<u32> = processes
        .iter()
        .filter(|(_, stat)| stat.process_group == pgid)
        .map(|(pid, _)| *pid)
        .collect();
    let mut found = Vec::new();
    loop {
        let next: Vec<&(u32, ProcStat)> = processes
            .iter()
            .filter(|(pid, stat)| inside.contains(&stat.parent_pid) && !inside.contains(pid))
            .collect();
        if next.is_empty() {
            return found;
        }
        for (pid, stat) in next {
            inside.insert(*pid);
            found.push(ProcessIdentity {
                pid: *pid,
                start_time: stat.start_time,
            });
        }
    }
}

/// SIGKILL to the exact process (pid and start time) and, when it leads
/// one, its process group.
pub fn kill_identity(identity: &ProcessIdentity) {
    if !signal_group(identity, Signal::SIGKILL) && is_alive(identity) {
        let _ = nix::sys::signal::kill(Pid::from_raw(identity.pid as i32), Signal::SIGKILL);
    }
}

/// Whether any process is still in process group `pgid`.
pub fn group_has_members(pgid: u32) -> bool {
    killpg(Pid::from_raw(pgid as i32), None).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_counts_fields_after_the_last_parenthesis() {
        let text = "4242 (node (worker) x) S 100 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0";
        let stat = parse_stat(text).unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                parent_pid: 100,
                process_group: 4242,
                start_time: 987654
            }
        );
    }

    #[test]
    fn identity_round_trips_and_rejects_garbage() {
        let identity = ProcessIdentity {
            pid: 7,
            start_time: 99,
        };
        assert_eq!(ProcessIdentity::decode(&identity.encode()), Some(identity));
        assert_eq!(ProcessIdentity::decode("x:1"), None);
        assert_eq!(ProcessIdentity::decode("7"), None);
    }

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = identity(std::process::id()).unwrap();
        assert!(is_alive(&me));
        assert!(!is_stopped(&me));
        let reused = ProcessIdentity {
            pid: me.pid,
            start_time: me.start_time + 1,
        };
        assert!(!is_alive(&reused));
        assert!(
            !signal_group(&reused, Signal::SIGTERM),
            "a reused pid is never signalled"
        );
    }
}
