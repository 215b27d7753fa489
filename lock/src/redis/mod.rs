//! The lock on one Redis: every step is one Lua script from `scripts`.
//!
//! Implemented for every [`ConnectionLike`] that can be cloned: a
//! [`ConnectionManager`](redis::aio::ConnectionManager) (reconnects after a restart), a
//! `MultiplexedConnection`, or a Redis Cluster connection. Every script touches only the
//! lock key and its fence key, which [`fence_key`] puts in one slot, so
//! each lock lives on one cluster node.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError};

use crate::backend::{Attempt, Backend, LockState, Renewal, Unlock};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::options::LockOptions;
use crate::token::Token;
use scripts::{ACQUIRE, ADVANCE_FENCE, FORCE_UNLOCK, INSPECT, RELEASE, RENEW};

mod keys;
pub(crate) mod scripts;

pub(crate) use keys::check as check_key;
pub use keys::{fence_key, release_channel};

impl From<RedisError> for Error {
    fn from(error: RedisError) -> Self {
        Error::backend("redis", error)
    }
}

/// The oldest Redis the lock runs on: `SET ... NX PX ... GET` came with 7.0.
pub(crate) const OLDEST_REDIS: (u32, u32) = (7, 0);

impl<C> Backend for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn check_key(&self, key: &str) -> Result<()> {
        check_key(key)
    }

    /// Any option: `WAIT` works on a Redis with replicas (and answers 0 without any).
    fn check_options(&self, _options: &LockOptions) -> Result<()> {
        Ok(())
    }

    async fn check_server(&self) -> Result<()> {
        let info: redis::Value = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.clone())
            .await?;
        check_versions(&info, "Redis")
    }

    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let (taken, value): (i64, String) = ACQUIRE
            .key(key)
            .key(fence_key(key)?)
            .arg(token.as_str())
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.clone())
            .await
            .map_err(too_old)?;
        if taken == 1 {
            return Ok(Attempt::Acquired(parse_fence(&value)?));
        }
        let pttl: i64 = value.parse().unwrap_or(-1);
        Ok(Attempt::Held {
            expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
        })
    }

    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        let renewed: i64 = RENEW
            .key(key)
            .arg(token.as_str())
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.clone())
            .await?;
        Ok(match renewed {
            1 => Renewal::Renewed,
            0 => Renewal::Gone,
            _ => Renewal::Taken,
        })
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        let released: i64 = RELEASE
            .key(key)
            .arg(token.as_str())
            .arg(release_channel(key)?)
            .invoke_async(&mut self.clone())
            .await?;
        Ok(match released {
            1 => Unlock::Released,
            0 => Unlock::Gone,
            _ => Unlock::Taken,
        })
    }

    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        let fence: Option<String> = ADVANCE_FENCE
            .key(key)
            .key(fence_key(key)?)
            .arg(token.as_str())
            .arg(seen.get())
            .invoke_async(&mut self.clone())
            .await?;
        fence.as_deref().map(parse_fence).transpose()
    }

    async fn wait_for_replicas(&self, replicas: u32, timeout: Duration) -> Result<u32> {
        // `WAIT` counts the replicas that acknowledged every write this connection sent so
        // far: ours, if it went on this same connection (on a shared multiplexed
        // connection, others' too). A connection made since then counts none of ours
        // (see `LockGuard::replicas`).
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis().max(1) as u64)
            .query_async(&mut self.clone())
            .await?;
        Ok(u32::try_from(acked).unwrap_or(0))
    }

    async fn inspect(&self, key: &str) -> Result<LockState> {
        let (pttl, fence): (i64, String) = INSPECT
            .key(key)
            .key(fence_key(key)?)
            .invoke_async(&mut self.clone())
            .await?;
        Ok(LockState {
            held: pttl != -2,
            expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence: (!fence.is_empty())
                .then(|| parse_fence(&fence))
                .transpose()?,
            waiting: None,
        })
    }

    async fn force_unlock(&self, key: &str) -> Result<bool> {
        let deleted: i64 = FORCE_UNLOCK
            .key(key)
            .arg(release_channel(key)?)
            .invoke_async(&mut self.clone())
            .await?;
        Ok(deleted == 1)
    }
}

