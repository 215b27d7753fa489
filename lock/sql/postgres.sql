-- distlock's PostgreSQL lock table (feature `postgres`), the database lock of the seed
-- articles. `PgLockTable::install` runs this; it is safe to run again.

-- One row per held lock. `name` is unique, so only one concurrent INSERT can win: that is
-- the mutual exclusion. A row whose `expires_at` has passed is free: the next acquire takes
-- it over in the same statement (no cleanup job is needed).
CREATE TABLE IF NOT EXISTS distlock_locks (
    name       TEXT        PRIMARY KEY CHECK (name <> ''),
    -- The holder's random token: only it can renew or release the row.
    token      TEXT        NOT NULL,
    -- The fence this acquisition took.
    fence      BIGINT      NOT NULL CHECK (fence > 0),
    -- Set from the database's own clock, never the client's.
    expires_at TIMESTAMPTZ NOT NULL
);

-- One counter per lock name. It outlives the lock rows (they come and go with every
-- acquisition), so a name's fences strictly increase for ever.
CREATE TABLE IF NOT EXISTS distlock_fences (
    name  TEXT   PRIMARY KEY,
    -- Never past 2^62 (distlock's Fence::MAX): an increment past it fails loudly.
    fence BIGINT NOT NULL CHECK (fence > 0 AND fence <= 4611686018427387904)
);
