//! The wait for a turn ([`Backend::lock_in_line`](crate::backend::Backend::lock_in_line)):
//! a [`Waiter`] joins the line, then goes round three steps until its key heads the line:
//! keep its lease alive if due, read the line, watch the key just before its own. What
//! fails for want of a member is paused over and tried again ([`Step::Again`]); only a
//! lease etcd no longer has, or our key gone, loses the place.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::WatchOptions;
use tokio::time::{Instant, sleep, sleep_until};

use super::EtcdLock;
use super::line::fence_of;
use super::members::{lease_not_found, unreachable};
use crate::backend::Turn;
use crate::error::{Error, Result};
use crate::token::Token;

/// What a step of the wait did: done, with what it found; or no member could answer, and
/// it has paused: go round again.
pub(super) enum Step<T> {
    Done(T),
    Again,
}

/// One contender waiting in the line of `key`, from the moment its key is in line.
pub(super) struct Waiter<'a> {
    etcd: &'a EtcdLock,
    key: &'a str,
    token: &'a Token,
    /// Our key's create revision: our place, and our fence once we hold.
    mine: i64,
    /// The lease our key is on.
    lease: i64,
    /// How often the lease is kept alive.
    every: Duration,
    pause: Pause,
    /// When the request that last proved our lease alive was sent.
    proven_at: Instant,
    keep_alive_at: Instant,
    /// Whether a key was ever found before ours.
    waited: bool,
    /// The key just before ours (its name and create revision), once read.
    before: Option<(Vec<u8>, i64)>,
    /// The watch of `before`, and the member it was made on.
    watch: Option<(etcd::WatchStream, usize)>,
}

