//! The line of a lock: its keys, read in create-revision order; the step that joins it
//! ([`EtcdLock::join`]); moving our key to a new lease; and revoking the head's lease (a
//! forced unlock). What a step reads of the line is read in one transaction, at one
//! revision.

use std::time::Duration;

use etcd_client as etcd;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::EtcdLock;
use crate::backend::Renewal;
use crate::fence::Fence;
use crate::token::Token;

impl EtcdLock {
    /// The prefix of every contender key for `key`, `/` included.
    pub(super) fn line_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    pub(super) fn own_key(&self, key: &str, token: &Token) -> String {
        format!("{}{}", self.line_prefix(key), token.as_str())
    }

    // The reads of a line. Each is one operation of a transaction, so that the reads a step
    // needs are made at one revision.
    /// Our own key.
    pub(super) fn read_own(&self, key: &str, token: &Token) -> TxnOp {
        TxnOp::get(self.own_key(key, token), None)
    }

    /// The first key of the line: the holder's.
    pub(super) fn read_head(&self, key: &str) -> TxnOp {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        TxnOp::get(self.line_prefix(key), Some(first))
    }

    /// The key created just before `revision`: the one a waiter at `revision` watches.
    pub(super) fn read_before(&self, key: &str, revision: i64) -> TxnOp {
        let last_before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        TxnOp::get(self.line_prefix(key), Some(last_before))
    }

    /// Run `reads` in one transaction: the revision they were made at, and what each found.
    pub(super) async fn read<const N: usize>(
        &self,
        reads: [TxnOp; N],
    ) -> Result<(i64, [Option<etcd::KeyValue>; N]), etcd::Error> {
        let answer = self.txn(Txn::new().and_then(reads)).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let replies = answer.op_responses();
        Ok((revision, std::array::from_fn(|i| first_kv(replies.get(i)))))
    }

    /// Our key and the head of the line, read together.
    pub(super) async fn look(&self, key: &str, token: &Token) -> Result<Look, etcd::Error> {
        let (_, [own, head]) = self
            .read([self.read_own(key, token), self.read_head(key)])
            .await?;
        Ok(Look {
            own: own.map(|kv| Own::of(&kv)),
            head: head.map(|kv| kv.create_revision()),
        })
    }

