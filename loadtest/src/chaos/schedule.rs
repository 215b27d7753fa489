//! The fault schedule: which fault comes next, drawn from a seeded generator and from nothing
//! else, so that a seed replays the same faults in the same order with the same parameters
//! however long each one takes to inject and heal.
//!
//! Only the kinds that apply to the soak's locks are drawn ([`FaultKind::applicable`]):
//! the first faults are each of them once, in an order shuffled by the seed, so a soak that
//! lasts long enough for that many faults has run every one. After them each is drawn at
//! random.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use seckill::LockStrategy;

/// What the nemesis does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL an instance, then start it again.
    KillInstance,
    /// SIGSTOP an instance for longer than its lock's lease, then SIGCONT.
    PauseInstance,
    /// Restart Redis empty (it keeps nothing on disk): every lock and fence counter is gone.
    /// Behind Sentinel, the primary, at once: it stays the primary, and the replica
    /// resynchronises from it empty.
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
    /// SIGKILL a member of the lock's ensemble (ZooKeeper, etcd: the leader or another;
    /// Redlock: a master; Sentinel: the primary, failed over, or the replica), then start it
    /// again (on its data; a Redis node empty).
    KillMember,
    /// SIGSTOP a member of the lock's ensemble for longer than a session or lease, then
    /// SIGCONT (a Sentinel-watched primary is failed over meanwhile). Behind Sentinel, the
    /// replica is stopped so that it misses writes, and then promoted: the primary is
    /// killed.
    PauseMember,
    /// With the `ha` database: SIGKILL the primary (Patroni and PostgreSQL, as a machine
    /// that dies); its synchronous standby is promoted; then start it again (it rejoins as
    /// a standby, rewound).
    KillPrimary,
    /// With the `ha` database: SIGSTOP the primary (Patroni and PostgreSQL) past Patroni's
    /// lease, so that a standby is promoted meanwhile, then SIGCONT (Patroni demotes it).
    PausePrimary,
    /// With the `ha` database: SIGKILL the synchronous standby (commits wait until Patroni
    /// names the other standby), then start it again.
    KillStandby,
}

impl FaultKind {
    pub const ALL: [FaultKind; 13] = [
        FaultKind::KillInstance,
        FaultKind::PauseInstance,
        FaultKind::RestartRedis,
        FaultKind::FenceBack,
        FaultKind::TerminateBackends,
        FaultKind::RestartPostgres,
        FaultKind::DelayNetwork,
        FaultKind::CutNetwork,
        FaultKind::KillMember,
        FaultKind::PauseMember,
        FaultKind::KillPrimary,
        FaultKind::PausePrimary,
        FaultKind::KillStandby,
    ];

    /// The kinds that do something under `strategy` (with `sentinel`: `redis` behind
    /// Sentinel), in [`ALL`](Self::ALL)'s order. Most hit what every strategy uses (the
    /// instances, PostgreSQL, and Redis, which carries restock news under all of them);
    /// `fence-back` rewrites a Redis lock's keys, which only `redis` and `redlock` have;
    /// the member kinds hit the ensemble that only `zookeeper`, `etcd`, `redlock` and
    /// Sentinel lock in ([`Ensemble::of`]). With the `ha` database (`ha`), the primary and
    /// standby kinds replace `restart-postgres` (Patroni, not the soak, restarts its members).
    pub fn applicable(strategy: LockStrategy, sentinel: bool, ha: bool) -> Vec<FaultKind> {
        let has_members = Ensemble::of(strategy, sentinel).is_some();
        Self::ALL
            .into_iter()
            .filter(|kind| match kind {
                FaultKind::FenceBack => {
                    matches!(strategy, LockStrategy::Redis | LockStrategy::Redlock)
                }
                FaultKind::KillMember | FaultKind::PauseMember => has_members,
                FaultKind::RestartPostgres => !ha,
                FaultKind::KillPrimary | FaultKind::PausePrimary | FaultKind::KillStandby => ha,
                _ => true,
            })
            .collect()
    }

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
            FaultKind::KillMember => "kill-member",
            FaultKind::PauseMember => "pause-member",
            FaultKind::KillPrimary => "kill-primary",
            FaultKind::PausePrimary => "pause-primary",
            FaultKind::KillStandby => "kill-standby",
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

/// The lock's own servers, which the soak starts and the member kinds fault, as far as the
/// schedule draws among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ensemble {
    pub members: usize,
    pub kind: EnsembleKind,
}

