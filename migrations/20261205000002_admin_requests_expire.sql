-- Idempotency keys are kept for 24 hours, not for good: a keyed admin write deletes the keys
-- older than that (and a key older than that is free again). Without it the table grew with
-- every keyed write for the life of the database. The service's queries name the 24 hours
-- (`repository::admin::KEYS_KEPT`); this index lets the deletion find the old keys without a
-- scan.

CREATE INDEX admin_requests_created_at ON admin_requests (created_at);
