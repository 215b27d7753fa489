//! What the lock tests share: connections, unique keys, and one [`Harness`] per backend so
//! that the property suite (`tests/properties.rs`) is written once for all of them.

#![allow(dead_code)]

use std::time::Duration;

use distlock::{Backend, LockOptions, Locker, Redlock};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A connection to the Redis at `url` that waits up to 10 s for an answer (or a connection).
///
/// TIMING: redis-rs's own default response timeout is 500 ms, which a busy CI machine
/// spawning servers can exceed; no test here relies on a test-side connection timing out
/// (the Redlock tests bound each node with the backend's own node timeout).
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("valid redis url");
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    ConnectionManager::new_with_config(client, config)
        .await
        .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"))
}

/// A new connection to the shared test Redis.
pub async fn shared_redis() -> ConnectionManager {
    connect(&redis_url()).await
}

/// A key no other test (or earlier run) uses, and the guard that deletes what the test
/// leaves under its prefix (the fence counter, counters) when the test ends.
pub fn unique_key(test: &str) -> (String, testkit::PrefixCleanup) {
    let prefix = testkit::unique_prefix(test);
    let cleanup = testkit::PrefixCleanup::new(&redis_url(), &prefix);
    (format!("{prefix}lock"), cleanup)
}

pub fn locker<B: Backend>(backend: B, options: LockOptions) -> Locker<B> {
    Locker::new(backend, options).expect("valid options for this backend")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

pub async fn get(conn: &mut ConnectionManager, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// `DEL key`.
pub async fn del(conn: &mut ConnectionManager, key: &str) {
    redis::cmd("DEL").arg(key).exec_async(conn).await.unwrap();
}

/// `SET key value PX ttl`.
pub async fn set_px(conn: &mut ConnectionManager, key: &str, value: &str, ttl: Duration) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .exec_async(conn)
        .await
        .unwrap();
}

/// One backend under test, and what a test needs to do behind a holder's back.
pub trait Harness {
    type B: Backend + Clone;
    /// A new backend handle on the harness's store (as another process would have).
    fn backend(&self) -> impl Future<Output = Self::B>;
    /// A lock name no other test uses.
    fn key(&self, label: &str) -> String;
    /// The token of the live lock on `key`, if any.
    fn holder(&self, key: &str) -> impl Future<Output = Option<String>>;
    /// Delete the lock on `key`, as an operator (or an expiry) would.
    fn delete(&self, key: &str) -> impl Future<Output = ()>;
    /// Put `token` in the lock on `key` for `ttl`, as if its holder had just taken it.
    fn put(&self, key: &str, token: &str, ttl: Duration) -> impl Future<Output = ()>;
    /// A lease (ms) for tests that let a lock run out: short, but long enough that every
    /// call made on it gets a fair answer from this backend on a busy machine.
    fn short_ms(&self) -> u64 {
        200
    }
    /// Whether the store assigns fences itself (a ZooKeeper zxid, an etcd revision), so
    /// that no fence can be raised by a holder.
    fn fences_are_assigned(&self) -> bool {
        false
    }
    /// Check that nothing renews the lock `token` held on `key`, now that its guard is
    /// released or dropped (the lock itself is gone). By default: put it back, with a lease
    /// that a watchdog still running would renew in time, and see it expire.
    fn assert_nothing_renews(
        &self,
        key: &str,
        token: &str,
        renew_every: Duration,
    ) -> impl Future<Output = ()>
    where
        Self: Sized,
    {
        put_back_and_see_it_expire(self, key, token, renew_every)
    }
}

/// Wait (up to 10 s) until `key` has no live lock; `why` names what should have freed it.
///
/// TIMING: 10 s covers a background release on a busy machine; the leases of the locks
/// waited for are longer (30 s or more), so only that release can free them in time.
pub async fn wait_until_free<H: Harness>(h: &H, key: &str, why: &str) {
    let free = async {
        while h.holder(key).await.is_some() {
            tokio::time::sleep(ms(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), free)
        .await
        .unwrap_or_else(|_| panic!("{why}"));
}

/// Check that nothing renews the lock `token` held on `key` once its guard is gone
/// ([`Harness::assert_nothing_renews`]).
pub async fn assert_nothing_renews<H: Harness>(
    h: &H,
    key: &str,
    token: &str,
    renew_every: Duration,
) {
    h.assert_nothing_renews(key, token, renew_every).await;
}

/// Put `token` back in `key` and check that nothing renews it. The lease put back outlasts
/// two renewal periods of the watchdog that held it, so a watchdog still running for that
/// token would certainly renew it in time and keep it alive; a stopped one lets it expire.
async fn put_back_and_see_it_expire<H: Harness>(
    h: &H,
    key: &str,
    token: &str,
    renew_every: Duration,
) {
    // TIMING: etcd ends a lease only at an expiry run (every half second), and not below its
    // shortest lease: the harness's short lease, waited out twice over, and a second more
    // for a busy machine.
    let lease = (renew_every * 2 + ms(200)).max(ms(h.short_ms()));
    h.put(key, token, lease).await;
    tokio::time::sleep(lease + lease.max(ms(800)) + ms(1_000)).await;
    assert_eq!(h.holder(key).await, None, "something renewed the old token");
}

/// The shared Redis, under a prefix of the test's own.
pub struct RedisHarness {
    prefix: String,
    conn: ConnectionManager,
    _cleanup: testkit::PrefixCleanup,
}

impl RedisHarness {
    pub async fn new(test: &str) -> Self {
        let prefix = testkit::unique_prefix(test);
        Self {
            _cleanup: testkit::PrefixCleanup::new(&redis_url(), &prefix),
            prefix,
            conn: shared_redis().await,
        }
    }
}

impl Harness for RedisHarness {
    type B = ConnectionManager;

    async fn backend(&self) -> ConnectionManager {
        shared_redis().await
    }

    fn key(&self, label: &str) -> String {
        format!("{}{label}", self.prefix)
    }

    async fn holder(&self, key: &str) -> Option<String> {
        get(&mut self.conn.clone(), key).await
    }

    async fn delete(&self, key: &str) {
        del(&mut self.conn.clone(), key).await;
    }

    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        set_px(&mut self.conn.clone(), key, token, ttl).await;
    }
}

/// Three private masters, locked with Redlock.
pub struct RedlockHarness {
    servers: Vec<testkit::RedisServer>,
    conns: Vec<ConnectionManager>,
}

impl RedlockHarness {
    pub async fn start(n: usize) -> Self {
        let servers: Vec<testkit::RedisServer> =
            (0..n).map(|_| testkit::RedisServer::start()).collect();
        let mut conns = Vec::new();
        for server in &servers {
            conns.push(connect(&server.url()).await);
        }
        Self { servers, conns }
    }

    pub fn servers(&mut self) -> &mut [testkit::RedisServer] {
        &mut self.servers
    }

    pub fn conns(&self) -> &[ConnectionManager] {
        &self.conns
    }
}

impl Harness for RedlockHarness {
    type B = Redlock<ConnectionManager>;

    async fn backend(&self) -> Redlock<ConnectionManager> {
        let mut conns = Vec::new();
        for server in &self.servers {
            conns.push(connect(&server.url()).await);
        }
        Redlock::new(conns).unwrap()
    }

    fn key(&self, label: &str) -> String {
        label.to_owned()
    }

    /// The token a majority of the masters hold.
    async fn holder(&self, key: &str) -> Option<String> {
        let mut tokens = Vec::new();
        for conn in &self.conns {
            tokens.push(get(&mut conn.clone(), key).await);
        }
        let majority = self.conns.len() / 2 + 1;
        tokens
            .iter()
            .flatten()
            .find(|t| tokens.iter().filter(|o| o.as_ref() == Some(*t)).count() >= majority)
            .cloned()
    }

    async fn delete(&self, key: &str) {
        for conn in &self.conns {
            redis::cmd("DEL")
                .arg(key)
                .exec_async(&mut conn.clone())
                .await
                .unwrap();
        }
    }

    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        for conn in &self.conns {
            redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .exec_async(&mut conn.clone())
                .await
                .unwrap();
        }
    }

    /// TIMING: Redlock bounds each node's answer by a tenth of the lease (at least 5 ms,
    /// `Redlock::node_timeout`): 200 ms of a 2 s lease, where a 200 ms lease would leave
    /// 20 ms, and a busy machine makes that a `NoQuorum` or a wrong `Held`.
    fn short_ms(&self) -> u64 {
        2_000
    }
}

/// Redis behind three Sentinels (a primary and one replica, private processes), locked
/// through a [`distlock::SentinelConnection`].
#[cfg(feature = "sentinel")]
pub struct SentinelHarness {
    pub set: testkit::RedisSentinels,
    /// A plain connection to the primary, for what the tests do behind a holder's back.
    primary: ConnectionManager,
}

#[cfg(feature = "sentinel")]
impl SentinelHarness {
    /// For tests in which the primary stays up.
    ///
    /// TIMING: Sentinels that wait 5 s before they call a primary down, so that a primary
    /// slow to answer their pings on a busy machine is not failed over in the middle of a
    /// test that expects none.
    pub async fn start() -> Self {
        Self::start_with_down_after(Duration::from_secs(5)).await
    }

    /// For failover tests: Sentinels that fail the primary over after
    /// [`testkit::RedisSentinels::DOWN_AFTER`] (1 s) without an answer.
    pub async fn start_for_failover() -> Self {
        Self::start_with_down_after(testkit::RedisSentinels::DOWN_AFTER).await
    }

    async fn start_with_down_after(down_after: Duration) -> Self {
        let mut set = testkit::RedisSentinels::start_with_down_after(1, down_after);
        let index = set.primary();
        let primary = connect(&set.nodes()[index].url()).await;
        Self { set, primary }
    }

    /// A Sentinel connection, as a process of the service would make it.
    pub async fn sentinel_connection(&self) -> distlock::SentinelConnection {
        distlock::SentinelConnection::builder(
            self.set.sentinel_urls(),
            testkit::RedisSentinels::MASTER,
        )
        .unwrap()
        .check_every(ms(200))
        .connect()
        .await
        .expect("a primary through the Sentinels")
    }
}

#[cfg(feature = "sentinel")]
impl Harness for SentinelHarness {
    type B = distlock::SentinelConnection;

    async fn backend(&self) -> distlock::SentinelConnection {
        self.sentinel_connection().await
    }

    fn key(&self, label: &str) -> String {
        label.to_owned()
    }

    async fn holder(&self, key: &str) -> Option<String> {
        get(&mut self.primary.clone(), key).await
    }

    async fn delete(&self, key: &str) {
        del(&mut self.primary.clone(), key).await;
    }

    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        set_px(&mut self.primary.clone(), key, token, ttl).await;
    }
}

