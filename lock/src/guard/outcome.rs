//! [`ReleaseOutcome`]: how a lock ended when its guard gave it back.
//!
//! # Why "nothing there" reads as released
//! A release that finds our token deletes it: the lock was ours throughout. A release that
//! finds *nothing* while our own lease still runs is also reported released: under the
//! crate's timing assumptions nobody else can have held the lock while our lease ran, so
//! this is usually a re-sent release whose first try had deleted it. The other way to find
//! nothing is a key lost behind our back since the last renewal (a `DEL`, an eviction, a
//! failover) that the watchdog had not yet noticed; another owner may then have taken the
//! lock and given it back meanwhile, which no release can see: only a fenced write tells.
//! A release that finds another token is always [`ReleaseOutcome::Lost`].

use crate::lease::LockLost;

/// How a lock ended when its guard gave it back ([`LockGuard::release`](crate::LockGuard::release)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "`Lost` means the work under the guard may have overlapped another holder's"]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was ours until the release: our token was deleted, or nothing was there
    /// while our lease still ran (see the module doc). For a reentrant guard that is not the
    /// owner's last: the lease is still ours.
    Released,
    /// The lock was no longer ours when it was given back, for this reason: the lease ran
    /// out (or its backend could not be reached to renew it), the watchdog had found the
    /// key deleted, or another owner's token is in it now. The work under the guard may
    /// have overlapped another holder's; only fenced writes are safe.
    Lost(LockLost),
}

impl ReleaseOutcome {
    /// `true` when the lock was ours until the release ([`Released`](Self::Released)).
    pub fn was_held(self) -> bool {
        matches!(self, ReleaseOutcome::Released)
    }
}

impl std::fmt::Display for ReleaseOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseOutcome::Released => f.write_str("released"),
            ReleaseOutcome::Lost(why) => write!(f, "lost before the release: {why}"),
        }
    }
}