/// How an ensemble's members stand to each other, which decides how a fault picks one and
/// whether an instance's links to them can be faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsembleKind {
    /// Members that elect a leader (ZooKeeper, etcd), each reached by each instance through
    /// a proxy of its own. A fault picks "the leader" or a member by number.
    Electing,
    /// Masters that stand each alone (Redlock), each reached through a proxy. A fault
    /// picks one by number.
    Masters,
    /// A primary and a replica (Redis behind Sentinel), reached directly: the Sentinels
    /// hand out the nodes' own addresses, so an instance's links to them pass through no
    /// proxy, and a network fault hits its PostgreSQL link. A fault picks a role, the
    /// primary or the replica: what it does depends on the role, and which node has which
    /// depends on the failovers before it, so a number would not replay.
    PrimaryAndReplica,
}

impl Ensemble {
    /// The ensemble `strategy` locks in, if any (`sentinel`: `redis` behind Sentinel):
    /// three members, the fewest that go on when one is lost; behind Sentinel a primary and
    /// a replica (and three Sentinels, which the nemesis leaves alone).
    pub fn of(strategy: LockStrategy, sentinel: bool) -> Option<Self> {
        let (members, kind) = match strategy {
            LockStrategy::ZooKeeper | LockStrategy::Etcd => (3, EnsembleKind::Electing),
            LockStrategy::Redlock => (3, EnsembleKind::Masters),
            LockStrategy::Redis if sentinel => (2, EnsembleKind::PrimaryAndReplica),
            _ => return None,
        };
        Some(Self { members, kind })
    }

    /// Whether each instance reaches the members through proxies of its own, so that its
    /// links to them can be cut or slowed.
    pub fn proxied(self) -> bool {
        self.kind != EnsembleKind::PrimaryAndReplica
    }
}

/// Which of an instance's links a network fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    Postgres,
    Redis,
    /// PostgreSQL and Redis.
    Both,
    /// Its links to the lock's ensemble (drawn only when there is one, reached through
    /// proxies): to every member of an ensemble that elects a leader, to the fault's member
    /// among Redlock's masters.
    Members,
}

impl Links {
    pub fn postgres(self) -> bool {
        matches!(self, Links::Postgres | Links::Both)
    }

    pub fn redis(self) -> bool {
        matches!(self, Links::Redis | Links::Both)
    }

    pub fn members(self) -> bool {
        self == Links::Members
    }

    pub fn name(self) -> &'static str {
        match self {
            Links::Postgres => "PostgreSQL",
            Links::Redis => "Redis",
            Links::Both => "PostgreSQL and Redis",
            Links::Members => "lock servers",
        }
    }
}

/// Which member of the lock's ensemble a member fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberPick {
    /// The one that leads when the fault starts (so a seed replays "the leader", whichever
    /// member that is then); behind Sentinel, the primary.
    Leader,
    /// Behind Sentinel, the replica when the fault starts.
    Replica,
    /// This one, whatever its role.
    Index(usize),
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
    /// The member a member fault hits (member kinds only).
    pub member: MemberPick,
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
    /// The lock's ensemble, if it has one.
    ensemble: Option<Ensemble>,
    /// The kinds drawn.
    kinds: Vec<FaultKind>,
    /// The kinds still to come in the first round (every kind once), last first.
    first_round: Vec<FaultKind>,
    drawn: usize,
}

