//! Several lock holders' batches in one statement (`repository::sell_many_as_holder`, sent by
//! the instance's writer): each product's batch is decided by its own row, as if written
//! alone, and a conflict that undoes the statement leaves each batch to be written alone.

use seckill::domain::ProductId;
use seckill::repository::{HolderBatch, HolderWrite, sell_as_holder, sell_many_as_holder};
use sqlx::PgPool;

/// Product `id`'s row: `stock`, `fence`, and `version`.
async fn product(pool: &PgPool, id: i64, stock: i64, fence: i64, version: i64) -> ProductId {
    sqlx::query(
        "INSERT INTO products (id, name, stock, fence, version) VALUES ($1, 'p' || $1, $2, $3, $4)",
    )
    .bind(id)
    .bind(stock)
    .bind(fence)
    .bind(version)
    .execute(pool)
    .await
    .unwrap();
    ProductId::parse(&id.to_string()).unwrap()
}

async fn order(pool: &PgPool, product: i64, user: i64) {
    sqlx::query("INSERT INTO orders (product_id, user_id, quantity) VALUES ($1, $2, 1)")
        .bind(product)
        .bind(user)
        .execute(pool)
        .await
        .unwrap();
}

/// `(stock, fence, version)` of a product, and the users with an order of it.
async fn state(pool: &PgPool, id: i64) -> ((i64, i64, i64), Vec<i64>) {
    let row = sqlx::query_as("SELECT stock, fence, version FROM products WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    let users =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = $1 ORDER BY user_id")
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
    (row, users)
}

fn batch<'a>(
    users: &'a [i64],
    quantities: &'a [i32],
    fence: i64,
    exact: Option<i64>,
    refused: &'a [i64],
) -> HolderBatch<'a> {
    HolderBatch {
        users,
        quantities,
        fence,
        exact,
        refused,
    }
}

/// Each batch's write, every one of them sent, and written or refused by its row (no error).
fn each(writes: Vec<Option<sqlx::Result<HolderWrite>>>) -> Vec<HolderWrite> {
    writes
        .into_iter()
        .map(|w| w.expect("sent").expect("a write, not an error"))
        .collect()
}

/// The users a write committed orders for, sorted; `None` for `NotWritten`.
fn sold_to(write: &HolderWrite) -> Option<Vec<i64>> {
    match write {
        HolderWrite::Committed { orders, .. } => {
            let mut users: Vec<i64> = orders.iter().map(|(u, _)| *u).collect();
            users.sort_unstable();
            Some(users)
        }
        HolderWrite::NotWritten => None,
    }
}

/// Seven products, each to be refused or written for a reason of its own row, and a batch
/// for each: (1) plenty; (2) a fence above the batch's; (3) stock short of the batch; (4) an
/// exact allocation against a version the row has left; (5) a buyer with an order already,
/// and a refused buyer with one; (6) an exact allocation that holds; (7) an exact allocation
/// at the row's version, to a buyer who has an order already (its sold_out answers would not
/// stand: nothing is written).
async fn seven_cases(pool: &PgPool) -> Vec<(ProductId, HolderBatch<'static>)> {
    let rows = [
        (1, 10, 0, 0),
        (2, 10, 9, 0),
        (3, 1, 0, 0),
        (4, 10, 0, 7),
        (5, 10, 0, 0),
        (6, 2, 0, 3),
        (7, 2, 0, 3),
    ];
    let mut ids = Vec::new();
    for (id, stock, fence, version) in rows {
        ids.push(product(pool, id, stock, fence, version).await);
    }
    order(pool, 5, 51).await;
    order(pool, 5, 59).await;
    order(pool, 7, 71).await;
    let batches = [
        batch(&[11, 12], &[1, 1], 5, None, &[]),
        batch(&[21], &[1], 5, None, &[]),
        batch(&[31, 32], &[1, 1], 5, None, &[]),
        batch(&[41], &[1], 5, Some(6), &[]),
        batch(&[51, 52], &[1, 2], 5, None, &[59, 58]),
        batch(&[61], &[2], 5, Some(3), &[62]),
        batch(&[71, 72], &[1, 1], 5, Some(3), &[]),
    ];
    ids.into_iter().zip(batches).collect()
}

/// The buyers each of the seven cases sells to, as a statement of its own decides them.
fn seven_answers() -> [Option<Vec<i64>>; 7] {
    [
        Some(vec![11, 12]),
        None,
        None,
        None,
        Some(vec![52]),
        Some(vec![61]),
        None,
    ]
}