    /// Put our key on `lease` (granted for `granted` seconds) unless it is there already (a
    /// retried step); answers our key's create revision, the lease it is on, and the first
    /// key of the line.
    pub(super) async fn join(
        &self,
        key: &str,
        token: &Token,
        lease: i64,
        granted: i64,
    ) -> Result<Joined, etcd::Error> {
        let own = self.own_key(key, token);
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
                .and_then([
                    // The value is the lease's TTL: a renewal for a longer ttl needs a new
                    // lease.
                    TxnOp::put(
                        own.clone(),
                        granted.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    self.read_head(key),
                ])
                .or_else([self.read_own(key, token), self.read_head(key)]);
            let answer = self.txn(txn).await?;
            let replies = answer.op_responses();
            let head_revision = first_kv(replies.get(1)).map(|kv| kv.create_revision());
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                return Ok(Joined {
                    revision,
                    lease,
                    head_revision,
                });
            }
            // Our key was there already, from an earlier send of this step.
            let kv = first_kv(replies.first()).ok_or_else(|| {
                etcd::Error::Internal("the transaction found our key and then did not".into())
            })?;
            let joined = Joined {
                revision: kv.create_revision(),
                lease: kv.lease(),
                head_revision,
            };
            if kv.lease() == lease {
                // `call` sent this very transaction again after its answer was lost: the key
                // is on our lease, which must stay.
                return Ok(joined);
            }
            // A retried acquisition, with a lease of its own: the key stays where it is, on
            // the lease of the first try.
            // TIMING: that lease was last granted or kept alive before this step was sent;
            // kept alive now, it lasts the ttl from after the caller sent the step.
            if self.keep_alive(kv.lease()).await? {
                if self.revoke(lease).await.is_ok() {
                    self.leases.forget(key, token, lease);
                }
                return Ok(joined);
            }
            // That lease has just run out, and our key went with it: join again, on ours.
        }
    }

    /// Move our key (`own`) to a new lease of at least `ttl`: a keep-alive starts a lease
    /// again with the TTL it was granted, so a longer ttl
    /// ([`LockGuard::extend`](crate::LockGuard::extend)) needs a new lease. `false` if our
    /// key is gone.
    pub(super) async fn re_lease(
        &self,
        key: &str,
        token: &Token,
        own: Own,
        ttl: Duration,
    ) -> Result<bool, etcd::Error> {
        let lease = self.new_lease(key, token);
        let granted = self.grant(lease, ttl).await?;
        let key_name = self.own_key(key, token);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key_name.clone(),
                CompareOp::Equal,
                own.revision,
            )])
            .and_then([TxnOp::put(
                key_name,
                granted.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let moved = self.txn(txn).await?.succeeded();
        // Whichever lease the key is not on now goes.
        let unused = if moved { own.lease } else { lease };
        match self.revoke(unused).await {
            Ok(_) => self.leases.forget(key, token, unused),
            Err(error) => {
                tracing::debug!(%key, %error, lease = unused, "could not revoke an unused lease; it runs out by itself");
            }
        }
        Ok(moved)
    }

    /// Revoke the lease of the head of the line, whoever put it: etcd deletes the key with
    /// it, the holder's next keep-alive finds its lease gone, and the next waiter's watch
    /// fires. `true` if there was a head, and it is gone (a forced unlock).
    pub(super) async fn revoke_head(&self, key: &str) -> Result<bool, etcd::Error> {
        let (_, [head]) = self.read([self.read_head(key)]).await?;
        let Some(head) = head else {
            return Ok(false);
        };
        let (name, revision) = (head.key().to_vec(), head.create_revision());
        let mut lease = head.lease();
        loop {
            if lease == 0 {
                // A key on no lease was not put by this backend: deleted, if it is still
                // the one read.
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        name.clone(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::delete(name.clone(), None)]);
                self.txn(txn).await?;
                return Ok(true);
            }
            // Gone already (run out) is as good.
            self.revoke(lease).await?;
            // The holder may have moved its key to a new lease meanwhile (`extend`): then
            // the key is still there, on that one.
            let (_, [still]) = self.read([TxnOp::get(name.clone(), None)]).await?;
            match still {
                Some(kv) if kv.create_revision() == revision => lease = kv.lease(),
                _ => return Ok(true),
            }
        }
    }
}

/// What [`EtcdLock::join`] found.
pub(super) struct Joined {
    /// Our key's create revision: our place in line, and our fence once we hold.
    pub(super) revision: i64,
    /// The lease our key is on.
    pub(super) lease: i64,
    /// The create revision of the line's first key.
    pub(super) head_revision: Option<i64>,
}

/// What [`EtcdLock::look`] found: our key, and the create revision of the line's head.
pub(super) struct Look {
    pub(super) own: Option<Own>,
    pub(super) head: Option<i64>,
}

impl Look {
    pub(super) fn we_hold(&self) -> bool {
        matches!((self.own, self.head), (Some(own), Some(head)) if own.revision == head)
    }

    /// What a renewal says when our key is not at the head: taken if another key is.
    pub(super) fn renewal_lost(&self) -> Renewal {
        match (self.own, self.head) {
            (Some(_), _) | (None, Some(_)) => Renewal::Taken,
            (None, None) => Renewal::Gone,
        }
    }
}

/// Our key in the line.
#[derive(Clone, Copy)]
pub(super) struct Own {
    /// Its create revision (our fence).
    pub(super) revision: i64,
    /// The lease it is on.
    pub(super) lease: i64,
    /// That lease's TTL, in seconds (0 if the key's value does not say).
    pub(super) granted: i64,
}

impl Own {
    pub(super) fn of(kv: &etcd::KeyValue) -> Self {
        Self {
            revision: kv.create_revision(),
            lease: kv.lease(),
            granted: kv
                .value_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// The first key a read of a transaction found, if any.
pub(super) fn first_kv(reply: Option<&etcd::TxnOpResponse>) -> Option<etcd::KeyValue> {
    match reply {
        Some(etcd::TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

/// The fence of a key created at `revision`.
pub(super) fn fence_of(revision: i64) -> Fence {
    Fence::new(u64::try_from(revision).expect("revisions are positive"))
}
