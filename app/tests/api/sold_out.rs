use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{books, error_code, settings, shared_redis_url, spawn_instances};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn once_sold_out_other_instances_answer_without_lock_or_database_until_a_restock(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: two instances; A sells the last unit.
    let settings = settings(&shared_redis_url(), &testkit::unique_prefix("sold-out"));
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(a.purchase(id, 1, 1).await.status(), 201);

    // Act: B is asked twice after the sell-out.
    let first = b.purchase(id, 2, 1).await;
    let second = b.purchase(id, 3, 1).await;

    // Assert: B took no lock at all; the fast path answered.
    assert_eq!(error_code(first).await, (409, "sold_out".to_owned()));
    assert_eq!(error_code(second).await, (409, "sold_out".to_owned()));
    assert_eq!(b.metric("seckill_lock_acquisitions_total").await, 0.0);
    assert_eq!(b.metric("seckill_sold_out_fast_path_total").await, 2.0);

    // A restock through A is seen by B at once.
    assert_eq!(a.restock(id, 2).await.status(), 200);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 201);
    assert_eq!(b.metric("seckill_lock_acquisitions_total").await, 1.0);
    let books = books(&a.pool, id).await;
    assert_eq!((books.stock, books.orders), (1, 2));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_product_with_stock_left_is_not_marked_sold_out(pool: PgPool) {
    let app = crate::helpers::spawn_app(pool).await;
    let id = app.create_product("Phone", 2).await;
    // Too many for what is left, but not sold out: the next buyer of 1 must get through.
    assert_eq!(
        error_code(app.purchase(id, 1, 3).await).await,
        (409, "sold_out".to_owned())
    );
    assert_eq!(app.purchase(id, 2, 1).await.status(), 201);
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 0.0);
}
