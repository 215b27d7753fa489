//! The leases: one per acquisition (and another for a longer ttl), with ids chosen here and
//! remembered until the acquisition's unlock revokes them ([`Granted`]); granted, kept
//! alive and revoked through [`EtcdLock::call`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::LeaseGrantOptions;

use super::EtcdLock;
use super::members::{FAILED_PRECONDITION, has_status, lease_not_found};
use crate::token::Token;

impl EtcdLock {
    /// A new lease id for `token`'s acquisition of `key`, remembered before any grant of
    /// it is sent. Chosen here rather than by etcd so that it is known even when the
    /// grant's answer is lost: [`unlock`](crate::backend::Backend::unlock) then revokes it too, instead of
    /// leaving it (and a key a later put may have hung on it) until it runs out. etcd takes
    /// any id not in use and refuses one in use (see [`grant`](Self::grant)); two random
    /// 63-bit ids meet about once in 2^63 grants.
    pub(super) fn new_lease(&self, key: &str, token: &Token) -> i64 {
        let id = loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 {
                break id;
            }
        };
        self.leases.remember(key, token, id);
        id
    }

    /// Grant lease `id` for at least `ttl` (etcd counts leases in whole seconds, and may
    /// grant more than asked): the TTL granted, in seconds.
    pub(super) async fn grant(&self, id: i64, ttl: Duration) -> Result<i64, etcd::Error> {
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let granted = self
            .call(|mut client| async move {
                let options = LeaseGrantOptions::new().with_id(id);
                client.lease_grant(seconds, Some(options)).await
            })
            .await;
        match granted {
            Ok(granted) => Ok(granted.ttl()),
            // An earlier send of this grant was applied and its answer lost (`call` sent it
            // again to another member): the lease is ours, with at least what we asked for.
            Err(error) if has_status(&error, FAILED_PRECONDITION, "lease already exists") => {
                Ok(seconds)
            }
            Err(error) => Err(error),
        }
    }

    /// Revoke `lease`, which deletes the key on it; `false` if etcd no longer had it.
    pub(super) async fn revoke(&self, lease: i64) -> Result<bool, etcd::Error> {
        match self
            .call(|mut client| async move { client.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if lease_not_found(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Revoke every lease remembered for `token`'s acquisition of `key`, and `also` (the
    /// lease its key was found on), then forget them. Answers the first error, after trying
    /// them all; a lease that could not be revoked is forgotten too: nothing keeps it alive
    /// any more, so it runs out (with any key on it) within its TTL.
    pub(super) async fn revoke_all(
        &self,
        key: &str,
        token: &Token,
        also: Option<i64>,
    ) -> Result<(), etcd::Error> {
        self.revoke_each(key, self.leases.take(key, token), also)
            .await
    }

    /// Revoke `leases` (taken from what is remembered for an acquisition of `key`), and
    /// `also`. Answers the first error, after trying them all.
    pub(super) async fn revoke_each(
        &self,
        key: &str,
        mut leases: Vec<i64>,
        also: Option<i64>,
    ) -> Result<(), etcd::Error> {
        leases.extend(also.filter(|lease| *lease != 0 && !leases.contains(lease)));
        let mut first_error = None;
        for lease in leases {
            if let Err(error) = self.revoke(lease).await {
                tracing::warn!(%key, %error, lease, "could not revoke a lease; it runs out by itself");
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One keep-alive of `lease`; `false` if etcd no longer has it (it answered TTL 0:
    /// revoked, or run out).
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<bool, etcd::Error> {
        match self
            .call(|mut client| async move { client.lease_keep_alive(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            // etcd-client's answer to TTL 0 ("lease not found"); its only other
            // `LeaseKeepAliveError`, a request that could not be queued on a channel it has
            // just made, cannot happen.
            Err(etcd::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// The leases granted for each acquisition, by key and token, that its unlock has not
/// revoked yet: the `leases` of an [`EtcdLock`].
#[derive(Default)]
pub(super) struct Granted(Mutex<HashMap<(String, String), Vec<i64>>>);

impl Granted {
    pub(super) fn remember(&self, key: &str, token: &Token, lease: i64) {
        self.lock()
            .entry((key.to_owned(), token.as_str().to_owned()))
            .or_default()
            .push(lease);
    }

    /// Stop remembering `lease` (it was revoked, or it is gone).
    pub(super) fn forget(&self, key: &str, token: &Token, lease: i64) {
        let mut granted = self.lock();
        let acquisition = (key.to_owned(), token.as_str().to_owned());
        if let Some(leases) = granted.get_mut(&acquisition) {
            leases.retain(|&id| id != lease);
            if leases.is_empty() {
                granted.remove(&acquisition);
            }
        }
    }

    /// Every lease remembered for the acquisition, forgotten.
    pub(super) fn take(&self, key: &str, token: &Token) -> Vec<i64> {
        self.lock()
            .remove(&(key.to_owned(), token.as_str().to_owned()))
            .unwrap_or_default()
    }

    /// How many acquisitions have leases remembered.
    #[cfg(test)]
    pub(super) fn acquisitions(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Vec<i64>>> {
        // Never held across an await, and nothing in it panics: a poisoned map is still
        // a good one.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::Backend;
    use crate::etcd::EtcdLock;
    use crate::token::Token;

    /// A handle whose member is never reached (the client connects lazily).
    async fn offline() -> EtcdLock {
        EtcdLock::connect(["http://127.0.0.1:1"]).await.unwrap()
    }

    #[tokio::test]
    async fn unlocks_that_fail_leave_nothing_remembered_of_their_acquisitions() {
        // Arrange: a handle whose member is never reached, as in an outage.
        let lock = offline().await;

        // Act: acquisitions whose grant fails (a lease is remembered before it is sent),
        // each followed by the locker's unlock, which fails too.
        for _ in 0..10 {
            let token = Token::new();
            let tried = lock.try_lock("k", &token, Duration::from_secs(5)).await;
            assert!(tried.is_err(), "{tried:?}");
            let unlocked = lock.unlock("k", &token).await;
            assert!(unlocked.is_err(), "{unlocked:?}");
        }

        // Assert: the leases nobody keeps alive run out by themselves; none is kept here.
        assert_eq!(lock.leases.acquisitions(), 0);
    }
}
