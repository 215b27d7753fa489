#!/bin/bash
# The official image's start-up, as far as the stack uses it: on first start, initdb with
# POSTGRES_PASSWORD for `postgres`, POSTGRES_HOST_AUTH_METHOD for connections over the network,
# POSTGRES_DB created, and the scripts of /docker-entrypoint-initdb.d run in name order (an
# executable .sh run, any other sourced, a .sql fed to psql); then the server, listening on
# every interface.
set -euo pipefail

if [ "${1:-}" != postgres ]; then
  exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
    echo "error: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:-}" > "$pwfile"
  initdb --username=postgres --pwfile="$pwfile" --auth-local=trust --auth-host="$auth" \
    -D "$PGDATA" > /dev/null
  rm -f "$pwfile"
  echo "host all all all $auth" >> "$PGDATA/pg_hba.conf"
  # As the official image: the set-up server answers only on the socket, so a client
  # (or a health check) that uses TCP sees the database only once it is complete.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
  db="${POSTGRES_DB:-postgres}"
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -U postgres -d postgres -qc "create database \"$db\""
  fi
  export POSTGRES_USER=postgres POSTGRES_DB="$db"
  for script in /docker-entrypoint-initdb.d/*; do
    case "$script" in
      *.sh) if [ -x "$script" ]; then "$script"; else . "$script"; fi ;;
      *.sql) psql -v ON_ERROR_STOP=1 -U postgres -d "$db" -q -f "$script" ;;
      *) [ -e "$script" ] && echo "ignoring $script" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
  echo "initialised $PGDATA (database $db, host auth $auth)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "${@:2}"
