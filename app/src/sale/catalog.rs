//! What this instance knows about products: which exist, each one's desk, and which are
//! sold out as of which restock.
//!
//! - **Known products.** An id is looked up in PostgreSQL once; after that, the instance
//!   remembers it (products are never deleted). A purchase of an unknown id gets 404 after
//!   that one lookup and never reaches a desk, a lock or Redis, so anonymous requests cannot
//!   make the service create keys.
//! - **Sold out, from memory.** A batch that leaves the stock at 0 marks the product sold
//!   out at its restock generation; later purchases are answered 409 without a queue, a lock
//!   or a round trip. A restock starts a new generation: the instance that made it reopens
//!   the product at once; on every other instance the restock message
//!   ([`super::restocks`]) has the product's generation read from PostgreSQL, and reopens it
//!   at what that read says (the message itself is not believed). A mark of an older generation than one already seen is ignored, so a
//!   slow batch that read the stock before a restock cannot hide it.
//! - **The opening.** A product bought before its `on_sale_at` is answered `not_open` from
//!   what this instance read of it: the time left until the opening, on the database's
//!   clock, laid over this instance's own clock from the moment the read was sent (so the
//!   estimate errs early, never late). An opening not yet reached is read again at most every
//!   [`OPENING_RECHECK`]; the database's own check at the write decides (see the migration).
//!   An opening this instance does not know (never read, or forgotten, while another
//!   purchase's read of it is under way or after that read failed) refuses nobody: such a
//!   purchase goes on, and the database decides.
//! - **The backstop.** A mark is trusted for `SOLD_OUT_RECHECK_MS` only; then one batch asks
//!   PostgreSQL again. A restock whose message was lost (Redis down) therefore reaches every
//!   instance within that bound.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::desk::Desk;
use crate::domain::ProductId;

/// How long a purchase's look-up that found no product is remembered: a product created on
/// another instance is sold here at most this late.
pub(crate) const MISSING_FOR: Duration = Duration::from_secs(1);

/// How long a product's opening, read as not yet reached, is trusted before it is read again:
/// an admin's earlier opening reaches the other instances at most this late.
pub(crate) const OPENING_RECHECK: Duration = Duration::from_secs(1);

/// The most missing ids remembered; beyond it the oldest is forgotten first.
const MAX_MISSING: usize = 10_000;

/// Ids found missing, and in what order: at most [`MAX_MISSING`], the oldest forgotten
/// first (a flood of random ids pushes out only the oldest misses, not the memory whole).
#[derive(Default)]
struct Missing {
    at: HashMap<ProductId, Instant>,
    /// Oldest first; an id remembered again is here twice, and only its newest entry counts.
    order: VecDeque<(ProductId, Instant)>,
}

impl Missing {
    fn remember(&mut self, id: ProductId, now: Instant) {
        self.at.insert(id, now);
        self.order.push_back((id, now));
        while let Some(&(oldest, at)) = self.order.front() {
            let expired = now.duration_since(at) >= MISSING_FOR;
            if !expired && self.at.len() <= MAX_MISSING {
                break;
            }
            self.order.pop_front();
            if self.at.get(&oldest) == Some(&at) {
                self.at.remove(&oldest);
            }
        }
    }
}

/// The products this instance has seen, each with its desk and sold-out mark.
pub(crate) struct Catalog {
    /// Read on every purchase, written once per product.
    products: RwLock<HashMap<ProductId, Arc<Known>>>,
    /// Ids a look-up found no product for, and when.
    missing: Mutex<Missing>,
    /// `SOLD_OUT_RECHECK_MS`.
    recheck: Duration,
}

/// A known product, as a purchase finds it.
pub(crate) enum ForPurchase {
    /// Marked sold out: answer so from memory.
    SoldOut,
    /// On sale, as far as this instance knows: queue at its desk.
    Open(Arc<Known>),
}