impl<'a> Waiter<'a> {
    /// Join the line of `key` on a new lease of at least `ttl`, trying again (on the same
    /// lease, or a new one if it ran out) while no member can answer.
    pub(super) async fn join(
        etcd: &'a EtcdLock,
        key: &'a str,
        token: &'a Token,
        ttl: Duration,
    ) -> Result<Self> {
        // TIMING: a lease runs from when etcd granted it (later, from each keep-alive), which
        // is after the request was sent, and etcd's lease is at least `ttl`; it is kept
        // alive every third of `ttl` while we wait.
        let every = (ttl / 3).max(Duration::from_millis(100));
        let mut pause = Pause::new(every);
        let mut lease = etcd.new_lease(key, token);
        let mut asked_at = Instant::now();
        let joined = loop {
            let joined = match etcd.grant(lease, ttl).await {
                Ok(granted) => etcd.join(key, token, lease, granted).await,
                Err(error) => Err(error),
            };
            match joined {
                Ok(joined) => break joined,
                Err(error) if lease_not_found(&error) => {
                    // Our lease ran out before our key could be put on it (etcd was out of
                    // reach for longer than a ttl): a new one.
                    lease = etcd.new_lease(key, token);
                    asked_at = Instant::now();
                }
                Err(error) if unreachable(&error) => {
                    tracing::warn!(%key, %error, "etcd could not answer; joining the line again");
                    pause.wait().await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        pause.reset();
        // The lease was granted after `asked_at` (its first grant request); a key found on
        // another lease (a token used twice) is proven by a keep-alive first.
        let keep_alive_at = if joined.lease == lease {
            asked_at + every
        } else {
            Instant::now()
        };
        Ok(Self {
            etcd,
            key,
            token,
            mine: joined.revision,
            lease: joined.lease,
            every,
            pause,
            proven_at: asked_at,
            keep_alive_at,
            waited: false,
            before: None,
            watch: None,
        })
    }

    /// Keep our lease alive if a keep-alive is due: done with whether one was sent (and
    /// answered) this round.
    pub(super) async fn keep_alive_if_due(&mut self) -> Result<Step<bool>> {
        if Instant::now() < self.keep_alive_at {
            return Ok(Step::Done(false));
        }
        let sent = Instant::now();
        match self.etcd.keep_alive(self.lease).await {
            Ok(true) => {
                self.proven_at = sent;
                self.keep_alive_at = sent + self.every;
                Ok(Step::Done(true))
            }
            Ok(false) => Err(self.lost("our etcd lease ran out while we waited")),
            Err(error) if unreachable(&error) => {
                tracing::warn!(key = %self.key, %error, "could not keep our etcd lease alive; trying again");
                self.pause.wait().await;
                Ok(Step::Again)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Read our key and the one just before it, at one revision: done with that revision.
    /// A key before ours that is not the one we watched is a wake-up (the watch missed its
    /// delete, or was broken then), and is watched from now on.
    pub(super) async fn read_line(&mut self) -> Result<Step<i64>> {
        let etcd = self.etcd;
        let read = etcd
            .read([
                etcd.read_own(self.key, self.token),
                etcd.read_before(self.key, self.mine),
            ])
            .await;
        let (read_at, [own, last_before]) = match read {
            Ok(read) => read,
            Err(error) if unreachable(&error) => {
                tracing::warn!(key = %self.key, %error, "could not read the line; trying again");
                self.pause.wait().await;
                return Ok(Step::Again);
            }
            Err(error) => return Err(error.into()),
        };
        self.pause.reset();
        if own.is_none() {
            return Err(self.lost("our etcd key was deleted while we waited"));
        }
        let found = last_before.map(|kv| (kv.key().to_vec(), kv.create_revision()));
        if found != self.before {
            if self.before.is_some() {
                etcd.wake_ups.fetch_add(1, Ordering::Relaxed);
            }
            self.before = found;
            self.watch = None;
        }
        Ok(Step::Done(read_at))
    }

    /// Whether the last read found no key before ours.
    pub(super) fn heads_the_line(&self) -> bool {
        self.before.is_none()
    }

    /// Our turn, now that the last read found us at the head of the line, if that read
    /// proves our lease: it followed this round's keep-alive (`kept_alive`), or one less than
    /// a keep-alive period old. If not, a keep-alive is due at once, and the next round's
    /// read decides.
    ///
    /// TIMING: the holder's lease is counted from the last keep-alive (or the grant); one
    /// older than a renewal period (after a wait through faults) is proven again first, so
    /// that the guard starts with two thirds of a lease. Only a read after the keep-alive
    /// hands us the lock: a keep-alive proves the lease, not the key (our key deleted, its
    /// lease living on, would be a turn for a key that is gone, while the waiter behind us,
    /// woken by that delete, takes the lock too). That read is proof enough, however long
    /// the two took: asking for a fresher one loops for ever on a slow member.
    pub(super) fn turn(&mut self, kept_alive: bool) -> Option<Turn> {
        if !kept_alive && Instant::now() >= self.proven_at + self.every {
            self.keep_alive_at = Instant::now();
            return None;
        }
        Some(Turn::new(fence_of(self.mine), self.proven_at, self.waited))
    }

    /// Watch the key just before ours from after the read at `read_at`, until it is deleted,
    /// the watch breaks, or a keep-alive is due.
    ///
    /// TIMING: every keep-alive is followed by a read of the line, so a delete that a watch
    /// missed is seen within a renewal period.
    pub(super) async fn watch_the_one_before(&mut self, read_at: i64) -> Result<()> {
        self.waited = true;
        let Step::Done(()) = self.watch_from(read_at + 1).await? else {
            return Ok(());
        };
        match self.until_woken().await {
            Woken::Deleted => {
                self.etcd.wake_ups.fetch_add(1, Ordering::Relaxed);
                self.before = None;
                self.watch = None;
            }
            Woken::Broken(why) => {
                tracing::debug!(key = %self.key, %why, "the watch of the key before ours ended; watching again");
                self.watch = None;
                self.pause.wait().await;
            }
            Woken::KeepAlive => {}
        }
        Ok(())
    }

    /// Make sure the key before ours is watched, from `revision` on, through the member in
    /// use: a watch made through a member that has since failed a step may be silent (a
    /// member stopped, not dead).
    async fn watch_from(&mut self, revision: i64) -> Result<Step<()>> {
        let in_use = self.etcd.current.load(Ordering::Relaxed);
        if self
            .watch
            .as_ref()
            .is_some_and(|(_, member)| *member != in_use)
        {
            self.watch = None;
        }
        if self.watch.is_some() {
            return Ok(Step::Done(()));
        }
        let (before_key, _) = self.before.as_ref().expect("a key before ours");
        // Events after the read, so that a delete between the read and the watch is seen.
        let options = WatchOptions::new().with_start_revision(revision);
        let made = self
            .etcd
            .call(|mut client| {
                let (before_key, options) = (before_key.clone(), options.clone());
                async move { client.watch(before_key, Some(options)).await }
            })
            .await;
        match made {
            Ok(stream) => {
                self.watch = Some((stream, self.etcd.current.load(Ordering::Relaxed)));
                Ok(Step::Done(()))
            }
            Err(error) if unreachable(&error) => {
                tracing::warn!(key = %self.key, %error, "could not watch the line; trying again");
                self.pause.wait().await;
                Ok(Step::Again)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Wait on the watch until the key before ours is deleted, the watch breaks, or a
    /// keep-alive is due.
    async fn until_woken(&mut self) -> Woken {
        let (before_key, _) = self.before.as_ref().expect("a key before ours");
        let (stream, _) = self.watch.as_mut().expect("watching");
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(reply)) => {
                        if reply.events().iter().any(|event| {
                            event.event_type() == etcd::EventType::Delete
                                && event.kv().is_some_and(|kv| kv.key() == before_key.as_slice())
                        }) {
                            return Woken::Deleted;
                        }
                        if reply.canceled() {
                            return Woken::Broken(format!(
                                "cancelled ({}; compacted at {})",
                                reply.cancel_reason(),
                                reply.compact_revision()
                            ));
                        }
                        // Created, progress, a put of that key: watch on.
                    }
                    Ok(None) => return Woken::Broken("the stream ended".into()),
                    Err(error) => return Woken::Broken(error.to_string()),
                },
                () = sleep_until(self.keep_alive_at) => return Woken::KeepAlive,
            }
        }
    }

    fn lost(&self, why: &'static str) -> Error {
        Error::LostPlace {
            key: self.key.to_owned(),
            why,
        }
    }
}

/// How long a waiter waits before it tries again after no member could answer: from
/// 100 ms, doubling, up to a second or half a renewal period, whichever is shorter.
///
/// TIMING: the cap leaves a waiter time to keep its lease alive between tries (a lease
/// lasts three renewal periods); the start is short because most faults (an election, a
/// member that died) are over within a few hundred milliseconds for the next try.
struct Pause {
    next: Duration,
    cap: Duration,
}

impl Pause {
    const FIRST: Duration = Duration::from_millis(100);

    fn new(renew_every: Duration) -> Self {
        Self {
            next: Self::FIRST,
            cap: (renew_every / 2).clamp(Self::FIRST, Duration::from_secs(1)),
        }
    }

    async fn wait(&mut self) {
        sleep(self.next).await;
        self.next = (self.next * 2).min(self.cap);
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What ended a wait on the watch of the key before ours.
enum Woken {
    /// The key was deleted.
    Deleted,
    /// The stream ended, broke or was cancelled: watch again.
    Broken(String),
    /// A keep-alive is due.
    KeepAlive,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter pauses longer after each failure, up to its cap, and starts over after a
    /// success.
    #[tokio::test(start_paused = true)]
    async fn pauses_grow_to_their_cap_and_start_over_after_a_success() {
        let mut pause = Pause::new(Duration::from_secs(10));
        let mut waited = Vec::new();
        for _ in 0..6 {
            let started = Instant::now();
            pause.wait().await;
            waited.push(started.elapsed());
        }
        assert_eq!(
            waited,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        pause.reset();
        let started = Instant::now();
        pause.wait().await;
        assert_eq!(started.elapsed(), Pause::FIRST);
        // A short ttl pauses at most half a renewal period, so the lease is kept alive.
        assert_eq!(
            Pause::new(Duration::from_millis(600)).cap,
            Duration::from_millis(300)
        );
    }
}