/// The PostgreSQL lock table, in the test's own database (`#[sqlx::test]`).
#[cfg(feature = "postgres")]
pub struct PgHarness {
    pool: sqlx::PgPool,
}

#[cfg(feature = "postgres")]
impl PgHarness {
    pub async fn new(pool: sqlx::PgPool) -> Self {
        distlock::PgLockTable::new(pool.clone())
            .install()
            .await
            .expect("the lock tables install");
        Self { pool }
    }
}

#[cfg(feature = "postgres")]
impl Harness for PgHarness {
    type B = distlock::PgLockTable;

    async fn backend(&self) -> distlock::PgLockTable {
        distlock::PgLockTable::new(self.pool.clone())
    }

    fn key(&self, label: &str) -> String {
        label.to_owned()
    }

    async fn holder(&self, key: &str) -> Option<String> {
        sqlx::query_scalar(
            "SELECT token FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp()",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .unwrap()
    }

    async fn delete(&self, key: &str) {
        sqlx::query("DELETE FROM distlock_locks WHERE name = $1")
            .bind(key)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        sqlx::query(
            "INSERT INTO distlock_locks (name, token, fence, expires_at)
             VALUES ($1, $2, 1, clock_timestamp() + $3 * interval '1 millisecond')
             ON CONFLICT (name) DO UPDATE SET token = $2, expires_at = EXCLUDED.expires_at",
        )
        .bind(key)
        .bind(token)
        .bind(ttl.as_millis() as i64)
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// A private ZooKeeper server for one test; every `backend()` is a session of its own.
#[cfg(feature = "zookeeper")]
pub struct ZkHarness {
    server: testkit::ZooKeeperServer,
    /// The harness's own session, for what tests do behind a holder's back.
    client: zookeeper_client::Client,
}

/// The session timeout of the suite's sessions: at least twice any ttl the suite asks for (a
/// ttl may be at most half of it), so that no session ends during a test: a lock the suite lets run
/// out is deleted by the backend's reaper when its lease ends, as a lease ends on Redis.
#[cfg(feature = "zookeeper")]
pub const ZK_SESSION: Duration = Duration::from_secs(120);

#[cfg(feature = "zookeeper")]
impl ZkHarness {
    pub async fn start() -> Self {
        let server = tokio::task::spawn_blocking(|| {
            testkit::ZooKeeperServer::start_with_max_session_timeout(ZK_SESSION)
        })
        .await
        .unwrap();
        let client = zookeeper_client::Client::connect(&server.connect_string())
            .await
            .expect("a session on the private ZooKeeper");
        Self { server, client }
    }

    pub fn server(&mut self) -> &mut testkit::ZooKeeperServer {
        &mut self.server
    }

    pub fn connect_string(&self) -> String {
        self.server.connect_string()
    }

    fn lock_node(key: &str) -> String {
        format!("{}/{key}", distlock::zookeeper::DEFAULT_ROOT)
    }

    /// The lock's contender nodes, lowest sequence first.
    async fn line(&self, key: &str) -> Vec<String> {
        let mut children = match self.client.list_children(&Self::lock_node(key)).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(error) => panic!("listing {key}: {error}"),
        };
        children.sort_by_key(|name| name.rsplit_once('-').map(|(_, seq)| seq.to_owned()));
        children
    }
}

#[cfg(feature = "zookeeper")]
impl Harness for ZkHarness {
    type B = distlock::ZkLock;

    async fn backend(&self) -> distlock::ZkLock {
        distlock::ZkLock::builder(self.server.connect_string())
            .session_timeout(ZK_SESSION)
            .connect()
            .await
            .expect("a session on the private ZooKeeper")
    }

    fn key(&self, label: &str) -> String {
        label.to_owned()
    }

    async fn holder(&self, key: &str) -> Option<String> {
        let head = self.line(key).await.into_iter().next()?;
        Some(
            head.rsplit_once('-')
                .expect("a contender node")
                .0
                .to_owned(),
        )
    }

    /// The head of the line goes, and the lock node with it if nobody else is in line (so
    /// that the next holder's node is made under a new lock node, whose sequence starts over).
    async fn delete(&self, key: &str) {
        if let Some(head) = self.line(key).await.first() {
            let path = format!("{}/{head}", Self::lock_node(key));
            match self.client.delete(&path, None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                Err(error) => panic!("deleting {path}: {error}"),
            }
        }
        match self.client.delete(&Self::lock_node(key), None).await {
            Ok(())
            | Err(zookeeper_client::Error::NoNode)
            | Err(zookeeper_client::Error::NotEmpty) => {}
            Err(error) => panic!("deleting the lock node of {key}: {error}"),
        }
    }

    /// Every contender node goes (as a `SET` overwrites a Redis lock), and a node for
    /// `token` heads the line, in a session that nothing keeps alive: it expires after
    /// `ttl` (the server's tick bounds how exactly).
    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        for name in self.line(key).await {
            let _ = self
                .client
                .delete(&format!("{}/{name}", Self::lock_node(key)), None)
                .await;
        }
        let holder = zookeeper_client::Client::connector()
            .with_session_timeout(ttl)
            .with_detached()
            .connect(&self.server.connect_string())
            .await
            .expect("a session for the put holder");
        let container =
            zookeeper_client::CreateMode::Container.with_acls(zookeeper_client::Acls::anyone_all());
        holder
            .mkdir(&Self::lock_node(key), &container)
            .await
            .expect("the lock node");
        let node = zookeeper_client::CreateMode::EphemeralSequential
            .with_acls(zookeeper_client::Acls::anyone_all());
        holder
            .create(&format!("{}/{token}-", Self::lock_node(key)), b"", &node)
            .await
            .expect("the put holder's node");
        drop(holder); // detached: no heartbeats, no close; the session times out
    }

    fn short_ms(&self) -> u64 {
        // The shortest session the private server grants (two ticks), for the put
        // holder's session; a holder's own lease that runs out is ended by the backend's
        // reaper, which needs no server timing.
        testkit::zookeeper::MIN_SESSION_TIMEOUT.as_millis() as u64
    }

    fn fences_are_assigned(&self) -> bool {
        true
    }

    /// A ZooKeeper renewal is a write (a transaction that checks the holder's node, sent
    /// through the leader), but it proves only a node of the renewing session's own: a node
    /// put back on another session is never kept alive by it, so the default check would
    /// pass whatever the watchdog did. What a watchdog still running does do is write: it
    /// finds the token's node put back and sends its check. Nothing else writes to this
    /// private server meanwhile (no test step runs, the put-back node's session lives on for
    /// its lease, and empty lock nodes are not reaped during a test), so no transaction may
    /// happen while the put-back node lives, at least two renewal periods.
    async fn assert_nothing_renews(&self, key: &str, token: &str, renew_every: Duration) {
        let lease = (renew_every * 2 + ms(400)).max(ms(self.short_ms()));
        self.put(key, token, lease).await;
        let port = self.server.port();
        let zxid = || {
            tokio::task::spawn_blocking(move || {
                testkit::zookeeper::last_zxid(port).expect("the server's last zxid")
            })
        };
        let before = zxid().await.unwrap();
        // TIMING: the put-back node's session ends no sooner than its lease.
        tokio::time::sleep(lease * 3 / 4).await;
        let after = zxid().await.unwrap();
        assert_eq!(
            after, before,
            "something wrote to ZooKeeper (a renewal?) after the release"
        );
    }
}

/// A private etcd member for one test; every `backend()` is a client of its own.
#[cfg(feature = "etcd")]
pub struct EtcdHarness {
    server: testkit::EtcdServer,
    client: etcd_client::Client,
}

#[cfg(feature = "etcd")]
impl EtcdHarness {
    pub async fn start() -> Self {
        let server = tokio::task::spawn_blocking(testkit::EtcdServer::start)
            .await
            .unwrap();
        let client = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .expect("a client of the private etcd");
        Self { server, client }
    }