impl Schedule {
    /// The schedule of `seed` for a cluster of `instances` (at least 1) and the lock's
    /// `ensemble` ([`Ensemble::of`]), drawing from `kinds` (at least one;
    /// [`FaultKind::applicable`]). Without an ensemble, a seed gives the schedule it gave
    /// before ensembles were faulted, for the same kinds.
    ///
    /// # Panics
    /// If `kinds` is empty.
    pub fn new(
        seed: u64,
        instances: usize,
        ensemble: Option<Ensemble>,
        kinds: &[FaultKind],
    ) -> Self {
        assert!(!kinds.is_empty(), "a schedule draws from at least one kind");
        // ChaCha8 is specified, unlike `StdRng`, whose algorithm may change between rand
        // releases: a seed keeps its schedule across versions of this tool for the same
        // kinds (a strategy that lost a kind draws another schedule). The schedule is
        // stream 0 of the seed; the buyers' choices are other streams (`load.rs`).
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut first_round = kinds.to_vec();
        first_round.shuffle(&mut rng);
        first_round.reverse();
        Self {
            rng,
            instances: instances.max(1),
            ensemble,
            kinds: kinds.to_vec(),
            first_round,
            drawn: 0,
        }
    }
}

impl Iterator for Schedule {
    type Item = Fault;

