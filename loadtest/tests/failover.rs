//! The database fails over: instances (child processes of the `loadtest` binary) sell from a
//! PostgreSQL run by Patroni (three members, `synchronous_mode_strict`, HAProxy in front of
//! the primary, [`PatroniCluster`]) while its primary is killed, paused past Patroni's lease,
//! or left without a standby, and while a lock holder is paused across a failover. Every test
//! then checks, on the promoted primary, that each 201 has its order and that the books
//! balance. Every process is stopped by its own pid.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadtest::books::{self, Books};
use loadtest::instances::{Instance, InstanceConfig};
use seckill::LockStrategy;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{LOADTEST, shared_redis_url};
use testkit::{PatroniCluster, Tie};
use tokio::task::spawn_blocking;
use tokio::time::Instant;

const ADMIN_TOKEN: &str = "failover-admin-token-0123";

/// TIMING: a failover waits out Patroni's 20 s lease and a loop or two; HAProxy then needs
/// a check or two (500 ms each). A minute holds on a busy two-core machine.
const FAILOVER_WITHIN: Duration = Duration::from_secs(60);

/// A Patroni cluster, started off the runtime's threads (it takes some 20 s).
async fn start_cluster() -> PatroniCluster {
    spawn_blocking(|| PatroniCluster::start(&[], Tie::Child).unwrap_or_else(|e| panic!("{e}")))
        .await
        .unwrap()
}

/// `n` instances of `redis` on `cluster` (through HAProxy), with these settings besides.
async fn start_instances(
    cluster: &PatroniCluster,
    prefix: &str,
    n: usize,
    work_ms: u64,
    extra: &[(&'static str, &str)],
) -> Vec<Instance> {
    let url = cluster.url();
    let redis = shared_redis_url();
    let config = InstanceConfig {
        database_url: &url,
        redis_url: &redis,
        redis_key_prefix: prefix,
        admin_token: ADMIN_TOKEN,
        strategy: LockStrategy::Redis,
        work_ms,
        lock_wait_ms: 30_000,
        lock_ttl_ms: 2_000,
        redlock_urls: "",
        extra: extra.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
    };
    let mut instances = Vec::new();
    for i in 0..n {
        let name = format!("failover-{i}");
        instances.push(
            Instance::start(Path::new(LOADTEST), &config, &name)
                .await
                .unwrap(),
        );
    }
    instances
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap()
}

/// One purchase: (status, error code, order id), status 0 when no answer came.
async fn buy(client: &reqwest::Client, host: &str, product: i64, user: i64) -> Answer {
    let sent = Instant::now();
    match client
        .post(format!("{host}/api/products/{product}/purchase"))
        .bearer_auth(loadtest::buyers::token(user))
        .json(&json!({"user_id": user}))
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            Answer {
                user,
                status,
                code: body["error"].as_str().unwrap_or_default().to_owned(),
                order_id: body["order_id"].as_i64(),
                sent,
            }
        }
        Err(error) => Answer {
            user,
            status: 0,
            code: error.to_string(),
            order_id: None,
            sent,
        },
    }
}

/// Buyers `first_user`, `first_user + 1`, ... until one is sold (within
/// [`FAILOVER_WITHIN`]): the first purchases after a failover may meet a pooled connection to
/// the old primary, which HAProxy cut (503, to retry). Every answer, the sale last.
async fn buy_until_sold(
    client: &reqwest::Client,
    host: &str,
    product: i64,
    first_user: i64,
) -> Vec<Answer> {
    let mut answers = Vec::new();
    let deadline = Instant::now() + FAILOVER_WITHIN;
    while answers.last().is_none_or(|a: &Answer| a.status != 201) {
        assert!(Instant::now() < deadline, "no sale: {answers:?}");
        answers.push(buy(client, host, product, first_user + answers.len() as i64).await);
    }
    answers
}

#[derive(Debug, Clone)]
struct Answer {
    user: i64,
    status: u16,
    code: String,
    order_id: Option<i64>,
    /// When it was sent.
    sent: Instant,
}