    pub fn server(&mut self) -> &mut testkit::EtcdServer {
        &mut self.server
    }

    fn line_prefix(key: &str) -> String {
        format!("{}{key}/", distlock::etcd::DEFAULT_PREFIX)
    }

    /// The lock's contender keys, first created first.
    async fn line(&self, key: &str) -> Vec<etcd_client::KeyValue> {
        let options = etcd_client::GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        self.client
            .clone()
            .get(Self::line_prefix(key), Some(options))
            .await
            .expect("reading the line")
            .take_kvs()
    }
}

#[cfg(feature = "etcd")]
impl Harness for EtcdHarness {
    type B = distlock::EtcdLock;

    async fn backend(&self) -> distlock::EtcdLock {
        distlock::EtcdLock::connect([self.server.endpoint()])
            .await
            .expect("a client of the private etcd")
    }

    fn key(&self, label: &str) -> String {
        label.to_owned()
    }

    async fn holder(&self, key: &str) -> Option<String> {
        let head = self.line(key).await.into_iter().next()?;
        let name = head.key_str().expect("a UTF-8 key");
        Some(
            name.strip_prefix(&Self::line_prefix(key))
                .unwrap()
                .to_owned(),
        )
    }

    async fn delete(&self, key: &str) {
        if let Some(head) = self.line(key).await.first() {
            self.client
                .clone()
                .delete(head.key().to_vec(), None)
                .await
                .expect("deleting the head");
        }
    }

