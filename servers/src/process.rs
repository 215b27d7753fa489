//! The process behind every server: how it is spawned and tied to this process, signalled,
//! stopped and reaped, always by the pid it was started with (never by name), and the files
//! and ports it is given.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How a server's process is tied to this one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tie {
    /// A plain child in this process's group: a Ctrl-C at the terminal reaches it too. For
    /// tests, which may start a server from a short-lived thread (`spawn_blocking`).
    #[default]
    Child,
    /// A child in a process group of its own (a Ctrl-C at the terminal reaches this process
    /// only, which then stops it in order), killed by the kernel when the *thread* that
    /// spawned it exits (`PR_SET_PDEATHSIG`), so that it never outlives a program that is
    /// killed. For a program (the demo, the soak) that spawns from threads that live as long
    /// as it does, such as tokio's workers.
    OwnGroupDiesWithSpawner,
}

impl Tie {
    /// Set `command` up to be tied this way.
    pub fn apply(self, command: &mut Command) {
        if self == Tie::Child {
            return;
        }
        command.process_group(0);
        // SAFETY: `prctl` is async-signal-safe and touches only the calling (child) process.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// Send `signal` (`-STOP`, `-CONT`, ...) to `pid` with `kill`.
///
/// # Panics
/// If `kill` fails (no such process).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill on the PATH");
    assert!(status.success(), "kill {signal} {pid}");
}

/// SIGKILL `child` and wait for it, so that no zombie is left.
pub(crate) fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGINT (PostgreSQL's fast shutdown; Redis stops, keeping nothing), then SIGKILL after
/// 5 s; the child is reaped.
pub(crate) fn stop(mut child: Child) {
    let pid = child.id() as i32;
    // SAFETY: sending a signal to our own child, by its pid, before it is reaped.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    for _ in 0..100 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reap(child);
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` lines of the file at `path` (empty if there is none).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    tail(&std::fs::read_to_string(path).unwrap_or_default(), lines)
}

/// A new, empty directory for a private server, `seckill-<label>-<pid>-<random>` in the
/// system's temporary directory (the pid says which process left it behind, if one did).
pub(crate) fn temp_dir(label: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "seckill-{label}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: format!("creating the private server's directory {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

/// The first directory of the PATH, then of `extra`, that holds every one of `names`;
/// returns the path of the first name there.
pub fn find(names: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .find(|dir| names.iter().all(|name| dir.join(name).is_file()))
        .map(|dir| dir.join(names[0]))
}

/// The pids whose parent is `parent` (from `/proc/<pid>/stat`).
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid ...`: comm may hold spaces, so read after its `)`.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Send `sig` to `pid` (a process this one started, or one of its descendants, looked up
/// just before); a pid already gone is no error.
pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: a signal to a pid of ours or of our children's, read just before.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Whether `pid` runs (a zombie does not: a killed postmaster waits for init to reap it).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Wait (ten seconds at most) until `pid` no longer runs.
pub(crate) fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }
}
