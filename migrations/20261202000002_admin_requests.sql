-- Admin writes sent with an `Idempotency-Key` header: the key, what the request asked, and
-- the answer it got, written in the same transaction as the change it made. A retry with
-- the same key and the same request gets the same answer and changes nothing again; the same
-- key with another request is refused. Kept for good: admin writes are few.

CREATE TABLE admin_requests (
    key        TEXT        PRIMARY KEY,
    -- The route and its input, as the service wrote them down.
    request    TEXT        NOT NULL,
    -- The answer: its status and the product it showed.
    status     SMALLINT    NOT NULL,
    product_id BIGINT      NOT NULL REFERENCES products (id),
    name       TEXT        NOT NULL,
    stock      BIGINT      NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