/// One product known to exist.
pub(crate) struct Known {
    pub(crate) desk: Desk,
    marks: Mutex<Marks>,
    /// When this instance learned of the product: `sold_out_at` counts from here.
    learned: Instant,
    /// The sold-out mark, as `Marks::sold_out` has it, for the purchases that read it: 0 for
    /// none, else 1 + the nanoseconds from `learned` to the mark. Written under `marks`;
    /// read without taking that lock, so that the flood of sold-out purchases, on every
    /// worker thread, does not contend for it.
    sold_out_at: AtomicU64,
    /// The opening, as nanoseconds from `learned` (0: open from the start; `u64::MAX`: not
    /// known, read it again). Read on every purchase, without a lock.
    opens_at: AtomicU64,
    /// When the opening was read (or a read of it was claimed), as 1 + nanoseconds from
    /// `learned` (0: never).
    opening_read: AtomicU64,
    /// Bumped by [`Known::forget_opening`]: a read that began before is not stored.
    opening_gen: AtomicU64,
    /// Held while the opening is stored or forgotten, so that a store checks its generation
    /// and writes the opening with no forget in between (purchases read without it).
    opening_writes: Mutex<()>,
    /// Restock news asked for the generation to be read: [`IDLE`], [`READING`] or
    /// [`READ_AGAIN`] (news came during the read).
    restock_read: AtomicU8,
}

/// What an instance knows of a product's opening ([`Known::opening`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// Reached, by the estimate from the last read.
    Open,
    /// Not reached yet, by that estimate (which errs early, never late).
    NotYet,
    /// Never read, or forgotten since (an admin moved it): only a read, or the database's
    /// check at the write, can tell.
    Unknown,
}

/// No read of the restock generation under way.
const IDLE: u8 = 0;
/// A read of the restock generation is under way.
const READING: u8 = 1;
/// A read is under way, and news that came during it asks for one more.
const READ_AGAIN: u8 = 2;

#[derive(Debug, Default)]
struct Marks {
    /// The newest restock generation this instance has heard of.
    generation: i64,
    /// Sold out at this generation (when: `Known::sold_out_at`).
    sold_out: Option<i64>,
}

impl Catalog {
    pub(crate) fn new(recheck: Duration) -> Self {
        Self {
            products: RwLock::new(HashMap::new()),
            missing: Mutex::new(Missing::default()),
            recheck,
        }
    }

    /// Whether a look-up found no product `id` within [`MISSING_FOR`].
    pub(crate) fn known_missing(&self, id: ProductId) -> bool {
        self.missing()
            .at
            .get(&id)
            .is_some_and(|at| at.elapsed() < MISSING_FOR)
    }

    /// A look-up found no product `id`.
    pub(crate) fn remember_missing(&self, id: ProductId) {
        self.missing().remember(id, Instant::now());
    }

    /// Product `id` exists now (it was created here).
    pub(crate) fn forget_missing(&self, id: ProductId) {
        self.missing().at.remove(&id);
    }

    fn missing(&self) -> std::sync::MutexGuard<'_, Missing> {
        self.missing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What this instance knows of `id` for a purchase, in one lookup: `None` if it does not
    /// know the product yet, or if its desk stopped (the purchase then looks the product up
    /// and [`Self::remember`] opens a new desk: one dead leader costs the purchases it had,
    /// not the next ones). A product marked sold out (see [`Self::is_sold_out`]) is answered
    /// without taking a reference to it.
    pub(crate) fn for_purchase(&self, id: ProductId) -> Option<ForPurchase> {
        let products = self.products.read().unwrap_or_else(PoisonError::into_inner);
        let known = products.get(&id)?;
        Some(if self.is_sold_out(known) {
            ForPurchase::SoldOut
        } else if known.desk.is_open() {
            ForPurchase::Open(Arc::clone(known))
        } else {
            return None;
        })
    }

    /// Whether this instance knows `id` and may answer it sold out from memory (see
    /// [`Self::is_sold_out`]). Takes no reference to the product, open or not: the sold-out
    /// lane asks this of every purchase, before the route asks [`Self::for_purchase`].
    pub(crate) fn known_sold_out(&self, id: ProductId) -> bool {
        let products = self.products.read().unwrap_or_else(PoisonError::into_inner);
        products
            .get(&id)
            .is_some_and(|known| self.is_sold_out(known))
    }

