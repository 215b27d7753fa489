#!/bin/sh
# Run by Patroni once, on the member that makes the cluster (bootstrap.post_bootstrap in
# patroni.yml), with the superuser's connection string as its argument: the service's
# database, and in it the two roles of deploy/postgres/roles.sql with the passwords the
# environment gives.
set -eu
psql -X -v ON_ERROR_STOP=1 -d "$1" -c 'CREATE DATABASE seckill'
psql -X -v ON_ERROR_STOP=1 -d "$1" -c '\connect seckill' \
    -v owner=seckill_owner -v owner_password="$SECKILL_OWNER_PASSWORD" \
    -v app=seckill_app -v app_password="$SECKILL_APP_PASSWORD" \
    -f /seckill/roles.sql