/// Every 201 has its order, with the id it was told; no oversell, the ledger balances, one
/// order per buyer. Read on whatever HAProxy sends to (the primary now).
async fn assert_every_201_has_its_order(url: &str, product: i64, answers: &[Answer]) -> Books {
    let pool = PgPool::connect(url).await.unwrap();
    let stored: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, id FROM orders WHERE product_id = $1")
            .bind(product)
            .fetch_all(&pool)
            .await
            .unwrap();
    let stored: std::collections::HashMap<i64, i64> = stored.into_iter().collect();
    for answer in answers.iter().filter(|a| a.status == 201) {
        assert_eq!(
            stored.get(&answer.user).copied(),
            answer.order_id,
            "a 201 without its order: {answer:?}"
        );
    }
    pool.close().await;
    let books = books::read(url, product).await.unwrap();
    assert!(
        books.stock >= 0 && books.sold <= books.supplied,
        "oversold: {books:?}"
    );
    assert!(books.balance(), "lost update: {books:?}");
    assert_eq!(books.users_with_several_orders, 0, "{books:?}");
    books
}

/// Buyers that keep coming until told to stop, each with a user id of its own, round-robin
/// over `instances`: `concurrency` purchases open at once.
struct Flood {
    answers: Arc<Mutex<Vec<Answer>>>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(instances: &[Instance], product: i64, concurrency: i64) -> Self {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let client = client();
        let tasks = (0..concurrency)
            .map(|lane| {
                let (client, answers, stopped) =
                    (client.clone(), Arc::clone(&answers), stopped.clone());
                let hosts: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
                tokio::spawn(async move {
                    let mut user = 1 + lane;
                    while !*stopped.borrow() {
                        let host = &hosts[user as usize % hosts.len()];
                        let answer = buy(&client, host, product, user).await;
                        if answer.status != 201 && answer.status != 409 {
                            // Not a busy loop while the database is away.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        answers.lock().unwrap().push(answer);
                        user += concurrency;
                    }
                })
            })
            .collect();
        Self {
            answers,
            stop,
            tasks,
        }
    }

    /// When the first purchase sent after `after` that was answered 201 was sent, waiting
    /// for it up to `within`.
    async fn first_sale_after(&self, after: Instant, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let first = self
                .answers
                .lock()
                .unwrap()
                .iter()
                .filter(|a| a.status == 201 && a.sent > after)
                .map(|a| a.sent)
                .min();
            if first.is_some() {
                return first;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    async fn stop(self) -> Vec<Answer> {
        self.stop.send(true).unwrap();
        for task in self.tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(self.answers).unwrap().into_inner().unwrap()
    }
}

/// How many answers had each (status, code).
fn tally(answers: &[Answer]) -> std::collections::BTreeMap<(u16, String), usize> {
    let mut tally = std::collections::BTreeMap::new();
    for answer in answers {
        *tally
            .entry((answer.status, answer.code.clone()))
            .or_default() += 1;
    }
    tally
}

/// The primary is killed as its machine would die, mid-sale: the synchronous standby is
/// promoted, HAProxy sends the instances there, sales resume by themselves, and every
/// purchase answered 201 has its order on the new primary. Prints the time from the kill to
/// the first sale after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_mid_sale_loses_no_answered_order() {
    // Arrange: two instances selling a product of a million units to a steady flood.
    let mut cluster = start_cluster().await;
    let prefix = testkit::unique_prefix("failover-kill");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let instances = start_instances(&cluster, &prefix, 2, 0, &[]).await;
    let product = loadtest::attack::create_product(&instances[0].ops_url, ADMIN_TOKEN, 1_000_000)
        .await
        .unwrap();
    let flood = Flood::start(&instances, product, 16);
    let started = Instant::now();
    assert!(
        flood
            .first_sale_after(started, Duration::from_secs(30))
            .await
            .is_some(),
        "the sale began"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Act: kill the primary; wait for the first purchase sent after it that is sold (on the
    // new primary: the old one is gone when `kill` returns), and two seconds more.
    let old = cluster.primary().expect("a primary");
    // Timed from when the kill is done (every process of the member gone): a purchase sent
    // while it was under way may still have sold on the old primary.
    let (cluster, killed_at) = spawn_blocking(move || {
        cluster.kill(old);
        (cluster, Instant::now())
    })
    .await
    .unwrap();
    let resumed = flood.first_sale_after(killed_at, FAILOVER_WITHIN).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answers = flood.stop().await;

    // Assert: another member is the primary, sales resumed, nothing answered 201 was lost,
    // and every other answer was a 503 saying what the buyer may do.
    let resumed = resumed.expect("sales resumed on the new primary");
    let new = cluster.primary().expect("a new primary");
    assert_ne!(new, old);
    let books = assert_every_201_has_its_order(&cluster.url(), product, &answers).await;
    let created = answers.iter().filter(|a| a.status == 201).count() as i64;
    assert!(books.orders >= created, "{books:?}, {created} created");
    let tally = tally(&answers);
    for (status, code) in tally.keys() {
        assert!(
            *status == 201
                || (*status == 503
                    && matches!(
                        code.as_str(),
                        "database_unavailable" | "outcome_unknown" | "busy"
                    )),
            "an answer that is neither a sale nor a 503 to retry: {tally:?}"
        );
    }
    eprintln!(
        "from the kill to the first purchase sent that sold: {:?}; answers {tally:?}; {} orders stored, {created} answered 201",
        resumed - killed_at,
        books.orders
    );
}

/// The primary is paused (Patroni and PostgreSQL, as a machine that freezes) past Patroni's
/// lease: a standby is promoted meanwhile. When the old primary resumes, a write sent to it
/// directly is never acknowledged (no standby confirms it), Patroni demotes it, and the
/// write is not on the new primary; the service sold on the new primary meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_paused_past_its_lease_takes_no_write_when_it_resumes() {
    // Arrange: an instance selling; a table for the probe's write.
    let cluster = start_cluster().await;
    let prefix = testkit::unique_prefix("failover-pause");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let instances = start_instances(&cluster, &prefix, 1, 0, &[]).await;
    let product = loadtest::attack::create_product(&instances[0].ops_url, ADMIN_TOKEN, 1_000)
        .await
        .unwrap();
    let client = client();
    let before = buy(&client, &instances[0].url, product, 1).await;
    assert_eq!(before.status, 201, "{before:?}");
    let setup = PgPool::connect(&cluster.url()).await.unwrap();
    sqlx::query("CREATE TABLE probe (note text)")
        .execute(&setup)
        .await
        .unwrap();
    setup.close().await;
    let old = cluster.primary().expect("a primary");
    let old_url = cluster.member_url(old);

    // Act: pause it past the lease; a standby is promoted; sell there; resume the old one
    // and write to it directly at once.
    cluster.pause(old);
    let cluster = spawn_blocking(move || {
        let mut cluster = cluster;
        cluster
            .wait_for_primary_other_than(old, FAILOVER_WITHIN)
            .unwrap_or_else(|e| panic!("no standby was promoted: {e}"));
        cluster
    })
    .await
    .unwrap();
    let during = buy_until_sold(&client, &instances[0].url, product, 2).await;
    cluster.resume(old);
    let write = tokio::time::timeout(Duration::from_secs(20), async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&old_url)
            .await?;
        sqlx::query("INSERT INTO probe VALUES ('written to the old primary')")
            .execute(&pool)
            .await
    })
    .await;
    let deadline = Instant::now() + FAILOVER_WITHIN;
    let demoted = loop {
        let recovering: Option<bool> = match PgPool::connect(&old_url).await {
            Ok(pool) => sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&pool)
                .await
                .ok(),
            Err(_) => None,
        };
        if recovering == Some(true) || Instant::now() > deadline {
            break recovering == Some(true);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let after = buy(&client, &instances[0].url, product, 100).await;

    // Assert: the write to the old primary was never acknowledged, and is not on the new
    // one; the old primary was demoted; the service sold throughout.
    assert!(
        !matches!(write, Ok(Ok(_))),
        "the old primary acknowledged a write: {write:?}"
    );
    assert!(demoted, "Patroni demoted the old primary");
    let pool = PgPool::connect(&cluster.url()).await.unwrap();
    let probes: i64 = sqlx::query_scalar("SELECT count(*) FROM probe")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(probes, 0, "the old primary's write reached the new one");
    assert_eq!(after.status, 201, "{after:?}");
    let answers: Vec<Answer> = [before, after].into_iter().chain(during).collect();
    let books = assert_every_201_has_its_order(&cluster.url(), product, &answers).await;
    let created = answers.iter().filter(|a| a.status == 201).count() as i64;
    assert!(books.orders >= created, "{books:?}");
    eprintln!("the write to the resumed old primary: {write:?}");
}

/// With both standbys dead, `synchronous_mode_strict` keeps every commit waiting: a
/// purchase is written on the primary but never answered 201 (the service cancels no
/// commit; it answers 503 at its time bound). Once a standby is back, the waiting commit is
/// confirmed, and the sale goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_standby_left_a_purchase_waits_and_is_never_answered_201() {
    // Arrange: an instance whose batches are bounded at a few seconds.
    let mut cluster = start_cluster().await;
    let prefix = testkit::unique_prefix("failover-strict");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let bounds = [
        ("PG_STATEMENT_TIMEOUT_MS", "1000"),
        ("DATABASE_ACQUIRE_TIMEOUT_MS", "1000"),
    ];
    let instances = start_instances(&cluster, &prefix, 1, 0, &bounds).await;
    let product = loadtest::attack::create_product(&instances[0].ops_url, ADMIN_TOKEN, 10)
        .await
        .unwrap();
    let client = client();
    let first = buy(&client, &instances[0].url, product, 1).await;
    assert_eq!(first.status, 201, "{first:?}");
    let primary = cluster.primary().expect("a primary");
    let standbys: Vec<usize> = (0..3).filter(|&i| i != primary).collect();

    // Act: kill both standbys; buy; look at the primary directly while the answer is out.
    for &i in &standbys {
        cluster.kill(i);
    }
    let waiting = {
        let (client, host) = (client.clone(), instances[0].url.clone());
        tokio::spawn(async move { buy(&client, &host, product, 2).await })
    };
    // Its commit is written on the primary and waits for a standby (PostgreSQL shows it to
    // no one until one confirms it, or until the wait is cancelled).
    let direct = PgPool::connect(&cluster.member_url(primary)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting_commits: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .fetch_one(&direct)
        .await
        .unwrap();
        if waiting_commits >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the purchase's commit never waited for a standby"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let unconfirmed = waiting.await.unwrap();
    // Answered without cancelling the commit: it still waits for a standby.
    let still_waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            .fetch_one(&direct)
            .await
            .unwrap();
    assert!(still_waiting >= 1, "the commit's wait was cancelled");
    // A standby comes back; its Patroni makes it the synchronous standby.
    let back = standbys[0];
    cluster.restart(back).unwrap();
    let cluster = spawn_blocking(move || {
        cluster.wait_for_sync_standby(FAILOVER_WITHIN).unwrap();
        cluster
    })
    .await
    .unwrap();
    let after = buy(&client, &instances[0].url, product, 3).await;

    // Assert: the order only the primary had was not answered 201; once confirmed, it
    // stands; the sale went on.
    assert_eq!(
        (unconfirmed.status, unconfirmed.code.as_str()),
        (503, "outcome_unknown"),
        "{unconfirmed:?}"
    );
    assert_eq!(after.status, 201, "{after:?}");
    direct.close().await;
    let books =
        assert_every_201_has_its_order(&cluster.url(), product, &[first, unconfirmed, after]).await;
    assert_eq!(books.orders, 3, "the confirmed commit stands: {books:?}");
}

/// A lock holder paused inside its batch across a failover: another instance takes the
/// lock and sells on the old primary; the primary dies; the paused holder resumes and
/// writes, with its old fence, to the promoted standby, which holds the newer fence and
/// refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_across_a_failover_is_refused_on_the_new_primary() {
    // Arrange: two instances with 3 s of work inside the lock; instance 0 has never written
    // (its holders' connections open at its first write: after the failover, to the new
    // primary).
    let mut cluster = start_cluster().await;
    let prefix = testkit::unique_prefix("failover-fence");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let instances = start_instances(&cluster, &prefix, 2, 3_000, &[]).await;
    let product = loadtest::attack::create_product(&instances[1].ops_url, ADMIN_TOKEN, 10)
        .await
        .unwrap();
    let client = client();
    let lock_key = format!("{prefix}lock_sale_{product}");
    let mut redis = redis::Client::open(shared_redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stale = {
        let (client, host) = (client.clone(), instances[0].url.clone());
        tokio::spawn(async move { buy(&client, &host, product, 1).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(&lock_key)
            .query_async(&mut redis)
            .await
            .unwrap();
        if holder.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "instance 0 never took the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // TIMING: the SIGSTOP must land within the holder's 3 s of work.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Act: pause it; instance 1 sells (after the 2 s lease runs out) on the old primary;
    // the primary dies; a standby is promoted; the paused holder resumes.
    let pid = instances[0].pid();
    testkit::send_signal(pid, "-STOP");
    let fresh = buy(&client, &instances[1].url, product, 2).await;
    let old = cluster.primary().expect("a primary");
    let cluster = spawn_blocking(move || {
        cluster.kill(old);
        cluster.wait_for_primary(FAILOVER_WITHIN).unwrap();
        cluster
    })
    .await
    .unwrap();
    testkit::send_signal(pid, "-CONT");
    let stale = stale.await.unwrap();

    // Assert: the fresh sale stands on the new primary; the stale write was refused there.
    assert_eq!(fresh.status, 201, "{fresh:?}");
    assert_eq!(
        (stale.status, stale.code.as_str()),
        (503, "lock_lost"),
        "{stale:?}"
    );
    let books =
        assert_every_201_has_its_order(&cluster.url(), product, &[fresh.clone(), stale]).await;
    assert_eq!((books.orders, books.stock), (1, 9), "{books:?}");
}

/// Patroni's store lost: with etcd gone, no Patroni can renew the leader lease, so the
/// primary's Patroni demotes it once it has failed to update its leader key for
/// `retry_timeout` (Patroni's failsafe mode, which would keep it, is off): the service sells nothing and says so in `/readyz`, and no purchase is answered
/// 201. With etcd back, a primary is elected again and the sale resumes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_lost_the_primary_steps_down_and_comes_back_with_it() {
    // Arrange: an instance selling.
    let mut cluster = start_cluster().await;
    let prefix = testkit::unique_prefix("failover-etcd");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let instances = start_instances(&cluster, &prefix, 1, 0, &[]).await;
    let product = loadtest::attack::create_product(&instances[0].ops_url, ADMIN_TOKEN, 100)
        .await
        .unwrap();
    let client = client();
    let before = buy(&client, &instances[0].url, product, 1).await;
    assert_eq!(before.status, 201, "{before:?}");

    // Act: kill etcd; wait until no member is the primary; buy, and ask /readyz.
    cluster.etcd().kill();
    let lost_at = Instant::now();
    let cluster = spawn_blocking(move || {
        let deadline = std::time::Instant::now() + FAILOVER_WITHIN;
        while cluster.primary().is_some() || cluster.routes_to_a_primary() {
            assert!(
                std::time::Instant::now() < deadline,
                "the primary stayed without etcd"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster
    })
    .await
    .unwrap();
    let stepped_down_after = lost_at.elapsed();
    let without = buy(&client, &instances[0].url, product, 2).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await; // past /readyz's cached answer
    let ready: Value = client
        .get(format!("{}/readyz", instances[0].ops_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut cluster = cluster;
    cluster.etcd().restart();
    let cluster = spawn_blocking(move || {
        cluster.wait_for_primary(FAILOVER_WITHIN).unwrap();
        cluster
    })
    .await
    .unwrap();
    let after = buy_until_sold(&client, &instances[0].url, product, 10).await;

    // Assert: nothing sold while the cluster had no primary, and /readyz said why; sales
    // resumed; the books balance.
    assert_eq!(without.status, 503, "{without:?}");
    assert_eq!(ready["status"], "not_ready", "{ready}");
    assert_eq!(ready["postgres"], false, "{ready}");
    let answers: Vec<Answer> = [before, without].into_iter().chain(after).collect();
    let books = assert_every_201_has_its_order(&cluster.url(), product, &answers).await;
    let pool = PgPool::connect(&cluster.url()).await.unwrap();
    let of_2: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE product_id = $1 AND user_id = 2")
            .bind(product)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(of_2, 0, "a purchase was stored while there was no primary");
    eprintln!("without etcd the primary stepped down after {stepped_down_after:?}; {books:?}");
}