    /// The product, if this instance already knows it.
    pub(crate) fn get(&self, id: ProductId) -> Option<Arc<Known>> {
        self.products
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Remember a product that exists, at restock generation `generation`, with the desk
    /// `open_desk` makes (called only if it was not known yet, or its desk stopped).
    pub(crate) fn remember(
        &self,
        id: ProductId,
        generation: i64,
        open_desk: impl FnOnce() -> Desk,
    ) -> Arc<Known> {
        let mut products = self
            .products
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if products.get(&id).is_some_and(|known| !known.desk.is_open()) {
            products.remove(&id);
        }
        let known = products.entry(id).or_insert_with(|| {
            Arc::new(Known {
                desk: open_desk(),
                marks: Mutex::new(Marks {
                    generation,
                    sold_out: None,
                }),
                learned: Instant::now(),
                sold_out_at: AtomicU64::new(0),
                opens_at: AtomicU64::new(u64::MAX),
                opening_read: AtomicU64::new(0),
                opening_gen: AtomicU64::new(0),
                opening_writes: Mutex::new(()),
                restock_read: AtomicU8::new(IDLE),
            })
        });
        known.reopen(generation);
        Arc::clone(known)
    }

    /// Forget `stopped`, a product whose desk stopped: the next purchase looks it up again.
    /// Only that entry goes: one a concurrent look-up put in its place stays (two desks of
    /// one product in one instance would be two leaders).
    pub(crate) fn forget(&self, id: ProductId, stopped: &Arc<Known>) {
        let mut products = self
            .products
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if products
            .get(&id)
            .is_some_and(|known| Arc::ptr_eq(known, stopped))
        {
            products.remove(&id);
        }
    }

    /// The opening of `id` moved (here or on another instance): read it again.
    pub(crate) fn forget_opening(&self, id: ProductId) {
        if let Some(known) = self.get(id) {
            known.forget_opening();
        }
    }

    /// A restock started `generation` (made here, or read after a message).
    pub(crate) fn reopen(&self, id: ProductId, generation: i64) {
        if let Some(known) = self.get(id) {
            known.reopen(generation);
        }
    }

    /// Whether purchases of `known` can be answered "sold out" from memory: it is marked
    /// sold out at the newest restock generation heard of (a restock clears the mark), and
    /// the mark is younger than `SOLD_OUT_RECHECK_MS`.
    pub(crate) fn is_sold_out(&self, known: &Known) -> bool {
        match known.sold_out_at.load(Ordering::Acquire) {
            0 => false,
            at => {
                let age = known
                    .since_learned()
                    .saturating_sub(Duration::from_nanos(at - 1));
                age < self.recheck
            }
        }
    }
}

impl Known {
    /// A batch found the stock at 0 in restock generation `generation`.
    pub(crate) fn mark_sold_out(&self, generation: i64) {
        let mut marks = self.marks();
        if generation >= marks.generation {
            marks.generation = generation;
            marks.sold_out = Some(generation);
            let at = u64::try_from(self.since_learned().as_nanos()).unwrap_or(u64::MAX - 1);
            self.sold_out_at.store(at + 1, Ordering::Release);
        }
    }

    fn reopen(&self, generation: i64) {
        let mut marks = self.marks();
        if generation > marks.generation {
            marks.generation = generation;
        }
        if marks.sold_out.is_some_and(|sold_at| sold_at < generation) {
            marks.sold_out = None;
            self.sold_out_at.store(0, Ordering::Release);
        }
    }

