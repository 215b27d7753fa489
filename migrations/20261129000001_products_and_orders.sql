-- Products on sale and the orders that bought them.
--
-- The books balance when, for every product:
--   initial stock = stock + SUM(orders.quantity)
-- which every purchase keeps by decrementing stock and inserting its order in one transaction.

CREATE TABLE products (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    -- Never negative: the database refuses an oversell even if every lock failed.
    stock       BIGINT      NOT NULL CHECK (stock >= 0),
    -- The highest lock fence that has written this row (LOCK_STRATEGY=redis). A write with a
    -- fence not above it comes from a holder whose lease ran out, and is refused.
    fence       BIGINT      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    -- Bumped by every write of the optimistic strategy (LOCK_STRATEGY=pg-optimistic).
    version     BIGINT      NOT NULL DEFAULT 0,
    -- Bumped by every restock, so a late "sold out" mark cannot hide a newer restock.
    restock_gen BIGINT      NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE orders (
    id         BIGSERIAL PRIMARY KEY,
    product_id BIGINT      NOT NULL REFERENCES products (id),
    user_id    BIGINT      NOT NULL CHECK (user_id > 0),
    quantity   INTEGER     NOT NULL CHECK (quantity > 0),
    -- The fence the order was written under (NULL for the strategies without one).
    fence      BIGINT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- One order per buyer per product.
    CONSTRAINT orders_one_per_user UNIQUE (product_id, user_id)
);
