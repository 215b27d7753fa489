-- The ceiling of `loadtest bench-http`: how fast PostgreSQL itself can sell from one row on
-- this machine, with no service, no HTTP and no lock in front of it.
--
-- What it models, and why:
-- - One hot row. Every sale of a flash-sale product decrements the same `products` row, and
--   a row lock is held until the commit record is on disk, so one row sells one commit at
--   a time whatever the number of clients: bench-http runs this with ONE client (pgbench
--   -c 1 -j 1), the best case of that queue, with nobody waiting on the row lock.
-- - Durable commits, as the server has them (bench-http prints synchronous_commit and
--   fsync): each transaction waits for its WAL flush, as each of the service's batches does.
-- - 64 orders per commit: the reference the issue that asked for it fixed (the service's
--   BATCH_MAX was 64 then; it is 256 now, and its batches grow past 64 only while more
--   than 64 buyers wait). Each transaction is one statement, the shape the
--   service's batch takes under a lock (one round trip, one commit): take 64 units if there
--   are 64, and insert one order of one unit for each of 64 new buyers (a sequence numbers
--   them, so no order breaks orders_one_per_user). It leaves out what the service's
--   statement checks besides (buyers with an order already, the lock's fence): a ceiling
--   is the work no correct sale can skip.
-- - The service's schema, from its migrations (constraints, indexes, the foreign key).
--
-- bench-http passes the product's id as :product (pgbench -D product=<id>) and checks that
-- the orders were really inserted: tps x 64 orders/s only holds if none was refused.
WITH taken AS (
    UPDATE products SET stock = stock - 64
    WHERE id = :product AND stock >= 64
    RETURNING id
)
INSERT INTO orders (product_id, user_id, quantity, fence)
SELECT taken.id, nextval('ceiling_buyers'), 1, 0
FROM taken, generate_series(1, 64);
