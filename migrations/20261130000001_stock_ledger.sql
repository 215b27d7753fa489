-- Every change of a product's stock other than a sale, so the books can be checked at any
-- time, restocks included:
--   supplied = SUM(stock_changes.delta) = stock + SUM(orders.quantity)
-- A product's creation, every restock and every correction is one row, written in the same
-- transaction as the stock it changes.

CREATE TABLE stock_changes (
    id         BIGSERIAL   PRIMARY KEY,
    product_id BIGINT      NOT NULL REFERENCES products (id),
    -- Units added (positive) or withdrawn (negative).
    delta      BIGINT      NOT NULL,
    -- `create`: the initial stock; `restock`: "add N"; `set`: an absolute write with its
    -- precondition (the stock the admin expected).
    reason     TEXT        NOT NULL CHECK (reason IN ('create', 'restock', 'set')),
    -- Who asked: the admin role and the client address.
    actor      TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX stock_changes_by_product ON stock_changes (product_id);

-- Products that exist already: what they were supplied with so far.
INSERT INTO stock_changes (product_id, delta, reason, actor)
SELECT p.id, p.stock + COALESCE((SELECT SUM(o.quantity) FROM orders o WHERE o.product_id = p.id), 0),
       'create', 'migration'
FROM products p;

-- The stock can never exceed what the API accepts.
ALTER TABLE products ADD CONSTRAINT products_stock_at_most_a_billion CHECK (stock <= 1000000000);