/// The seven cases in one statement: the statement writes exactly the ones that a statement
/// of their own would have written, and each answer says what that statement would have
/// said.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn one_statement_decides_each_products_batch_by_its_own_row(pool: PgPool) {
    let batches = seven_cases(&pool).await;

    let writes = sell_many_as_holder(&mut pool.acquire().await.unwrap(), &batches, |_| true)
        .await
        .unwrap();
    let writes = each(writes);

    // Assert: the answers, in the batches' order.
    let answers: Vec<Option<Vec<i64>>> = writes.iter().map(sold_to).collect();
    assert_eq!(answers, seven_answers());
    match &writes[4] {
        HolderWrite::Committed { row, bought, .. } => {
            assert_eq!((row.stock, row.version, row.fence), (8, 1, 5));
            assert_eq!(bought, &[59], "refused buyers who had an order before");
        }
        other => panic!("{other:?}"),
    }
    match &writes[0] {
        HolderWrite::Committed {
            row,
            bought,
            orders,
        } => {
            assert_eq!((row.stock, row.version), (8, 1));
            assert!(bought.is_empty());
            // Each buyer with the id of their own order, as stored.
            let mut stored: Vec<(i64, i64)> = sqlx::query_as(
                "SELECT user_id, id FROM orders WHERE product_id = 1 ORDER BY user_id",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            let mut told = orders.clone();
            told.sort_unstable();
            stored.sort_unstable();
            assert_eq!(told, stored);
        }
        other => panic!("{other:?}"),
    }
    // And the rows: written ones took their units and the fence; the others are untouched.
    assert_eq!(state(&pool, 1).await, ((8, 5, 1), vec![11, 12]));
    assert_eq!(state(&pool, 2).await, ((10, 9, 0), vec![]));
    assert_eq!(state(&pool, 3).await, ((1, 0, 0), vec![]));
    assert_eq!(state(&pool, 4).await, ((10, 0, 7), vec![]));
    assert_eq!(state(&pool, 5).await, ((8, 5, 1), vec![51, 52, 59]));
    assert_eq!(state(&pool, 6).await, ((0, 5, 4), vec![61]));
    assert_eq!(state(&pool, 7).await, ((2, 0, 3), vec![71]));
}

/// The same seven cases, each written by a statement of its own: the answers and rows the
/// statement over all of them gave (the test above) are these.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn each_product_alone_gives_the_same_answers(pool: PgPool) {
    let batches = seven_cases(&pool).await;
    let mut answers = Vec::new();
    for (id, batch) in batches {
        let write = sell_as_holder(&mut pool.acquire().await.unwrap(), id, batch)
            .await
            .unwrap();
        answers.push(sold_to(&write));
    }
    assert_eq!(answers, seven_answers());
    assert_eq!(state(&pool, 5).await, ((8, 5, 1), vec![51, 52, 59]));
    assert_eq!(state(&pool, 6).await, ((0, 5, 4), vec![61]));
    assert_eq!(state(&pool, 7).await, ((2, 0, 3), vec![71]));
}

/// An overlapping writer commits an order of a buyer in the statement after it began (a
/// stale holder of product 1): the statement is undone by the unique index, and each batch
/// is then written alone, so product 2's buyers still get theirs and product 1's buyer
/// whose order the other writer made is left out.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_overlapping_writers_order_leaves_each_batch_to_be_written_alone(pool: PgPool) {
    // Arrange: two products, and another writer's order of buyer 11 of product 1, inserted
    // and not yet committed: the statement will wait for it on the unique index.
    let first = product(&pool, 1, 10, 0, 0).await;
    let second = product(&pool, 2, 10, 0, 0).await;
    let mut other = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (product_id, user_id, quantity) VALUES (1, 11, 1)")
        .execute(&mut *other)
        .await
        .unwrap();

    // Act: the statement, which blocks on buyer 11's index entry until the other commits.
    let writing = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let one = [1, 1];
            sell_many_as_holder(
                &mut pool.acquire().await.unwrap(),
                &[
                    (first, batch(&[11, 12], &one, 5, None, &[])),
                    (second, batch(&[21, 22], &one, 5, None, &[])),
                ],
                |_| true,
            )
            .await
        })
    };
    // Until the statement waits on the other's lock.
    let waited = async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), waited)
        .await
        .expect("the statement waits for the other writer's order");
    other.commit().await.unwrap();
    let writes = each(writing.await.unwrap().unwrap());

    // Assert: each batch written as if alone: buyer 11 left out (their order is the other
    // writer's), buyer 12 and product 2's buyers sold to.
    let answers: Vec<Option<Vec<i64>>> = writes.iter().map(sold_to).collect();
    assert_eq!(answers, [Some(vec![12]), Some(vec![21, 22])]);
    assert_eq!(state(&pool, 1).await, ((9, 5, 1), vec![11, 12]));
    assert_eq!(state(&pool, 2).await, ((8, 5, 1), vec![21, 22]));
}