    /// Every contender key goes (as a `SET` overwrites a Redis lock), and a key for `token`
    /// on a lease of `ttl` (in whole seconds) heads the line.
    async fn put(&self, key: &str, token: &str, ttl: Duration) {
        let mut client = self.client.clone();
        client
            .delete(
                Self::line_prefix(key),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("clearing the line");
        let seconds = ttl.as_millis().div_ceil(1000).max(1) as i64;
        let lease = client
            .lease_grant(seconds, None)
            .await
            .expect("a lease")
            .id();
        client
            .put(
                format!("{}{token}", Self::line_prefix(key)),
                "",
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await
            .expect("the put holder's key");
    }

    fn short_ms(&self) -> u64 {
        // etcd counts leases in whole seconds and grants none shorter than its minimum
        // (1.5 election timeouts, rounded up: 2 s with the defaults), and its expiry runs
        // every 500 ms: a 2 s lease is the shortest whose end tests can wait out fairly.
        2_000
    }

    fn fences_are_assigned(&self) -> bool {
        true
    }
}

// What the fault tests (`tests/zookeeper.rs`, `tests/etcd.rs`) share.

/// `future`, or a panic naming `what` once `within` has passed: a fault test that would
/// otherwise hang fails with what it was waiting for.
pub async fn within<T>(bound: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {bound:?}"))
}

/// When `guard` was told that its lock is lost, and why: a task that watches `lost()` from
/// now on, so that the instant is taken when the signal comes, not when the test looks.
pub fn when_told<B: Backend>(
    guard: &distlock::LockGuard<B>,
) -> tokio::task::JoinHandle<(distlock::LockLost, tokio::time::Instant)> {
    let lost = guard.lost();
    tokio::spawn(async move {
        let why = lost.await;
        (why, tokio::time::Instant::now())
    })
}

/// What [`keep_acquiring`] got: the guard, when, what the old holder's guard said then,
/// and the errors on the way.
pub struct Taken<B: Backend> {
    pub guard: distlock::LockGuard<B>,
    pub at: tokio::time::Instant,
    /// What the old holder's `lost()` said the moment the guard was in hand: `None` if it
    /// still believed it held the lock.
    pub old_holder_told: Option<distlock::LockLost>,
    pub errors: Vec<String>,
}

/// Another process that wants `key` all along: it calls `acquire` again after every error
/// (a server that is down, a session that ended) until it has the lock. `old_holder` is
/// the `lost()` of the guard it takes the lock from, looked at once, right after the
/// acquisition: it resolves at once if that guard already knows its lease is over (it
/// compares the lease's deadline with the clock), whatever the scheduler did meanwhile.
pub fn keep_acquiring<B: Backend>(
    locker: Locker<B>,
    key: &str,
    old_holder: impl Future<Output = distlock::LockLost> + Send + 'static,
) -> tokio::task::JoinHandle<Taken<B>> {
    use futures::FutureExt;
    let key = key.to_owned();
    tokio::spawn(async move {
        let mut errors = Vec::new();
        loop {
            match locker.acquire(&key).await {
                Ok(guard) => {
                    return Taken {
                        guard,
                        at: tokio::time::Instant::now(),
                        old_holder_told: old_holder.now_or_never(),
                        errors,
                    };
                }
                Err(error) => {
                    errors.push(error.to_string());
                    tokio::time::sleep(ms(100)).await;
                }
            }
        }
    })
}

/// What a fault test asserts once B has the lock A held: A was told, `Unreachable`, within
/// `told_within` of the fault (`at`, named `what`) and before B got the lock, and B's fence is
/// larger. Answers B's guard.
pub fn told_first<B: Backend>(
    held: &distlock::LockGuard<B>,
    (why, told_at): (distlock::LockLost, tokio::time::Instant),
    (at, what): (tokio::time::Instant, &str),
    told_within: Duration,
    taken: Taken<B>,
) -> distlock::LockGuard<B> {
    let told_after = told_at.duration_since(at);
    println!(
        "after the {what}: A told at {told_after:?}, B got the lock at {:?}",
        taken.at.duration_since(at)
    );
    assert!(
        told_after <= told_within,
        "told {told_after:?} after the {what}"
    );
    assert_eq!(why, distlock::LockLost::Unreachable);
    assert!(!held.is_held());
    assert_eq!(
        taken.old_holder_told,
        Some(distlock::LockLost::Unreachable),
        "B got the lock while A's guard still said it held it"
    );
    let b_guard = taken.guard;
    assert!(b_guard.fence() > held.fence());
    b_guard
}

/// [`told_first`] for a holder A cut off from its store while B waited in line: B's wait also
/// met no error, and `store` takes B's write and then refuses A's.
pub fn told_first_and_fenced_off<B: Backend>(
    held: &distlock::LockGuard<B>,
    told: (distlock::LockLost, tokio::time::Instant),
    cut: tokio::time::Instant,
    told_within: Duration,
    taken: Taken<B>,
    store: &FencedStore,
) -> distlock::LockGuard<B> {
    assert!(
        taken.errors.is_empty(),
        "B's wait in line failed: {:?}",
        taken.errors
    );
    let b_guard = told_first(held, told, (cut, "cut"), told_within, taken);
    assert!(store.write(b_guard.fence(), "B"));
    assert!(
        !store.write(held.fence(), "A"),
        "the cut-off holder's write was accepted"
    );
    assert_eq!(store.writer().as_deref(), Some("B"));
    b_guard
}

/// A and B (two processes) take the lock on `key` five times each, waiting for each other,
/// with a short piece of work under it: never two holders at once, both get their five, and
/// every hold comes with a larger fence than the one before.
pub async fn five_turns_each<B: Backend>(a: Locker<B>, b: Locker<B>, key: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let inside = Arc::new(AtomicBool::new(false));
    let holds: Arc<Mutex<Vec<(&str, distlock::Fence)>>> = Arc::default();
    let take_turns = |name: &'static str, locker: Locker<B>| {
        let (inside, holds, key) = (Arc::clone(&inside), Arc::clone(&holds), key.to_owned());
        tokio::spawn(async move {
            for _ in 0..5 {
                let guard = locker.acquire(&key).await.unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                holds.lock().unwrap().push((name, guard.fence()));
                tokio::time::sleep(ms(50)).await;
                inside.store(false, Ordering::SeqCst);
                assert!(guard.release().await.unwrap().was_held());
            }
        })
    };
    let turns = [take_turns("A", a), take_turns("B", b)];
    for turn in turns {
        within(Duration::from_secs(60), "five turns each", turn)
            .await
            .unwrap();
    }
    let holds = holds.lock().unwrap().clone();
    println!("holds in order: {holds:?}");
    assert_eq!(holds.len(), 10);
    assert_eq!(holds.iter().filter(|(name, _)| *name == "A").count(), 5);
    assert!(
        holds.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "fences out of order: {holds:?}"
    );
}

/// A cluster of three members (etcd's or ZooKeeper's) that a fault test kills and restarts
/// members of.
pub trait ThreeMembers: Send + 'static {
    /// The member that leads now, if one does.
    fn leader(&self) -> Option<usize>;
    /// Kill member `i` (SIGKILL).
    fn kill(&mut self, i: usize);
    /// Start member `i` again, with its data.
    fn restart(&mut self, i: usize);
}

impl ThreeMembers for testkit::EtcdCluster {
    fn leader(&self) -> Option<usize> {
        testkit::EtcdCluster::leader(self)
    }
    fn kill(&mut self, i: usize) {
        testkit::EtcdCluster::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        testkit::EtcdCluster::restart(self, i);
    }
}

impl ThreeMembers for testkit::ZooKeeperEnsemble {
    fn leader(&self) -> Option<usize> {
        testkit::ZooKeeperEnsemble::leader(self)
    }
    fn kill(&mut self, i: usize) {
        testkit::ZooKeeperEnsemble::kill(self, i);
    }
    fn restart(&mut self, i: usize) {
        testkit::ZooKeeperEnsemble::restart(self, i);
    }
}

/// The bounds of [`two_of_three_down`], each with its reason at the caller (they depend on
/// the backend's timeouts).
pub struct TwoDownBounds {
    /// What a busy machine may add to a bound the lock keeps (an acquire's deadline).
    pub margin: Duration,
    /// How long a `try_acquire` without a quorum may take to fail.
    pub try_acquire_within: Duration,
    /// How long after both members are back the line may keep a failed attempt's entry.
    pub line_empty_within: Duration,
}

/// Two members of a cluster of three down, then back: `a` (a locker on the whole cluster,
/// whose wait is its options' `wait_timeout`) takes and gives back `key` once; the leader
/// and a follower are killed; `a`'s acquire fails with [`Error::Timeout`](distlock::Error)
/// by its deadline and its `try_acquire` within its bound, with an error `try_failed`
/// accepts; both members come back; once the line of `key` (read by `line`) is empty, `a`
/// takes the lock again with a larger fence. Answers the cluster, whole again.
pub async fn two_of_three_down<C, B, T, Line>(
    cluster: C,
    a: Locker<B>,
    key: &str,
    bounds: TwoDownBounds,
    try_failed: fn(&distlock::Error) -> bool,
    line: impl Fn() -> Line,
) -> C
where
    C: ThreeMembers,
    B: Backend,
    T: std::fmt::Debug,
    Line: Future<Output = Vec<T>>,
{
    use tokio::time::{Instant, sleep};
    let wait = a.options().wait_timeout();
    // Arrange: the lock taken and given back once, so that its fence is known.
    let first = a.acquire(key).await.unwrap();
    let first_fence = first.fence();
    assert!(first.release().await.unwrap().was_held());
    let leader = cluster.leader().expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();

    // Act: the leader and a follower die; the last member has no quorum and serves nobody.
    let mut cluster = cluster;
    cluster.kill(leader);
    cluster.kill(follower);
    let killed = Instant::now();
    let waited = a.acquire(key).await;
    let waited_for = killed.elapsed();
    let started = Instant::now();
    let tried = within(
        bounds.try_acquire_within,
        "try_acquire gave up",
        a.try_acquire(key),
    )
    .await;
    let tried_for = started.elapsed();

    // Assert: both failed, clearly and in time: acquire tried again until its deadline.
    let waited = waited.expect_err("acquired without a quorum");
    println!("acquire without a quorum, after {waited_for:?}: {waited:?}");
    assert!(
        matches!(waited, distlock::Error::Timeout { .. }),
        "{waited:?}"
    );
    assert!(
        waited_for <= wait + bounds.margin,
        "acquire took {waited_for:?}, its wait is {wait:?}"
    );
    let tried = tried.expect_err("try_acquire succeeded without a quorum");
    println!("try_acquire without a quorum, after {tried_for:?}: {tried:?}");
    assert!(try_failed(&tried), "{tried:?}");

    // Act: both come back.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.restart(leader);
        cluster.restart(follower);
        cluster
    })
    .await
    .expect("restarting the members");

    // Assert: once the failed attempts' leases or sessions are over, the line is empty,
    // and the lock is taken again with a larger fence.
    within(
        bounds.line_empty_within,
        "the line emptied once the failed attempts' leases (or sessions) were over",
        async {
            loop {
                let line = line().await;
                if line.is_empty() {
                    break;
                }
                println!("still in line: {line:?}");
                sleep(ms(200)).await;
            }
        },
    )
    .await;
    let again = a.acquire(key).await.unwrap();
    assert!(again.fence() > first_fence);
    assert!(again.release().await.unwrap().was_held());
    cluster
}

