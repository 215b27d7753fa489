//! What only the PostgreSQL lock table can show. The properties every backend shares run
//! against it too, in `tests/properties.rs`.

#![cfg(feature = "postgres")]

mod support;

use std::time::Duration;

use distlock::{LockOptions, Locker, PgLockTable};
use sqlx::PgPool;
use support::{Harness, PgHarness, ms};
use tokio::time::timeout;

#[sqlx::test]
async fn an_attempt_abandoned_while_it_waits_in_postgres_leaves_no_lock_behind(pool: PgPool) {
    // Arrange: another session holds the name's fence row, so the acquire statement waits.
    let harness = PgHarness::new(pool.clone()).await;
    let locker = Locker::new(
        PgLockTable::new(pool.clone()),
        LockOptions::builder()
            .ttl(Duration::from_secs(60))
            .build()
            .unwrap(),
    )
    .unwrap();
    assert!(
        locker
            .try_acquire("lock_sale_1")
            .await
            .unwrap()
            .release()
            .await
            .unwrap()
            .was_held()
    );
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("SELECT fence FROM distlock_fences WHERE name = 'lock_sale_1' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();

    // Act: the caller gives up while the statement waits; then the row is let go, and the
    // statement goes through after all.
    let outcome = timeout(ms(300), locker.try_acquire("lock_sale_1")).await;
    blocker.commit().await.unwrap();

    // Assert: the lock the abandoned statement took is given back, not left for 60 s. (Not
    // by watching for the row to be gone: the statement may not have taken it yet.)
    assert!(outcome.is_err(), "the attempt did not wait: {outcome:?}");
    let next = async {
        loop {
            match locker.try_acquire("lock_sale_1").await {
                Ok(guard) => return guard,
                Err(distlock::Error::Held { .. }) => tokio::time::sleep(ms(20)).await,
                Err(other) => panic!("{other}"),
            }
        }
    };
    let next = timeout(Duration::from_secs(5), next)
        .await
        .expect("the abandoned attempt left its lock behind");
    assert!(harness.holder("lock_sale_1").await.is_some());
    assert!(next.release().await.unwrap().was_held());
}

#[sqlx::test]
async fn the_lock_table_installs_twice_and_concurrently(pool: PgPool) {
    let table = PgLockTable::new(pool);
    let (a, b) = tokio::join!(table.install(), table.install());
    a.unwrap();
    b.unwrap();
    table.install().await.unwrap();
}
