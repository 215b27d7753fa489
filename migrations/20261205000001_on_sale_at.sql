-- The moment a product goes on sale. A purchase before it is refused with `not_open`.
--
-- Each instance checks it first, from what it read of the product (no lock, no queue, no
-- Redis key for a purchase that comes too early); the trigger below is what decides, on the
-- database's clock, so the opening is the same moment for every instance and every lock
-- strategy, `none` included. Products created before this column existed are open.

ALTER TABLE products ADD COLUMN on_sale_at TIMESTAMPTZ NOT NULL DEFAULT now();

-- One check per statement that inserts orders (a batch inserts all of its orders in one),
-- not one per order: the inserted rows are read from the statement's transition table.
-- SQLSTATE SK409 is this service's own: the service answers it `409 not_open`, and the
-- statement (with its stock write) is undone.
CREATE FUNCTION orders_only_once_on_sale() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_orders n JOIN products p ON p.id = n.product_id
               WHERE p.on_sale_at > statement_timestamp()) THEN
        RAISE EXCEPTION 'the sale of this product has not opened yet'
            USING ERRCODE = 'SK409';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER orders_only_once_on_sale
    AFTER INSERT ON orders
    REFERENCING NEW TABLE AS new_orders
    FOR EACH STATEMENT EXECUTE FUNCTION orders_only_once_on_sale();