/// A store that refuses a write whose fence is below the largest it has accepted, as the
/// service's products table does (`UPDATE ... WHERE fence <= $1`).
#[derive(Default)]
pub struct FencedStore {
    /// The largest fence accepted, and who wrote with it.
    last: std::sync::Mutex<(u64, Option<String>)>,
}

impl FencedStore {
    /// Write as `writer` under `fence`; `false` if the store refused it.
    pub fn write(&self, fence: distlock::Fence, writer: &str) -> bool {
        let mut last = self.last.lock().unwrap();
        if fence.get() < last.0 {
            return false;
        }
        *last = (fence.get(), Some(writer.to_owned()));
        true
    }

    /// Who wrote last.
    pub fn writer(&self) -> Option<String> {
        self.last.lock().unwrap().1.clone()
    }
}

/// The contender nodes under `/distlock/<key>` on the ZooKeeper at `connect_string` (empty
/// if the lock node is gone), read by a session of its own.
#[cfg(feature = "zookeeper")]
pub async fn zk_contenders(connect_string: &str, key: &str) -> Vec<String> {
    let client = zookeeper_client::Client::connect(connect_string)
        .await
        .expect("a session to look at the line");
    let lock_node = format!("{}/{key}", distlock::zookeeper::DEFAULT_ROOT);
    match client.list_children(&lock_node).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(error) => panic!("listing {lock_node}: {error}"),
    }
}

