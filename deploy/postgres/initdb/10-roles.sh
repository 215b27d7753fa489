#!/bin/sh
# Run by the postgres image once, when it makes the database (docker-compose.yml mounts this
# directory as /docker-entrypoint-initdb.d): the two roles of deploy/postgres/roles.sql,
# with the passwords the environment gives.
set -eu
psql -X -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v owner=seckill_owner -v owner_password="$SECKILL_OWNER_PASSWORD" \
    -v app=seckill_app -v app_password="$SECKILL_APP_PASSWORD" \
    -f /seckill/roles.sql
