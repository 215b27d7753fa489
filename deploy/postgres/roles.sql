-- The two roles of a seckill deployment, made by a superuser in the service's database
-- before the service first starts (roles belong to the whole cluster: a second deployment
-- on the same cluster gives its roles other names):
--
--   psql -d seckill -v owner=seckill_owner -v owner_password='...' \
--        -v app=seckill_app -v app_password='...' -f deploy/postgres/roles.sql
--
-- - The owner makes the schema: migrations (and, under pg-lock, the lock table) run as this
--   role, through DATABASE_MIGRATION_URL (`seckill --migrate-only`, as a deployment job).
-- - The app is what the service sells as, through DATABASE_URL: it reads and writes rows of
--   the owner's tables and uses their sequences, and nothing else. It cannot create (not
--   even a temporary table), alter, drop or truncate a table, and is no superuser.
--
-- app/tests/api/privileges.rs (`the_service_sells_as_a_role_that_cannot_change_the_schema`)
-- runs this file and the service under the two roles it makes.

\set ON_ERROR_STOP on

CREATE ROLE :"owner" LOGIN PASSWORD :'owner_password';
CREATE ROLE :"app" LOGIN PASSWORD :'app_password';

-- Only these two connect (superusers always can), and nobody makes temporary tables.
REVOKE CONNECT, TEMPORARY ON DATABASE :"DBNAME" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"DBNAME" TO :"owner", :"app";

-- The owner creates in the public schema; nobody else does (PostgreSQL 15 already keeps
-- PUBLIC out; older versions do not).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO :"owner";
GRANT USAGE ON SCHEMA public TO :"app";

-- Every table and sequence the owner makes from now on: rows and sequence values for the
-- app, no other privilege (no TRUNCATE, REFERENCES or TRIGGER).
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"app";
