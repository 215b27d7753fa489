//! Where the CPU goes during one run: the seckill instances, PostgreSQL, Redis, the load
//! generator, and the whole machine, each read before and after the run (Linux `/proc`).
//!
//! - An instance, Redis: `utime + stime` of its pid (`/proc/<pid>/stat`), threads included.
//! - PostgreSQL: the server's processes, the postmaster and every child of it whose `comm`
//!   is `postgres` (backends, the WAL writer, the checkpointer...). Backends come and go
//!   (pgbench's lives exactly as long as the run), so each process counts with the time of
//!   its reaped children (`cutime + cstime`): a backend that exits moves its time into the
//!   postmaster's, and the sum stays whole. Only this server's: another PostgreSQL on the
//!   machine (a test's private one) is not the one under test, and counts as "other".
//! - The load generator (wrk, pgbench): a child of this process that exits before the run
//!   ends, so `getrusage(RUSAGE_CHILDREN)` around the run.
//! - The machine: every CPU's busy time in `/proc/stat` (all but idle and iowait).
//!
//! A part that cannot be read (a pid that went away, a server in another pid namespace, a
//! system without `/proc`) is `None`, shown as "n/a", never as zero.

/// Clock ticks per second of `/proc` times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub ppid: u32,
    /// `utime + stime`, in ticks.
    pub own: u64,
    /// `cutime + cstime`: the reaped children's, in ticks.
    pub children: u64,
    /// When it started (ticks after boot): a pid taken again by another process differs.
    pub start: u64,
}

/// Parse one `/proc/<pid>/stat` line. The command name, in parentheses, may hold spaces and
/// parentheses itself: the fields are counted from the last `)`.
pub(crate) fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 of proc(5) (the state): field n is at n - 3.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        ppid: u32::try_from(field(4)?).ok()?,
        own: field(14)? + field(15)?,
        children: field(16)? + field(17)?,
        start: field(22)?,
    })
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn comm(pid: u32) -> Option<String> {
    Some(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()?
            .trim()
            .to_owned(),
    )
}

/// Busy ticks of all CPUs from the `cpu` line of `/proc/stat`: user, nice, system, irq,
/// softirq and steal (guest time is inside user already; idle and iowait are not busy).
pub(crate) fn parse_machine(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| values.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

/// The processes a run is charged to.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    /// The seckill instances of the run.
    pub instances: Vec<u32>,
    /// PostgreSQL's postmaster, if it is a local process.
    pub postmaster: Option<u32>,
    /// Redis's pid, if it is a local process.
    pub redis: Option<u32>,
}

/// CPU time spent so far by each part, in seconds.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// Per instance: its start and its time; `None` for one that cannot be read.
    instances: Vec<Option<(u64, f64)>>,
    /// The server's processes, with the postmaster's start: the backends may change between
    /// two samples (their time stays in the sum), the postmaster may not.
    postgres: Option<(u64, f64)>,
    redis: Option<(u64, f64)>,
    children: Option<f64>,
    machine: Option<f64>,
}

/// CPU seconds a run spent, by part; `None` where a part could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    pub instances: Option<f64>,
    pub postgres: Option<f64>,
    pub redis: Option<f64>,
    pub load: Option<f64>,
    pub machine: Option<f64>,
}

impl Spent {
    /// The machine's time less every part's: other processes (this one among them).
    pub fn other(&self) -> Option<f64> {
        Some(self.machine? - self.instances? - self.postgres? - self.redis? - self.load?)
    }
}

impl Watch {
    /// Read every part now.
    pub fn sample(&self) -> Sample {
        let ticks = ticks_per_second();
        let one = |pid: u32| stat(pid).map(|s| (s.start, (s.own + s.children) as f64 / ticks));
        Sample {
            instances: self.instances.iter().map(|&pid| one(pid)).collect(),
            postgres: self.postmaster.and_then(|pid| postgres(pid, ticks)),
            redis: self.redis.and_then(one),
            children: children_seconds(),
            machine: std::fs::read_to_string("/proc/stat")
                .ok()
                .as_deref()
                .and_then(parse_machine)
                .map(|t| t as f64 / ticks),
        }
    }
}

/// What the run between `before` and `after` spent.
pub(crate) fn spent(before: &Sample, after: &Sample) -> Spent {
    // Each part's time, if the same process (same start) was read both times.
    let delta = |a: Option<(u64, f64)>, b: Option<(u64, f64)>| match (a, b) {
        (Some((start_a, a)), Some((start_b, b))) if start_a == start_b => Some(b - a),
        _ => None,
    };
    let instances = if before.instances.len() == after.instances.len() {
        before
            .instances
            .iter()
            .zip(&after.instances)
            .map(|(a, b)| delta(*a, *b))
            // A fold from 0.0, not `sum` (which starts at -0.0): no instances spent 0 s.
            .try_fold(0.0, |total, spent| Some(total + spent?))
    } else {
        None
    };
    Spent {
        instances,
        postgres: delta(before.postgres, after.postgres),
        redis: delta(before.redis, after.redis),
        load: after.children.zip(before.children).map(|(b, a)| b - a),
        machine: after.machine.zip(before.machine).map(|(b, a)| b - a),
    }
}