    fn next(&mut self) -> Option<Fault> {
        let drawn_kind = self.kinds[self.rng.random_range(0..self.kinds.len())];
        let kind = self.first_round.pop().unwrap_or(drawn_kind);
        let instance = self.rng.random_range(0..self.instances);
        let links = match self.ensemble {
            None => [Links::Postgres, Links::Redis, Links::Both][self.rng.random_range(0..3)],
            Some(ensemble) if ensemble.proxied() => {
                [Links::Postgres, Links::Redis, Links::Both, Links::Members]
                    [self.rng.random_range(0..4)]
            }
            // Behind Sentinel the instances reach Redis directly: only their PostgreSQL
            // link passes through a proxy.
            Some(_) => Links::Postgres,
        };
        let delay = Duration::from_millis(self.rng.random_range(DELAY_MS));
        let lasts = Duration::from_millis(self.rng.random_range(LASTS_MS));
        // Drawn only with an ensemble, so that a schedule without one stays as it was. "The
        // leader" is one draw in n + 1 and is whichever member leads when the fault starts
        // (a seed replays "the leader", not a member number); each member by number is
        // another draw (and may be leading then too). Masters that elect none are drawn by
        // number only; a primary and its replica by role only.
        let member = match self
            .ensemble
            .map(|ensemble| (ensemble.members, ensemble.kind))
        {
            None => MemberPick::Leader,
            Some((members, EnsembleKind::Electing)) => match self.rng.random_range(0..=members) {
                i if i == members => MemberPick::Leader,
                i => MemberPick::Index(i),
            },
            Some((members, EnsembleKind::Masters)) => {
                MemberPick::Index(self.rng.random_range(0..members))
            }
            Some((_, EnsembleKind::PrimaryAndReplica)) => {
                [MemberPick::Leader, MemberPick::Replica][self.rng.random_range(0..2)]
            }
        };
        self.drawn += 1;
        Some(Fault {
            index: self.drawn,
            kind,
            instance,
            links,
            member,
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
        let a: Vec<Fault> = Schedule::new(42, 3, None, &FaultKind::ALL)
            .take(50)
            .collect();
        let b: Vec<Fault> = Schedule::new(42, 3, None, &FaultKind::ALL)
            .take(50)
            .collect();
        let c: Vec<Fault> = Schedule::new(43, 3, None, &FaultKind::ALL)
            .take(50)
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_first_faults_are_every_kind_once() {
        for seed in 0..100 {
            let first: BTreeSet<FaultKind> = Schedule::new(
                seed,
                3,
                Ensemble::of(LockStrategy::Etcd, false),
                &FaultKind::ALL,
            )
            .take(FaultKind::ALL.len())
            .map(|f| f.kind)
            .collect();
            assert_eq!(first.len(), FaultKind::ALL.len(), "seed {seed}");
        }
    }

    #[test]
    fn parameters_stay_in_their_ranges_and_every_instance_is_hit() {
        let faults: Vec<Fault> = Schedule::new(7, 3, None, &FaultKind::ALL)
            .take(300)
            .collect();
        assert!(faults.iter().all(|f| f.instance < 3
            && DELAY_MS.contains(&(f.delay.as_millis() as u64))
            && LASTS_MS.contains(&(f.lasts.as_millis() as u64))));
        let instances: BTreeSet<usize> = faults.iter().map(|f| f.instance).collect();
        assert_eq!(instances.len(), 3);
        let kinds: BTreeSet<FaultKind> = faults[FaultKind::ALL.len()..]
            .iter()
            .map(|f| f.kind)
            .collect();
        assert_eq!(
            kinds.len(),
            FaultKind::ALL.len(),
            "after the first round, every kind is still drawn"
        );
        assert_eq!(
            faults.iter().map(|f| f.index).collect::<Vec<_>>(),
            (1..=300).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_ha_database_is_failed_over_instead_of_restarted() {
        let single = FaultKind::applicable(LockStrategy::Redis, false, false);
        let ha = FaultKind::applicable(LockStrategy::Redis, false, true);
        let database_kinds = [
            FaultKind::KillPrimary,
            FaultKind::PausePrimary,
            FaultKind::KillStandby,
        ];
        assert!(single.contains(&FaultKind::RestartPostgres));
        assert!(database_kinds.iter().all(|k| !single.contains(k)));
        assert!(!ha.contains(&FaultKind::RestartPostgres));
        assert!(database_kinds.iter().all(|k| ha.contains(k)));
        assert_eq!(ha.len(), single.len() + 2);
    }

    #[test]
    fn a_fault_that_cannot_apply_to_the_strategy_is_never_drawn() {
        let under_pg_atomic = FaultKind::applicable(LockStrategy::PgAtomic, false, false);
        let faults: Vec<Fault> = Schedule::new(7, 3, None, &under_pg_atomic)
            .take(300)
            .collect();
        let drawn: BTreeSet<FaultKind> = faults.iter().map(|f| f.kind).collect();
        let first: BTreeSet<FaultKind> = faults[..7].iter().map(|f| f.kind).collect();

        assert!(!drawn.contains(&FaultKind::FenceBack));
        assert!(
            !drawn.contains(&FaultKind::KillMember) && !drawn.contains(&FaultKind::PauseMember)
        );
        assert_eq!(drawn.len(), 7, "every other kind is drawn");
        assert_eq!(first.len(), 7, "each once in the first round");
        let member_kinds = [FaultKind::KillMember, FaultKind::PauseMember];
        let under_redis = FaultKind::applicable(LockStrategy::Redis, false, false);
        assert!(!member_kinds.iter().any(|k| under_redis.contains(k)));
        assert_eq!(under_redis.len(), 8);
        for strategy in [
            LockStrategy::Redis,
            LockStrategy::PgLock,
            LockStrategy::PgRow,
            LockStrategy::None,
            LockStrategy::ZooKeeper,
            LockStrategy::Etcd,
            LockStrategy::Redlock,
        ] {
            let kinds = FaultKind::applicable(strategy, false, false);
            let redis_lock = matches!(strategy, LockStrategy::Redis | LockStrategy::Redlock);
            assert_eq!(
                kinds.contains(&FaultKind::FenceBack),
                redis_lock,
                "{strategy:?}"
            );
            assert_eq!(
                member_kinds.iter().all(|k| kinds.contains(k)),
                Ensemble::of(strategy, false).is_some(),
                "{strategy:?}"
            );
        }
    }

    #[test]
    fn a_seed_replays_the_schedule_it_drew_before_ensembles_were_faulted() {
        // As a run of seed 20261203 under `redis` printed them before the member kinds
        // existed (CI's one-minute soak, 2026-12-05).
        let kinds = FaultKind::applicable(LockStrategy::Redis, false, false);
        let faults: Vec<Fault> = Schedule::new(20261203, 3, None, &kinds).take(8).collect();
        let names: Vec<&str> = faults.iter().map(|f| f.kind.name()).collect();
        assert_eq!(
            names,
            [
                "cut-network",
                "delay-network",
                "restart-redis",
                "terminate-backends",
                "pause-instance",
                "kill-instance",
                "fence-back",
                "restart-postgres"
            ]
        );
        let ms = Duration::from_millis;
        assert_eq!(
            (faults[0].instance, faults[0].links, faults[0].lasts),
            (2, Links::Redis, ms(2781))
        );
        assert_eq!(
            (
                faults[1].instance,
                faults[1].links,
                faults[1].delay,
                faults[1].lasts
            ),
            (2, Links::Postgres, ms(286), ms(1088))
        );
        assert_eq!((faults[4].instance, faults[5].instance), (0, 0));
        assert_eq!(faults[6].lasts, ms(1527));
    }

    #[test]
    fn with_an_ensemble_every_member_the_leader_and_the_members_links_are_drawn() {
        let kinds = FaultKind::applicable(LockStrategy::Etcd, false, false);
        let faults: Vec<Fault> =
            Schedule::new(7, 3, Ensemble::of(LockStrategy::Etcd, false), &kinds)
                .take(300)
                .collect();
        let picks: BTreeSet<String> = faults.iter().map(|f| format!("{:?}", f.member)).collect();
        assert_eq!(
            picks,
            BTreeSet::from(["Index(0)", "Index(1)", "Index(2)", "Leader"].map(String::from))
        );
        assert!(faults.iter().any(|f| f.links == Links::Members));
        let without: Vec<Fault> = Schedule::new(7, 3, None, &kinds).take(300).collect();
        assert!(without.iter().all(|f| f.links != Links::Members));
        // Redlock's masters elect no leader: each is drawn by number.
        let redlock = Ensemble::of(LockStrategy::Redlock, false);
        let masters: BTreeSet<String> = Schedule::new(7, 3, redlock, &kinds)
            .take(300)
            .map(|f| format!("{:?}", f.member))
            .collect();
        assert_eq!(
            masters,
            BTreeSet::from(["Index(0)", "Index(1)", "Index(2)"].map(String::from))
        );
    }

    #[test]
    fn behind_sentinel_every_kind_is_drawn_and_network_faults_hit_the_postgres_link() {
        let kinds = FaultKind::applicable(LockStrategy::Redis, true, false);
        assert_eq!(
            kinds,
            FaultKind::ALL[..10],
            "the Sentinel set adds the member kinds (the last three are the ha database's)"
        );
        let sentinel = Ensemble::of(LockStrategy::Redis, true);
        assert_eq!(
            sentinel,
            Some(Ensemble {
                members: 2,
                kind: EnsembleKind::PrimaryAndReplica
            })
        );
        let faults: Vec<Fault> = Schedule::new(7, 3, sentinel, &kinds).take(300).collect();
        assert!(faults.iter().all(|f| f.links == Links::Postgres));
        // By role, never by number: which node is the primary depends on the failovers.
        let picks: BTreeSet<String> = faults.iter().map(|f| format!("{:?}", f.member)).collect();
        assert_eq!(
            picks,
            BTreeSet::from(["Leader", "Replica"].map(String::from))
        );
        // `--sentinel` means nothing under another strategy.
        for strategy in [LockStrategy::PgLock, LockStrategy::Etcd, LockStrategy::None] {
            assert_eq!(
                Ensemble::of(strategy, true),
                Ensemble::of(strategy, false),
                "{strategy:?}"
            );
        }
    }
}
