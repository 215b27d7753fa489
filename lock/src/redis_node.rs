//! The lock on one Redis: every step is one Lua script from [`scripts`](crate::scripts).
//!
//! Implemented for every [`ConnectionLike`] that can be cloned: a
//! [`ConnectionManager`](redis::aio::ConnectionManager) (reconnects after a restart), a
//! `MultiplexedConnection`, or a Redis Cluster connection. Every script touches only the
//! lock key and its fence key, which [`fence_key`](crate::fence_key) puts in one slot, so
//! each lock lives on one cluster node.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError};

use crate::backend::{Attempt, Backend, Renewal, Unlock};
use crate::error::Result;
use crate::fenced::Fence;
use crate::keys::{fence_key, release_channel};
use crate::scripts::{ACQUIRE, ADVANCE_FENCE, RELEASE, RENEW};
use crate::token::Token;

impl<C> Backend for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn check_key(&self, key: &str) -> Result<()> {
        crate::keys::check(key)
    }

    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let (taken, value): (i64, String) = ACQUIRE
            .key(key)
            .key(fence_key(key)?)
            .arg(token.as_str())
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut self.clone())
            .await?;
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
}

/// A fence as a script returns it: a decimal string (see [`scripts`](crate::scripts)).
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