/// The postmaster's and its `postgres` children's time, reaped children included; with the
/// postmaster's start, so that a restarted server is not compared with the old one.
fn postgres(postmaster: u32, ticks: f64) -> Option<(u64, f64)> {
    if comm(postmaster)? != "postgres" {
        return None;
    }
    let root = stat(postmaster)?;
    let mut total = root.own + root.children;
    for (pid, child) in children_of(postmaster) {
        // One that exits after this scan is in the postmaster's reaped time by the next
        // sample. One reaped between the postmaster's read above and this scan is missed by
        // this sample: a window of a scan of /proc, and backends rarely end during a run
        // (pgbench's ends after it, before the sample that closes the run).
        if comm(pid).as_deref() == Some("postgres") {
            total += child.own + child.children;
        }
    }
    Some((root.start, total as f64 / ticks))
}

/// The processes whose parent is `parent`, from a scan of `/proc`.
fn children_of(parent: u32) -> Vec<(u32, Stat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .filter(|(_, s)| s.ppid == parent)
        .collect()
}

/// User and system time of this process's reaped children, in seconds.
fn children_seconds() -> Option<f64> {
    // SAFETY: an all-zero rusage is a valid value of a plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a local struct.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return None;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// The pid of the postmaster behind `pool`'s server, if it runs on this machine: the parent
/// of this connection's backend, checked to be a `postgres` process.
pub(crate) async fn postmaster(pool: &sqlx::PgPool) -> Option<u32> {
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    let backend = u32::try_from(backend).ok()?;
    if comm(backend)? != "postgres" {
        return None;
    }
    let parent = stat(backend)?.ppid;
    (comm(parent)? == "postgres").then_some(parent)
}

/// Redis's pid, if `pid` (what `INFO server` said) is a `redis-server` on this machine.
pub(crate) fn local_redis(pid: Option<u32>) -> Option<u32> {
    let pid = pid?;
    comm(pid)?.starts_with("redis-server").then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own.
        let line = "4242 (post gres) x) S 2212 4242 4242 0 -1 4194560 1180 0 0 0 \
                    150 35 7 3 20 0 1 0 987654 227745792 2517 18446744073709551615";

        let stat = parse_stat(line).unwrap();

        assert_eq!(
            stat,
            Stat {
                ppid: 2212,
                own: 185,
                children: 10,
                start: 987654
            }
        );
    }

    #[test]
    fn the_machine_is_busy_outside_idle_and_iowait() {
        let proc_stat = "cpu  100 1 20 5000 40 2 3 4 9 0\ncpu0 50 0 10 2500 20 1 1 2 0 0\n";
        assert_eq!(parse_machine(proc_stat), Some(100 + 1 + 20 + 2 + 3 + 4));
    }

    #[test]
    fn a_part_that_changed_process_or_went_missing_is_unknown_not_zero() {
        let before = Sample {
            instances: vec![Some((1, 2.0)), Some((7, 1.0))],
            postgres: Some((5, 10.0)),
            redis: Some((9, 1.0)),
            children: Some(0.5),
            machine: Some(100.0),
        };
        let after = Sample {
            instances: vec![Some((1, 3.0)), Some((7, 1.5))],
            // The server restarted: another postmaster.
            postgres: Some((6, 0.2)),
            redis: None,
            children: Some(1.5),
            machine: Some(104.0),
        };

        let spent = spent(&before, &after);

        assert_eq!(spent.instances, Some(1.5));
        assert_eq!(spent.postgres, None);
        assert_eq!(spent.redis, None);
        assert_eq!(spent.load, Some(1.0));
        assert_eq!(spent.machine, Some(4.0));
        assert_eq!(spent.other(), None);
    }

    #[test]
    fn a_process_that_is_not_postgres_is_no_postmaster_and_a_live_pid_is_read() {
        let me = std::process::id();
        assert!(postgres(me, ticks_per_second()).is_none());
        assert!(local_redis(Some(me)).is_none());
        let watch = Watch {
            instances: vec![me],
            postmaster: None,
            redis: None,
        };

        let spent = spent(&watch.sample(), &watch.sample());

        assert!(spent.instances.is_some_and(|s| s >= 0.0));
        assert!(spent.machine.is_some_and(|s| s >= 0.0));
        assert_eq!(spent.postgres, None);
    }
}