    /// Restock news arrived: whether the caller is to read the restock generation now. One
    /// read per product at a time: news during a read asks that read for one more after it
    /// (see [`Self::read_restock_again`]), so a flood of messages costs one read at a time.
    pub(crate) fn claim_restock_read(&self) -> bool {
        let before = self
            .restock_read
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                Some(if state == IDLE { READING } else { READ_AGAIN })
            });
        before == Ok(IDLE)
    }

    /// The claimed read finished: whether news came during it, so that it must read again
    /// (a read that began before a restock may have missed it).
    pub(crate) fn read_restock_again(&self) -> bool {
        match self
            .restock_read
            .compare_exchange(READING, IDLE, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => false,
            Err(_) => {
                // News during the read: read once more, for it and for any that comes
                // before that read begins.
                self.restock_read.store(READING, Ordering::Release);
                true
            }
        }
    }

    /// What this instance knows of the product's opening.
    pub(crate) fn opening(&self) -> Opening {
        let opens_at = self.opens_at.load(Ordering::Acquire);
        if opens_at == u64::MAX {
            Opening::Unknown
        } else if nanos(self.since_learned()) >= opens_at {
            Opening::Open
        } else {
            Opening::NotYet
        }
    }

    /// Whether this purchase should read the opening again before it is refused for it: the
    /// opening was never read, forgotten, or read [`OPENING_RECHECK`] ago. One purchase at a
    /// time wins the claim (the flood before an opening makes one read per product per
    /// second, not one per purchase); the others go by what is known ([`Self::opening`]).
    /// Returns the generation to hand to [`Self::set_opening`].
    pub(crate) fn claim_opening_read(&self) -> Option<u64> {
        let read = self.opening_read.load(Ordering::Acquire);
        let now = self.since_learned();
        let stale =
            read == 0 || now.saturating_sub(Duration::from_nanos(read - 1)) >= OPENING_RECHECK;
        let claimed = stale
            && self
                .opening_read
                .compare_exchange(
                    read,
                    nanos(now).saturating_add(1),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        // The generation is read after the claim: a forget that came before this point came
        // before a read the claimant starts now, so that read may be stored. (Read before
        // the claim, a forget that reset the claim in between would have the read dropped
        // and the claim held for a recheck's length, with the opening unknown.)
        claimed.then(|| self.opening_gen.load(Ordering::Acquire))
    }

    /// A read sent at `read_at` found the opening `opens_in_us` microseconds after the
    /// database's clock (zero or less: open). Counted from when the read was sent, the
    /// earliest the database can have looked at its clock. A read that began before the
    /// opening was last forgotten (`generation` is older) is dropped: it may predate the
    /// change.
    pub(crate) fn set_opening(&self, read_at: Instant, opens_in_us: i64, generation: u64) {
        let _writing = self
            .opening_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.opening_gen.load(Ordering::Acquire) != generation {
            return;
        }
        let wait = Duration::from_micros(u64::try_from(opens_in_us).unwrap_or(0));
        // The read may have been sent before this instance learned of the product.
        let opens = (read_at + wait).saturating_duration_since(self.learned);
        let read = nanos(read_at.saturating_duration_since(self.learned));
        self.opens_at.store(nanos(opens), Ordering::Release);
        self.opening_read
            .store(read.saturating_add(1), Ordering::Release);
    }

    /// The opening is not known any more: the next purchase reads it.
    pub(crate) fn forget_opening(&self) {
        let _writing = self
            .opening_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.opening_gen.fetch_add(1, Ordering::AcqRel);
        self.opening_read.store(0, Ordering::Release);
        self.opens_at.store(u64::MAX, Ordering::Release);
    }

    fn since_learned(&self) -> Duration {
        Instant::now().saturating_duration_since(self.learned)
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A duration's nanoseconds, as the atomics keep them (capped: 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog_with_product(recheck: Duration) -> (Catalog, Arc<Known>) {
        let catalog = Catalog::new(recheck);
        let known = catalog.remember(ProductId::parse("1").unwrap(), 0, Desk::closed);
        (catalog, known)
    }

    #[tokio::test]
    async fn a_sold_out_mark_is_answered_from_memory_until_a_restock() {
        let (catalog, known) = catalog_with_product(Duration::from_secs(60));
        assert!(!catalog.is_sold_out(&known));

        known.mark_sold_out(0);
        assert!(catalog.is_sold_out(&known));

        catalog.reopen(ProductId::parse("1").unwrap(), 1);
        assert!(!catalog.is_sold_out(&known));
    }

    #[tokio::test]
    async fn a_panic_while_the_catalog_was_held_does_not_take_later_purchases_down() {
        // A thread panics while it holds each of the catalog's locks (a bug, an allocation
        // that failed): the purchases after it are still answered.
        let (catalog, known) = catalog_with_product(Duration::from_secs(60));
        std::thread::scope(|scope| {
            let panicked = [
                scope.spawn(|| {
                    let _held = catalog.products.write();
                    panic!("while the products were held");
                }),
                scope.spawn(|| {
                    let _held = catalog.missing.lock();
                    panic!("while the missing ids were held");
                }),
                scope.spawn(|| {
                    let _held = known.marks.lock();
                    panic!("while the marks were held");
                }),
            ];
            for thread in panicked {
                assert!(thread.join().is_err());
            }
        });
        let id = ProductId::parse("1").unwrap();
        known.mark_sold_out(0);
        assert!(catalog.known_sold_out(id));
        catalog.remember_missing(ProductId::parse("2").unwrap());
        assert!(catalog.known_missing(ProductId::parse("2").unwrap()));
    }

    #[test]
    fn a_flood_of_missing_ids_forgets_the_oldest_first() {
        let catalog = Catalog::new(Duration::from_secs(1));
        let id = |n: usize| ProductId::parse(&n.to_string()).unwrap();
        for n in 1..=MAX_MISSING + 10 {
            catalog.remember_missing(id(n));
        }
        assert!(catalog.known_missing(id(MAX_MISSING + 10)));
        assert!(catalog.known_missing(id(11)), "a recent miss was forgotten");
        assert!(!catalog.known_missing(id(10)));
        assert!(!catalog.known_missing(id(1)));
        assert_eq!(catalog.missing().at.len(), MAX_MISSING);
    }

    #[tokio::test]
    async fn restock_news_during_a_read_asks_for_one_more_read() {
        let (_catalog, known) = catalog_with_product(Duration::from_secs(60));
        assert!(known.claim_restock_read(), "the first news reads");
        assert!(
            !known.claim_restock_read(),
            "news during the read waits for it"
        );
        assert!(!known.claim_restock_read());
        assert!(
            known.read_restock_again(),
            "one more read, for the news during it"
        );
        assert!(
            !known.read_restock_again(),
            "no news during the second read: done"
        );
        assert!(known.claim_restock_read(), "the next news reads again");
    }

    #[tokio::test]
    async fn a_late_mark_of_an_older_generation_cannot_hide_a_restock() {
        // A batch read the stock at 0 in generation 3; a restock to generation 4 was heard
        // first; the batch's mark arrives afterwards.
        let (catalog, known) = catalog_with_product(Duration::from_secs(60));
        catalog.reopen(ProductId::parse("1").unwrap(), 4);

        known.mark_sold_out(3);

        assert!(!catalog.is_sold_out(&known), "a stale mark hid the restock");
        known.mark_sold_out(4);
        assert!(catalog.is_sold_out(&known));
    }

    #[tokio::test]
    async fn a_product_whose_desk_stopped_gets_a_new_desk_at_the_next_purchase() {
        // Arrange: a known product whose desk's leader died.
        let id = ProductId::parse("1").unwrap();
        let catalog = Catalog::new(Duration::from_secs(60));
        catalog.remember(id, 0, Desk::closed);

        // Act: the next purchase finds it.
        let found = catalog.for_purchase(id);

        // Assert: not handed the dead desk; the look-up that follows gets a live one.
        assert!(found.is_none(), "a purchase was handed a stopped desk");
        let known = catalog.remember(id, 0, Desk::parked);
        assert!(known.desk.is_open());
        assert!(matches!(
            catalog.for_purchase(id),
            Some(ForPurchase::Open(open)) if Arc::ptr_eq(&open, &known)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn an_opening_is_reached_on_time_and_read_again_while_not_reached() {
        let (_catalog, known) = catalog_with_product(Duration::from_secs(60));
        assert_eq!(known.opening(), Opening::Unknown, "unread");
        let generation = known.claim_opening_read().expect("unread: to be read");
        assert_eq!(known.claim_opening_read(), None, "one read at a time");
        assert_eq!(
            known.opening(),
            Opening::Unknown,
            "a claimed read is not an estimate: purchases meanwhile must not be refused"
        );
        known.set_opening(Instant::now(), 2_000_000, generation);
        assert_eq!(known.opening(), Opening::NotYet);
        assert!(known.claim_opening_read().is_none());
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert_eq!(known.opening(), Opening::NotYet);
        let again = known.claim_opening_read();
        assert!(
            again.is_some(),
            "a closed product's opening is read again each second"
        );
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(known.opening(), Opening::Open);
        // An admin moved it: a read that began before is dropped; a new one is taken.
        known.forget_opening();
        known.set_opening(Instant::now(), -5, again.unwrap());
        assert_eq!(
            known.opening(),
            Opening::Unknown,
            "a read from before the change was stored"
        );
        let fresh = known.claim_opening_read().expect("forgotten: to be read");
        known.set_opening(Instant::now(), -5, fresh);
        assert_eq!(known.opening(), Opening::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_mark_is_trusted_only_until_the_recheck() {
        let (catalog, known) = catalog_with_product(Duration::from_millis(1_000));
        known.mark_sold_out(0);

        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(catalog.is_sold_out(&known));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(
            !catalog.is_sold_out(&known),
            "the mark outlived its recheck"
        );
    }
}
