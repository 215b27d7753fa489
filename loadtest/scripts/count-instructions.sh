#!/usr/bin/env bash
# Instructions per request of one route, counted by callgrind: repeatable whatever else the
# machine is doing, unlike requests/s. Counts only inside actix's HTTP/1 connection task
# (parsing, routing, the handler, the answer), not start-up or background tasks.
#
#   cargo build --release -p seckill
#   loadtest/scripts/count-instructions.sh sold-out   # POST purchase of a sold-out product
#   loadtest/scripts/count-instructions.sh healthz    # GET /healthz
#
# Needs valgrind, wrk, curl, psql, PostgreSQL and Redis (DATABASE_ADMIN_URL, REDIS_URL);
# uses a throwaway database and its own Redis key prefix. RUST_LOG as for the service
# (default here: info, the service's default).
set -euo pipefail
what=${1:?usage: $0 sold-out|healthz}
bin=${SECKILL_BIN:-target/release/seckill}
admin_url=${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
port=${PORT:-18390}
db="count_instructions_$$"
work=$(mktemp -d)
token=count-instructions-admin-token
psql -q "$admin_url" -c "create database $db" >/dev/null
cleanup() {
    [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    psql -q "$admin_url" -c "drop database if exists $db" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
RUST_LOG=${RUST_LOG:-info} DATABASE_URL="${admin_url%/*}/$db" REDIS_KEY_PREFIX="count-instructions-$$:" \
    ADMIN_TOKEN=$token BIND_ADDR=127.0.0.1:$port \
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "--toggle-collect=*actix_http::h1::dispatcher::Dispatcher*as core::future::future::Future>::poll" \
    "$bin" >"$work/log" 2>&1 &
pid=$!
url=http://127.0.0.1:$port
for _ in $(seq 300); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.2; done
curl -sf "$url/healthz" >/dev/null || { cat "$work/log"; exit 1; }
id=$(curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d '{"name": "counted", "stock": 1}' "$url/api/products" | sed 's/.*"id":\([0-9]*\).*/\1/')
# Sell it out, then one purchase teaches the instance (already, it answers from memory).
for user in 1 2; do
    curl -s -o /dev/null -X POST -H 'Content-Type: application/json' -d "{\"user_id\": $user}" \
        "$url/api/products/$id/purchase"
done
case $what in
sold-out)
    printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' \
        "'{\"user_id\": 3}'" >"$work/script.lua"
    path=/api/products/$id/purchase ;;
healthz)
    echo 'wrk.method = "GET"' >"$work/script.lua"
    path=/healthz ;;
*) echo "unknown route $what" >&2; exit 2 ;;
esac
requests=$(wrk -t1 -c8 -d6s -s "$work/script.lua" "$url$path" | awk '/requests in/ {print $1}')
kill "$pid"; wait "$pid" || true; pid=
total=$(awk '/^summary:/ {print $2}' "$work/callgrind.out")
# The 5 requests before the run (two health checks, the product, two purchases) count too.
echo "$what: $requests requests, $((total / (requests + 5))) instructions per request"
