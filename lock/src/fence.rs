//! [`Fence`], the number a store checks to refuse a stale holder. A leaf: the backends hand
//! fences out, the guard carries one, and neither needs the other to name it.

/// A fencing token: a number that grows with every successful acquisition of one key.
///
/// A lease can run out while its holder still believes it holds the lock (a long pause, a
/// slow network). The lock cannot stop that holder from writing afterwards; the store it writes
/// to can. Send the fence with every write made under the lock, and have the store refuse any
/// write whose fence is lower than the highest one it has already accepted for that resource,
/// for example in SQL:
///
/// ```sql
/// UPDATE products SET stock = $1, fence = $2 WHERE id = $3 AND fence <= $2
/// ```
///
/// Zero rows updated means a newer holder has written: the stale holder must stop. (`<=`
/// lets one holder write several times; two acquisitions never share a fence.)
///
/// For a read-modify-write, lock the row before reading it, inside the transaction
/// (`SELECT stock, fence ... FOR UPDATE`, which waits for any other writer's commit), stop if
/// the stored fence is above yours, and store yours with the write. The value read is then
/// the one after every earlier write, and the row stays locked until commit. (Claiming with
/// `UPDATE ... SET fence = $f WHERE fence <= $f RETURNING stock` does the same in one
/// statement, at the cost of one more row version per write.)
///
/// # Where fences come from
/// Redis: a counter key without a TTL ([`redis::fence_key`](crate::redis::fence_key)), each
/// acquisition taking `max(counter + 1, the server's clock in microseconds)`, so a counter lost or
/// set back still hands out larger fences (the crate doc's timing assumptions say when).
/// PostgreSQL: a counter row that outlives the lock row. ZooKeeper and etcd: the number the
/// server gives the holder's node or key (a zxid, a create revision).
///
/// A store that refuses a fence cannot tell a stale holder from a counter that went back
/// (say, after someone reset it by hand); the holder can, with
/// [`LockGuard::advance_fence`](crate::LockGuard::advance_fence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub(crate) u64);

impl Fence {
    /// The largest fence, 2^62: well inside the signed 64 bits that Redis counts in and SQL
    /// `BIGINT` columns hold, with room above it so that no increment can overflow. Backends
    /// refuse to hand out a fence past it, and
    /// [`LockGuard::advance_fence`](crate::LockGuard::advance_fence) refuses to go there.
    pub const MAX: u64 = 1 << 62;

    /// A fence with this number (for a backend, or a store's record of one).
    pub const fn new(fence: u64) -> Self {
        Self(fence)
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The number as a SQL `BIGINT`; every fence a backend hands out fits.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).expect("fences stay within i64 (Fence::MAX)")
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
