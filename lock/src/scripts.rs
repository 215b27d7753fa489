//! The Lua scripts, each built once and run with EVALSHA (redis-rs reloads a script that
//! the server has forgotten, for example after a restart).
//!
//! Every script compares the caller's token before it touches the lock key, so no client can
//! extend or delete a lock it does not hold.

use std::sync::LazyLock;

use redis::Script;

/// Take the lock and a fence in one atomic step.
///
/// KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl in ms.
/// Returns the new fence (>= 1), or 0 when the lock is held.
/// `SET NX PX` sets the value and the expiry together: there is no moment at which the key
/// exists without a TTL. The fence counter has no TTL on purpose: it must never go back.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
",
    )
});

/// Delete the lock only if it still holds our token.
///
/// KEYS[1] lock key; ARGV[1] token. Returns 1 when deleted, 0 when the key was gone or
/// belonged to someone else (it is then left alone).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Push the expiry forward only if the lock still holds our token.
///
/// KEYS[1] lock key; ARGV[1] token, ARGV[2] ttl in ms.
/// Returns 1 when renewed, 0 when the key is gone, -1 when another owner holds it.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif holder then
  return -1
end
return 0
",
    )
});

/// Raise the fence counter past a fence some store has already seen, for the current holder
/// only.
///
/// KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] the highest fence seen.
/// Returns a new fence above both the counter and ARGV[2], or 0 when the caller no longer
/// holds the lock (a stale holder cannot use this to get past a store's fence check).
pub(crate) static ADVANCE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return redis.call('INCR', KEYS[2])
",
    )
});

/// Raise the fence counter to at least a floor, for the current holder only (Redlock's second
/// round: every node of the majority learns the fence the holder will use).
///
/// KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] floor.
/// Returns 1 when done, 0 when the caller does not hold the key on this node.
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
",
    )
});
