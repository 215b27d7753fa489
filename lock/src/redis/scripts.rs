//! The Lua scripts, each built once and run with EVALSHA (redis-rs reloads a script that
//! the server has forgotten, for example after a restart).
//!
//! Every script compares the caller's token before it touches the lock key, so no client can
//! extend or delete a lock it does not hold. Re-sent after a lost reply, the acquire and the
//! renewal give the same answer as the first try; a release whose first try ran answers
//! "gone" (the guard then reports it released while its lease runs), and a fence advance
//! hands out one more fence.
//!
//! A script that refuses (a fence counter that no fence can follow, a fence past the largest)
//! answers an error reply whose code is [`REFUSAL`], so that a caller can tell a refusal from
//! a server that cannot serve (`BUSY`, `OOM`, `LOADING`, ...): Redlock names a refusal for
//! what it is, and counts the others as a master out of reach.
//!
//! Fences never pass through a Lua number: Lua's numbers are doubles, exact only below 2^53,
//! and a fence may be any positive `i64`. They are read with `GET`, compared as decimal
//! strings ([`COMMON`]'s `above`), and returned as strings; Redis's own `INCR` does the
//! arithmetic.

use std::sync::LazyLock;

use redis::Script;

/// The code of every refusal a script answers (`FENCE the fence counter of ... holds no
/// count`).
pub(crate) const REFUSAL: &str = "FENCE";

/// Whether `error` is a script's refusal ([`REFUSAL`]) rather than a server that cannot serve.
pub(crate) fn is_refusal(error: &redis::RedisError) -> bool {
    error.code() == Some(REFUSAL)
}

/// Helpers put in front of the scripts that handle fences.
///
/// `above(a, b)`: whether decimal string `a` is a larger number than `b` (no signs, no
/// leading zeros, as Redis writes integers). `counted(v)`: whether `v` is a count written
/// so, from 0 up, as every counter this crate writes is. `clock()`: the server's clock, in
/// microseconds since the epoch, as a decimal string (seconds and zero-padded microseconds,
/// joined).
///
/// `next_fence(key, now)`: the counter's next fence, written back: `max(counter + 1, now)`,
/// `now` being the clock read at this acquisition, so every fence is at least the server's
/// clock reading at the acquisition that took it. Usually the clock is ahead of the counter
/// (it followed the clock at the last acquisition), and one `SET ... GET` writes the clock
/// and reads the counter it replaced; only a counter at the clock or past it is put back and
/// counted on with `INCR`. Below 2^53 (`EXACT`) `INCR`'s answer is exact as a Lua number and
/// is formatted as an integer; above, it is read back as a string. `nil` and why, with the
/// counter left as it was, when no fence can follow it: it has reached `MAX`
/// ([`Fence::MAX`](crate::Fence::MAX), 2^62), or it holds something other than a count
/// (`counted`: only a hand-made value can).
///
// TIMING: whatever state the counter is in (never used, lost, or set back by a failover to
// a replica that missed the last acquisitions, or a restore from an older snapshot), the
// fence handed out is at least the clock now, and every fence handed out before was at most
// `max(its counter, the clock then)`. A counter that only ever followed the clock stays
// below it as long as the key is taken less than once per microsecond on average, so a fence
// from before the failover is below the clock now, provided the Redis hosts' clocks do not
// step back. (A counter raised past the clock by `advance_fence`, or by Redlock's second
// round to a node clock ahead of this node's, loses that guarantee until the clock catches
// up; meanwhile each acquisition takes the `INCR` way, two calls more.)
const COMMON: &str = r"
local MAX = '4611686018427387904'
local EXACT = 9007199254740992
local function above(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function counted(v)
  return v == '0' or string.find(v, '^[1-9]%d*$') ~= nil
end
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end
local function next_fence(fence_key, now)
  local last = redis.call('SET', fence_key, now, 'GET')
  if not last or (counted(last) and above(now, last)) then
    return now
  end
  -- Not a count, or at the clock or past it (taken twice in one microsecond, or raised):
  -- put back, and counted on from there if it can be.
  redis.call('SET', fence_key, last)
  if not counted(last) then
    return nil, 'holds no count'
  end
  if not above(MAX, last) then
    return nil, 'is at its maximum'
  end
  local n = redis.call('INCR', fence_key)
  if n < EXACT then
    return string.format('%d', n)
  end
  return redis.call('GET', fence_key)
end
";

fn with_common(body: &str) -> Script {
    Script::new(&format!("{COMMON}{body}"))
}

/// Take the lock and a fence in one atomic step.
///
/// KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl in ms.
/// Returns `{1, fence}` when the lock is ours, `{0, pttl}` when another token holds it.
///
/// `SET NX PX` sets the value and the expiry together: there is no moment at which the key
/// exists without a TTL. The fence counter has no TTL on purpose: it must never go back; and
/// every fence is at least the server's clock in microseconds (`next_fence`), so a counter
/// that Redis lost or that came back behind (a restart without persistence, an eviction, a
/// failover to a lagging replica) still hands out fences above every one it handed out.
///
/// `SET NX GET` takes the key and tells what was there in one call. A re-sent request whose
/// first try took the lock finds its own token and returns the fence it took, instead of
/// reporting the lock held (by itself) and leaving it set for a whole ttl with no watchdog.
/// A counter that no fence can follow (at its maximum, or holding no count) takes the key
/// back off and answers an error.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    with_common(
        r"
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if holder == ARGV[1] then
  local fence = redis.call('GET', KEYS[2])
  if fence then
    return {1, fence}
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence, why = next_fence(KEYS[2], clock())
if not fence then
  redis.call('DEL', KEYS[1])
  return redis.error_reply('FENCE the fence counter of ' .. KEYS[1] .. ' ' .. why)
end
return {1, fence}
",
    )
});

