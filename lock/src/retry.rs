//! Waiting between attempts: a jittered, doubling backoff and a deadline that may be "never".

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// The pause between two attempts: starts at `min`, doubles up to `max`, and each pause is
/// drawn from the upper half of the current step, so waiters spread out but never spin.
pub(crate) struct Backoff {
    step: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Self { step: min, max }
    }

    /// The next pause.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = jittered(self.step);
        self.step = self.step.saturating_mul(2).min(self.max);
        pause
    }
}

/// A duration drawn from the upper half of `step`.
pub(crate) fn jittered(step: Duration) -> Duration {
    let half = step / 2;
    half + rand::rng().random_range(Duration::ZERO..=half)
}

/// When a wait ends: `None` when `wait` is too long to represent (it then never ends).
pub(crate) fn deadline_after(start: Instant, wait: Duration) -> Option<Instant> {
    start.checked_add(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_maximum_and_stays_in_the_upper_half() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(4), ms(16));
        for step in [4, 8, 16, 16, 16] {
            let pause = backoff.next_pause();
            assert!(
                pause >= ms(step) / 2 && pause <= ms(step),
                "{pause:?} for {step}"
            );
        }
    }

    #[test]
    fn a_wait_too_long_to_represent_never_ends() {
        assert_eq!(deadline_after(Instant::now(), Duration::MAX), None);
    }

    #[test]
    fn the_backoff_cannot_overflow() {
        let mut backoff = Backoff::new(Duration::MAX / 2, Duration::MAX);
        for _ in 0..3 {
            backoff.next_pause();
        }
    }
}
