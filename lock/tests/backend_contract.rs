//! What the crate promises a third-party [`Backend`]: a backend that panics costs its caller
//! an error, not a panic.

use std::time::Duration;

use distlock::backend::{Attempt, Renewal, Token, Unlock};
use distlock::{Backend, Error, Fence, LockOptions, Locker, Result};

/// A backend whose every step panics, as a buggy third-party one might.
struct Panicking;

impl Backend for Panicking {
    fn check_key(&self, _key: &str) -> Result<()> {
        Ok(())
    }

    async fn try_lock(&self, _key: &str, _token: &Token, _ttl: Duration) -> Result<Attempt> {
        panic!("a bug in the backend");
    }

    async fn renew(&self, _key: &str, _token: &Token, _ttl: Duration) -> Result<Renewal> {
        panic!("a bug in the backend");
    }

    async fn unlock(&self, _key: &str, _token: &Token) -> Result<Unlock> {
        panic!("a bug in the backend");
    }

    async fn advance_fence(
        &self,
        _key: &str,
        _token: &Token,
        _seen: Fence,
    ) -> Result<Option<Fence>> {
        panic!("a bug in the backend");
    }
}

fn options() -> LockOptions {
    LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_panics_gives_the_caller_an_aborted_error() {
    // Arrange
    let locker = Locker::new(Panicking, options()).unwrap();

    // Act
    let tried = locker.try_acquire("k").await;
    let waited = locker.acquire("k").await;

    // Assert: errors that name the key; the caller did not panic.
    assert!(
        matches!(&tried, Err(Error::Aborted { key }) if key == "k"),
        "{tried:?}"
    );
    assert!(
        matches!(&waited, Err(Error::Aborted { key }) if key == "k"),
        "{waited:?}"
    );
}