/// Delete the lock only if it still holds our token, and announce it.
///
/// KEYS[1] lock key; ARGV[1] token, ARGV[2] release channel.
/// Returns 1 when deleted (and a message is published on the channel, for waiters), 0 when
/// the key was gone, -1 when another owner holds it (it is then left alone).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
elseif holder then
  return -1
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
/// Returns a new fence above the counter, ARGV[2] and the clock; nil when the caller no longer
/// holds the lock (a stale holder cannot use this to get past a store's fence check).
pub(crate) static ADVANCE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    with_common(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return false
end
if not above(MAX, ARGV[2]) then
  return redis.error_reply('FENCE no fence can follow ' .. ARGV[2])
end
local current = redis.call('GET', KEYS[2]) or '0'
if not counted(current) then
  return redis.error_reply('FENCE the fence counter of ' .. KEYS[1] .. ' holds no count')
end
if above(ARGV[2], current) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local fence, why = next_fence(KEYS[2], clock())
if not fence then
  return redis.error_reply('FENCE the fence counter of ' .. KEYS[1] .. ' ' .. why)
end
return fence
",
    )
});

/// Raise the fence counter to at least a floor, for the current holder only (Redlock's second
/// round: every node of the majority learns the fence the holder will use).
///
/// KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] floor.
/// Returns 1 when done, 0 when the caller does not hold the key on this node.
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    with_common(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if above(ARGV[2], MAX) then
  return redis.error_reply('FENCE no fence can be above the largest')
end
local current = redis.call('GET', KEYS[2]) or '0'
if not counted(current) then
  return redis.error_reply('FENCE the fence counter of ' .. KEYS[1] .. ' holds no count')
end
if above(ARGV[2], current) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
",
    )
});

/// What an operator sees of a lock: its remaining lease and its counter.
///
/// KEYS[1] lock key, KEYS[2] fence key. Returns `{pttl, fence}`: the lock key's `PTTL`
/// (-2 when there is no lock) and the counter as a string (empty when there is none).
/// Reads only.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
",
    )
});

/// Delete the lock whoever holds it, and wake its waiters (for operators).
///
/// KEYS[1] lock key; ARGV[1] release channel. Returns 1 when there was a lock, else 0.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], '')
  return 1
end
return 0
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_fence` with the clock given (`NOW`), on a real Redis, against a counter in each
    /// state it can be in: the fence handed out, why none, and the counter left.
    #[tokio::test]
    async fn next_fence_takes_the_clock_or_counts_on_from_a_counter_at_or_past_it() {
        const NOW: &str = "1700000000000000";
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        // TIMING: 10 s for an answer, not redis-rs's 500 ms, which a busy CI machine exceeds.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(10)));
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("a Redis at REDIS_URL (default 127.0.0.1:6379)");
        let prefix = testkit::unique_prefix("next-fence");
        // The counter has no TTL: deleted when the test ends, however it ends.
        let _cleanup = testkit::PrefixCleanup::new(&url, &prefix);
        let key = format!("{prefix}counter");
        let next = with_common(
            r"
local fence, why = next_fence(KEYS[1], ARGV[1])
return {fence or false, why or false, redis.call('GET', KEYS[1]) or false}
",
        );
        // (counter before, fence, why none, counter after)
        type Case = (
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: [Case; 14] = [
            (None, Some(NOW), None, Some(NOW)),
            (Some("0"), Some(NOW), None, Some(NOW)),
            (Some("1699999999999999"), Some(NOW), None, Some(NOW)),
            // Taken twice in one microsecond: one more than the clock, never the clock again.
            (
                Some(NOW),
                Some("1700000000000001"),
                None,
                Some("1700000000000001"),
            ),
            (
                Some("1700000000000001"),
                Some("1700000000000002"),
                None,
                Some("1700000000000002"),
            ),
            (
                Some("9007199254740991"),
                Some("9007199254740992"),
                None,
                Some("9007199254740992"),
            ),
            (
                Some("9007199254740993"),
                Some("9007199254740994"),
                None,
                Some("9007199254740994"),
            ),
            (
                Some("4611686018427387903"),
                Some(MAX_FENCE),
                None,
                Some(MAX_FENCE),
            ),
            (
                Some(MAX_FENCE),
                None,
                Some("is at its maximum"),
                Some(MAX_FENCE),
            ),
            // Not a count as Redis writes one: refused and left as it is.
            (Some("abc"), None, Some("holds no count"), Some("abc")),
            (Some("-5"), None, Some("holds no count"), Some("-5")),
            (Some(""), None, Some("holds no count"), Some("")),
            (Some("007"), None, Some("holds no count"), Some("007")),
            (
                Some("01700000000000005"),
                None,
                Some("holds no count"),
                Some("01700000000000005"),
            ),
        ];
        for (before, fence, why, after) in cases {
            match before {
                Some(value) => {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(value)
                        .query_async::<()>(&mut conn)
                        .await
                }
                None => {
                    redis::cmd("DEL")
                        .arg(&key)
                        .query_async::<()>(&mut conn)
                        .await
                }
            }
            .unwrap();
            let got: (Option<String>, Option<String>, Option<String>) = next
                .key(&key)
                .arg(NOW)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            let want = (fence, why, after);
            assert_eq!(
                (got.0.as_deref(), got.1.as_deref(), got.2.as_deref()),
                want,
                "counter {before:?}"
            );
        }
    }

    const MAX_FENCE: &str = "4611686018427387904";
}
