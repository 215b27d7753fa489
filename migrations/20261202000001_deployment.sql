-- Which deployment this database belongs to: a random id made once, when the database is
-- set up. Restock news between instances travels on a Redis channel named after it, so two
-- deployments that share a Redis (and a REDIS_KEY_PREFIX) never hear each other's restocks.

CREATE TABLE deployment (
    id      UUID    NOT NULL DEFAULT gen_random_uuid(),
    -- One row only.
    one_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (one_row)
);

INSERT INTO deployment DEFAULT VALUES;