/// One contender key in an etcd lock's line, as a test reads it.
#[cfg(feature = "etcd")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdContender {
    /// The token its name ends with.
    pub token: String,
    /// Its create revision: its place in line, and its holder's fence.
    pub revision: i64,
    /// The lease it is on.
    pub lease: i64,
}

/// A client of the etcd member at `endpoint` alone, for a test to look or act behind the
/// backend's back.
#[cfg(feature = "etcd")]
pub async fn etcd_client(endpoint: &str) -> etcd_client::Client {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(5));
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .expect("a client of the private etcd")
}

/// The line of `key` (under the default prefix) in the etcd cluster at `endpoints`, first
/// created first, read from the first member that answers (a client of all endpoints at
/// once sends some requests to a member that is down, and they fail).
#[cfg(feature = "etcd")]
pub async fn etcd_line(endpoints: &[String], key: &str) -> Vec<EtcdContender> {
    let prefix = format!("{}{key}/", distlock::etcd::DEFAULT_PREFIX);
    let in_order = etcd_client::GetOptions::new()
        .with_prefix()
        .with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        )
        .with_keys_only();
    let mut errors = Vec::new();
    for endpoint in endpoints {
        let read = etcd_client(endpoint)
            .await
            .get(prefix.clone(), Some(in_order.clone()))
            .await;
        match read {
            Ok(line) => {
                return line
                    .kvs()
                    .iter()
                    .map(|kv| EtcdContender {
                        token: String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                        revision: kv.create_revision(),
                        lease: kv.lease(),
                    })
                    .collect();
            }
            Err(error) => errors.push(format!("{endpoint}: {error}")),
        }
    }
    panic!("no member could read the line: {errors:?}");
}

/// Every lease the etcd member at `endpoint` has, in id order.
#[cfg(feature = "etcd")]
pub async fn etcd_leases(endpoint: &str) -> Vec<i64> {
    let mut leases: Vec<i64> = etcd_client(endpoint)
        .await
        .leases()
        .await
        .expect("listing the leases")
        .leases()
        .iter()
        .map(|lease| lease.id())
        .collect();
    leases.sort_unstable();
    leases
}
