#!/bin/bash
# As the official image: `redis-server` without a config file runs with protected mode off
# (other containers connect without a password), as the `redis` user.
set -euo pipefail
if [ "${1:-}" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
  if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
