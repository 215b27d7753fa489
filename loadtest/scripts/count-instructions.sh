#!/usr/bin/env bash
# Instructions per request of one route, counted by callgrind: far steadier than requests/s
# on a shared machine. Counts only inside actix's HTTP/1 connection task (parsing, the
# sold-out lane or the router and the handler, the answer), not start-up or background tasks.
#
#   cargo build --release -p seckill                   # from the repository's root
#   loadtest/scripts/count-instructions.sh sold-out   # POST purchase of a sold-out product
#   loadtest/scripts/count-instructions.sh healthz    # GET /healthz
#
# Needs valgrind, wrk, curl, psql and redis-cli; PostgreSQL (DATABASE_ADMIN_URL, a role that
# may create databases) and Redis (REDIS_URL). Uses a throwaway database and its own Redis
# key prefix, both removed at the end. RUST_LOG as for the service (default: info, the
# service's default). SECKILL_BIN picks another build.
set -euo pipefail
what=${1:?usage: $0 sold-out|healthz}
case $what in sold-out | healthz) ;; *) echo "unknown route $what (sold-out or healthz)" >&2; exit 2 ;; esac
bin=${SECKILL_BIN:-target/release/seckill}
[[ -x $bin ]] || { echo "no $bin: build it first (cargo build --release -p seckill)" >&2; exit 2; }
admin_url=${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
port=${PORT:-18390}
db="count_instructions_$$"
prefix="count-instructions-$$:"
token=count-instructions-admin-token
pid= work=
cleanup() {
    if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    psql -q "$admin_url" -c "drop database if exists $db" >/dev/null 2>&1 || true
    redis-cli -u "$redis_url" --scan --pattern "$prefix*" | xargs -r redis-cli -u "$redis_url" del >/dev/null || true
    redis-cli -u "$redis_url" --scan --pattern "{$prefix*" | xargs -r redis-cli -u "$redis_url" del >/dev/null || true
    if [[ -n $work ]]; then rm -rf "$work"; fi
}
trap cleanup EXIT
work=$(mktemp -d)
psql -q "$admin_url" -c "create database $db" >/dev/null
# A sold-out mark trusted for the whole run: no purchase reaches the database during it.
RUST_LOG=${RUST_LOG:-info} DATABASE_URL="${admin_url%/*}/$db" REDIS_URL="$redis_url" \
    REDIS_KEY_PREFIX="$prefix" ADMIN_TOKEN=$token BIND_ADDR=127.0.0.1:$port \
    SOLD_OUT_RECHECK_MS=600000 \
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "--toggle-collect=*actix_http::h1::dispatcher::Dispatcher*as core::future::future::Future>::poll" \
    "$bin" >"$work/log" 2>&1 &
pid=$!
url=http://127.0.0.1:$port
until curl -sf "$url/healthz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the service stopped:" >&2; cat "$work/log" >&2; pid=; exit 1; }
    sleep 0.2
done
id=$(curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d '{"name": "counted", "stock": 1}' "$url/api/products" | sed 's/.*"id":\([0-9]*\).*/\1/')
buy() {
    curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        -d "{\"user_id\": $1}" "$url/api/products/$id/purchase"
}
# Sell it out: the instance sees the stock reach 0, and answers the next buyer from memory.
[[ $(buy 1) == 201 && $(buy 2) == 409 ]] || { echo "the product did not sell out" >&2; exit 1; }
if [[ $what == sold-out ]]; then
    printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' \
        "'{\"user_id\": 3}'" >"$work/script.lua"
    path=/api/products/$id/purchase
else
    echo 'wrk.method = "GET"' >"$work/script.lua"
    path=/healthz
fi
wrk -t1 -c8 -d6s -s "$work/script.lua" "$url$path" >"$work/wrk" 2>&1 || true
requests=$(awk '/requests in/ {print $1}' "$work/wrk")
[[ $requests =~ ^[1-9][0-9]*$ ]] || { echo "wrk measured nothing:" >&2; cat "$work/wrk" >&2; exit 1; }
# Every sold-out request must have been answered 409 (wrk counts them as non-2xx).
if [[ $what == sold-out ]]; then
    refused=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$work/wrk")
    [[ ${refused:-0} == "$requests" ]] || { echo "not every answer was 409:" >&2; cat "$work/wrk" >&2; exit 1; }
fi
kill "$pid"; wait "$pid" || true; pid=
total=$(awk '/^summary:/ {print $2}' "$work/callgrind.out")
# Counted too: the health checks that answered (at least one), the product, two purchases
# (one a database batch). Over thousands of requests they shift the figure by under 1 %.
echo "$what: $requests requests, $((total / requests)) instructions per request"