/// `redis_version` in the `INFO server` text (one string, or one per node from a cluster
/// connection) is at least [`OLDEST_REDIS`].
pub(crate) fn check_versions(info: &redis::Value, server: &str) -> Result<()> {
    let mut texts = Vec::new();
    collect_texts(info, &mut texts);
    let mut seen = false;
    for text in &texts {
        for version in text
            .lines()
            .filter_map(|line| line.strip_prefix("redis_version:"))
        {
            seen = true;
            let version = version.trim();
            if !at_least(version, OLDEST_REDIS) {
                return Err(Error::UnsupportedServer {
                    server: server.to_owned(),
                    version: version.to_owned(),
                    needed: "Redis 7.0",
                });
            }
        }
    }
    if !seen {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "INFO server named no redis_version",
        ))
        .into());
    }
    Ok(())
}

fn collect_texts(value: &redis::Value, texts: &mut Vec<String>) {
    match value {
        redis::Value::BulkString(bytes) => texts.push(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::VerbatimString { text, .. } | redis::Value::SimpleString(text) => {
            texts.push(text.clone())
        }
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|item| collect_texts(item, texts))
        }
        redis::Value::Map(pairs) => pairs
            .iter()
            .for_each(|(_, item)| collect_texts(item, texts)),
        _ => {}
    }
}

/// Whether `version` (`major.minor.patch`) is at least `(major, minor)`. A version that
/// cannot be read is taken as new enough (a fork may spell it otherwise; the acquire's own
/// error then still names the cause).
fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|part| part.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(have_major)), Some(Ok(have_minor))) => (have_major, have_minor) >= (major, minor),
        _ => true,
    }
}

/// The error an acquire gets from a Redis before 7.0, which does not know `SET ... GET`
/// with `NX` (`ERR syntax error`), as an error that says so.
fn too_old(error: RedisError) -> Error {
    if error.kind() == ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && error.to_string().contains("syntax error")
    {
        return Error::UnsupportedServer {
            server: "Redis".to_owned(),
            version: "before 7.0 (SET with both NX and GET is refused)".to_owned(),
            needed: "Redis 7.0",
        };
    }
    error.into()
}

/// A fence as a script returns it: a decimal string (see [`scripts`]).
pub(crate) fn parse_fence(value: &str) -> Result<Fence> {
    match value.parse::<u64>() {
        Ok(fence) if fence > 0 && fence <= Fence::MAX => Ok(Fence(fence)),
        _ => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "the fence counter does not hold a positive 64-bit integer",
            value.to_owned(),
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS_6_INFO: &str =
        "# Server\r\nredis_version:6.0.16\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n";

    #[test]
    fn a_version_before_7_0_is_refused_and_named() {
        let info = redis::Value::BulkString(REDIS_6_INFO.as_bytes().to_vec());
        match check_versions(&info, "Redis at test") {
            Err(Error::UnsupportedServer { version, .. }) => assert_eq!(version, "6.0.16"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn versions_from_7_0_on_are_accepted_on_every_node() {
        for version in ["7.0.0", "7.0.15", "7.2.4", "8.0.1", "10.1.0"] {
            assert!(at_least(version, OLDEST_REDIS), "{version}");
        }
        for version in ["6.2.14", "6.0.16", "5.0.7"] {
            assert!(!at_least(version, OLDEST_REDIS), "{version}");
        }
        let nodes = redis::Value::Map(vec![
            (
                redis::Value::SimpleString("a".into()),
                redis::Value::BulkString(b"redis_version:7.2.0\r\n".to_vec()),
            ),
            (
                redis::Value::SimpleString("b".into()),
                redis::Value::BulkString(b"redis_version:6.2.0\r\n".to_vec()),
            ),
        ]);
        assert!(matches!(
            check_versions(&nodes, "a cluster"),
            Err(Error::UnsupportedServer { .. })
        ));
    }
}
