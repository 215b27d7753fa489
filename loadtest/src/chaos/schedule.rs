//! The fault schedule: which fault comes next, drawn from a seeded generator and from nothing
//! else, so that a seed replays the same faults in the same order with the same parameters
//! however long each one takes to inject and heal.
//!
//! The first faults are every kind once, in an order shuffled by the seed: a soak that lasts
//! long enough for that many faults has run every kind. After them each kind is drawn at
//! random.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What the nemesis does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL an instance, then start it again.
    KillInstance,
    /// SIGSTOP an instance for longer than its lock's lease, then SIGCONT.
    PauseInstance,
    /// Restart Redis empty (it keeps nothing on disk): every lock and fence counter is gone.
    RestartRedis,
    /// Read the lock's keys, and a moment later write them back as they were: a failover to
    /// a replica that lags (the fence counter goes back, the lock is held by whoever held it
    /// then, or by nobody).
    FenceBack,
    /// `pg_terminate_backend` the app's PostgreSQL sessions, in rounds, for a while.
    TerminateBackends,
    /// Restart PostgreSQL (fast shutdown, as `pg_ctl restart -m fast`).
    RestartPostgres,
    /// Add latency to one instance's connections to PostgreSQL and/or Redis.
    DelayNetwork,
    /// Drop one instance's connections to PostgreSQL and/or Redis, and refuse new ones.
    CutNetwork,
}

impl FaultKind {
    pub const ALL: [FaultKind; 8] = [
        FaultKind::KillInstance,
        FaultKind::PauseInstance,
        FaultKind::RestartRedis,
        FaultKind::FenceBack,
        FaultKind::TerminateBackends,
        FaultKind::RestartPostgres,
        FaultKind::DelayNetwork,
        FaultKind::CutNetwork,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillInstance => "kill-instance",
            FaultKind::PauseInstance => "pause-instance",
            FaultKind::RestartRedis => "restart-redis",
            FaultKind::FenceBack => "fence-back",
            FaultKind::TerminateBackends => "terminate-backends",
            FaultKind::RestartPostgres => "restart-postgres",
            FaultKind::DelayNetwork => "delay-network",
            FaultKind::CutNetwork => "cut-network",
        }
    }

    /// Whether the fault is done to one instance (the others go on as before).
    pub fn targets_an_instance(self) -> bool {
        matches!(
            self,
            FaultKind::KillInstance
                | FaultKind::PauseInstance
                | FaultKind::DelayNetwork
                | FaultKind::CutNetwork
        )
    }
}

/// Which of an instance's links a network fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    Postgres,
    Redis,
    Both,
}

impl Links {
    pub fn postgres(self) -> bool {
        matches!(self, Links::Postgres | Links::Both)
    }

    pub fn redis(self) -> bool {
        matches!(self, Links::Redis | Links::Both)
    }

    pub fn name(self) -> &'static str {
        match self {
            Links::Postgres => "PostgreSQL",
            Links::Redis => "Redis",
            Links::Both => "PostgreSQL and Redis",
        }
    }
}

/// One fault and its parameters. Every parameter is drawn for every fault, whatever its
/// kind, so that the draws stay in step; a kind uses those it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Its place in the schedule, from 1.
    pub index: usize,
    pub kind: FaultKind,
    /// The instance it hits (instance kinds only).
    pub instance: usize,
    /// The links a network fault hits.
    pub links: Links,
    /// Latency added each way by `DelayNetwork`.
    pub delay: Duration,
    /// How long the fault lasts before it is healed (each kind scales it: see the nemesis).
    pub lasts: Duration,
}

/// The shortest and longest latency a network delay adds, each way.
pub const DELAY_MS: std::ops::RangeInclusive<u64> = 50..=400;
/// The shortest and longest a fault lasts.
pub const LASTS_MS: std::ops::RangeInclusive<u64> = 1_000..=3_000;

/// An endless, seeded sequence of faults.
pub struct Schedule {
    rng: ChaCha8Rng,
    instances: usize,
    /// The kinds still to come in the first round (every kind once), last first.
    first_round: Vec<FaultKind>,
    drawn: usize,
}

impl Schedule {
    /// The schedule of `seed` for a cluster of `instances` (at least 1).
    pub fn new(seed: u64, instances: usize) -> Self {
        // ChaCha8 is specified, unlike `StdRng`, whose algorithm may change between rand
        // releases: a seed keeps its schedule across versions of this tool.
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut first_round = FaultKind::ALL.to_vec();
        first_round.shuffle(&mut rng);
        first_round.reverse();
        Self {
            rng,
            instances: instances.max(1),
            first_round,
            drawn: 0,
        }
    }
}

impl Iterator for Schedule {
    type Item = Fault;

    fn next(&mut self) -> Option<Fault> {
        let drawn_kind = FaultKind::ALL[self.rng.random_range(0..FaultKind::ALL.len())];
        let kind = self.first_round.pop().unwrap_or(drawn_kind);
        let instance = self.rng.random_range(0..self.instances);
        let links = [Links::Postgres, Links::Redis, Links::Both][self.rng.random_range(0..3)];
        let delay = Duration::from_millis(self.rng.random_range(DELAY_MS));
        let lasts = Duration::from_millis(self.rng.random_range(LASTS_MS));
        self.drawn += 1;
        Some(Fault {
            index: self.drawn,
            kind,
            instance,
            links,
            delay,
            lasts,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_faults_and_another_seed_others() {
        let a: Vec<Fault> = Schedule::new(42, 3).take(50).collect();
        let b: Vec<Fault> = Schedule::new(42, 3).take(50).collect();
        let c: Vec<Fault> = Schedule::new(43, 3).take(50).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_first_faults_are_every_kind_once() {
        for seed in 0..100 {
            let first: BTreeSet<FaultKind> =
                Schedule::new(seed, 3).take(8).map(|f| f.kind).collect();
            assert_eq!(first.len(), FaultKind::ALL.len(), "seed {seed}");
        }
    }

    #[test]
    fn parameters_stay_in_their_ranges_and_every_instance_is_hit() {
        let faults: Vec<Fault> = Schedule::new(7, 3).take(300).collect();
        assert!(faults.iter().all(|f| f.instance < 3
            && DELAY_MS.contains(&(f.delay.as_millis() as u64))
            && LASTS_MS.contains(&(f.lasts.as_millis() as u64))));
        let instances: BTreeSet<usize> = faults.iter().map(|f| f.instance).collect();
        assert_eq!(instances.len(), 3);
        let kinds: BTreeSet<FaultKind> = faults[8..].iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds.len(),
            8,
            "after the first round, every kind is still drawn"
        );
        assert_eq!(
            faults.iter().map(|f| f.index).collect::<Vec<_>>(),
            (1..=300).collect::<Vec<_>>()
        );
    }
}