/// One product of the statement is not on sale yet (its orders are refused by the database,
/// SQLSTATE SK409, which undoes the whole statement): that product's batch gets that error,
/// the others are written as if alone, and one whose holder stopped waiting is not sent.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_product_refused_by_the_database_leaves_the_others_written(pool: PgPool) {
    let open = product(&pool, 1, 10, 0, 0).await;
    let not_yet = product(&pool, 2, 10, 0, 0).await;
    let also_open = product(&pool, 3, 10, 0, 0).await;
    let abandoned = product(&pool, 4, 10, 0, 0).await;
    sqlx::query("UPDATE products SET on_sale_at = now() + interval '1 hour' WHERE id = 2")
        .execute(&pool)
        .await
        .unwrap();
    let one = [1, 1];

    let writes = sell_many_as_holder(
        &mut pool.acquire().await.unwrap(),
        &[
            (open, batch(&[11, 12], &one, 5, None, &[])),
            (not_yet, batch(&[21, 22], &one, 5, None, &[])),
            (also_open, batch(&[31], &one[..1], 5, None, &[])),
            (abandoned, batch(&[41], &one[..1], 5, None, &[])),
        ],
        |i| i != 3,
    )
    .await
    .unwrap();

    assert_eq!(writes.len(), 4);
    let written = |i: usize| {
        writes[i]
            .as_ref()
            .expect("sent")
            .as_ref()
            .ok()
            .and_then(sold_to)
    };
    assert_eq!(written(0), Some(vec![11, 12]));
    let refused = writes[1].as_ref().expect("sent").as_ref().unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("SK409"),
        "{refused}"
    );
    assert_eq!(written(2), Some(vec![31]));
    assert!(writes[3].is_none(), "nobody waits for it: not sent");
    assert_eq!(state(&pool, 1).await, ((8, 5, 1), vec![11, 12]));
    assert_eq!(state(&pool, 2).await, ((10, 0, 0), vec![]));
    assert_eq!(state(&pool, 3).await, ((9, 5, 1), vec![31]));
    assert_eq!(state(&pool, 4).await, ((10, 0, 0), vec![]));
}

/// A statement as large as a writer sends (64 products), each product's batch with 128
/// buyers sold to and 128 refused, half of whom had an order: every product is written with
/// its 128 orders, and each is told exactly its own refused buyers who had one. On a session
/// of the lock holders' pool, as the writer sends it (one generic plan, no sequential scan).
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_full_statement_answers_every_product_with_its_own_buyers(pool: PgPool) {
    let mut ids = Vec::new();
    for id in 1..=64 {
        ids.push(product(&pool, id, 1_000, 0, 0).await);
    }
    // Refused buyers 1000..1127 of each product; the even ones had an order.
    sqlx::query(
        "INSERT INTO orders (product_id, user_id, quantity)
         SELECT p, u, 1 FROM generate_series(1, 64) p, generate_series(1000, 1126, 2) u",
    )
    .execute(&pool)
    .await
    .unwrap();
    let users: Vec<Vec<i64>> = (1..=64)
        .map(|p| (0..128).map(|u| p * 10_000 + u).collect())
        .collect();
    let refused: Vec<i64> = (1000..1128).collect();
    let quantities = vec![1; 128];
    let batches: Vec<_> = ids
        .iter()
        .zip(&users)
        .map(|(id, users)| (*id, batch(users, &quantities, 5, None, &refused)))
        .collect();

    let holders = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(seckill::startup::holder_sessions(&pool))
        .await
        .unwrap();
    let writes = each(
        sell_many_as_holder(&mut holders.acquire().await.unwrap(), &batches, |_| true)
            .await
            .unwrap(),
    );

    let had_one: Vec<i64> = (1000..1128).step_by(2).collect();
    for (write, users) in writes.iter().zip(&users) {
        match write {
            HolderWrite::Committed {
                row,
                orders,
                bought,
                ..
            } => {
                assert_eq!(row.stock, 1_000 - 128);
                let mut sold: Vec<i64> = orders.iter().map(|(u, _)| *u).collect();
                sold.sort_unstable();
                assert_eq!(&sold, users);
                let mut bought = bought.clone();
                bought.sort_unstable();
                assert_eq!(bought, had_one);
            }
            other => panic!("{other:?}"),
        }
    }
}
