//! How often one client may try to buy: per buyer and per client address, each a rate with
//! a burst (GCRA, by `governor`), kept by this instance alone. Over either: `429` with
//! `Retry-After`.
//!
//! The client address is the peer's, unless the peer is a trusted proxy
//! (`TRUSTED_PROXIES`): then it is the nearest address in `X-Forwarded-For` that is not
//! itself a trusted proxy. A header from anyone else is ignored, so that a client cannot
//! pick the address it is limited by.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::HttpRequest;
use governor::clock::{Clock, DefaultClock};
use governor::{Quota, RateLimiter};
use ipnet::IpNet;

use crate::settings::LimitSettings;

type Keyed<K> = RateLimiter<K, governor::state::keyed::DefaultKeyedStateStore<K>, DefaultClock>;

/// How often the records of clients that came back to a full bucket are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The limits of this instance.
pub struct Limits {
    buyers: Option<Arc<Keyed<i64>>>,
    addresses: Option<Arc<Keyed<IpAddr>>>,
    trusted: Vec<IpNet>,
}

/// Over a limit: try again after this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    pub retry_after: Duration,
}

impl Limits {
    /// As the settings say; sweeps forgotten clients in the background (call within a
    /// Tokio runtime).
    pub fn new(settings: &LimitSettings) -> Self {
        let buyers = keyed(settings.buyer_rate, settings.buyer_burst);
        let addresses = keyed(settings.address_rate, settings.address_burst);
        if let Some(limiter) = &buyers {
            sweep(Arc::downgrade(limiter));
        }
        if let Some(limiter) = &addresses {
            sweep(Arc::downgrade(limiter));
        }
        Self {
            buyers,
            addresses,
            trusted: settings.trusted_proxies.clone(),
        }
    }

    /// One purchase attempt by `buyer`.
    ///
    /// # Errors
    /// [`Exceeded`] when the buyer is over `BUYER_RATE`.
    pub fn buyer(&self, buyer: i64) -> Result<(), Exceeded> {
        check(self.buyers.as_deref(), &buyer)
    }

    /// One purchase attempt from the client of `req`.
    ///
    /// # Errors
    /// [`Exceeded`] when its address is over `ADDRESS_RATE`.
    pub fn address(&self, req: &HttpRequest) -> Result<(), Exceeded> {
        let Some(limiter) = self.addresses.as_deref() else {
            return Ok(());
        };
        match self.client_address(req) {
            Some(address) => check(Some(limiter), &address),
            None => Ok(()),
        }
    }

    /// The client's address, as described in the module's docs; `None` when a trusted
    /// proxy forwarded a hop that is not an address (nobody's limit is then taken: the
    /// proxy's own would be every buyer's).
    pub fn client_address(&self, req: &HttpRequest) -> Option<IpAddr> {
        let peer = req.peer_addr()?.ip();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        // Proxies append the address they got the request from: read from the right.
        let mut nearest = peer;
        for value in req.headers().get_all("x-forwarded-for").rev() {
            let value = value.to_str().ok()?;
            for hop in value.rsplit(',') {
                let address = hop_address(hop.trim())?;
                if !self.is_trusted(address) {
                    return Some(address);
                }
                nearest = address;
            }
        }
        Some(nearest)
    }

    fn is_trusted(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        self.trusted.iter().any(|net| net.contains(&address))
    }
}

/// A forwarded hop's address: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1` or `[2001:db8::1]:443`.
fn hop_address(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| hop.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
}

/// A keyed limiter of `rate` per second with `burst`, or none when `rate` is 0.
fn keyed<K: std::hash::Hash + Eq + Clone>(rate: u32, burst: u32) -> Option<Arc<Keyed<K>>> {
    let rate = NonZeroU32::new(rate)?;
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Some(Arc::new(RateLimiter::dashmap(
        Quota::per_second(rate).allow_burst(burst),
    )))
}

fn check<K: std::hash::Hash + Eq + Clone>(
    limiter: Option<&Keyed<K>>,
    key: &K,
) -> Result<(), Exceeded> {
    let Some(limiter) = limiter else {
        return Ok(());
    };
    limiter.check_key(key).map_err(|not_until| Exceeded {
        retry_after: not_until.wait_time_from(limiter.clock().now()),
    })
}

/// Drop the records of clients whose bucket is full again, every [`SWEEP_EVERY`], for as
/// long as the limiter lives: memory follows the clients of the last moments, not all of
/// them.
fn sweep<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(limiter: Weak<Keyed<K>>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(limiter) = limiter.upgrade() else {
                return;
            };
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    });
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;
    use crate::settings::Settings;

    fn limits(trusted: &[&str]) -> Limits {
        let mut settings = Settings::new("postgres://x", "redis://r").limits;
        settings.trusted_proxies = trusted.iter().map(|net| net.parse().unwrap()).collect();
        settings.buyer_rate = 1;
        settings.buyer_burst = 2;
        Limits::new(&settings)
    }

    fn from(peer: &str, forwarded: Option<&str>) -> HttpRequest {
        let mut req = TestRequest::default().peer_addr(peer.parse().unwrap());
        if let Some(forwarded) = forwarded {
            req = req.insert_header(("x-forwarded-for", forwarded));
        }
        req.to_http_request()
    }

    #[test]
    fn forwarded_addresses_are_believed_only_from_trusted_proxies() {
        let limits = limits(&["10.0.0.0/8"]);
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        // From a stranger the header is ignored.
        assert_eq!(
            limits.client_address(&from("203.0.113.9:1", Some("1.2.3.4"))),
            ip("203.0.113.9")
        );
        // From a trusted proxy, the nearest untrusted hop, not whatever the client put first.
        let chain = "6.6.6.6, 198.51.100.7, 10.1.1.1";
        assert_eq!(
            limits.client_address(&from("10.0.0.2:1", Some(chain))),
            ip("198.51.100.7")
        );
        // Hops with ports and brackets, as some gateways send them.
        let ported = "[2001:db8::7]:443, 198.51.100.8:5678";
        assert_eq!(
            limits.client_address(&from("10.0.0.2:1", Some(ported))),
            ip("198.51.100.8")
        );
        // A proxy that forwarded nothing is the client as far as we can tell; one that
        // forwarded garbage limits nobody (its own address would be every buyer's).
        assert_eq!(
            limits.client_address(&from("10.0.0.2:1", None)),
            ip("10.0.0.2")
        );
        assert_eq!(
            limits.client_address(&from("10.0.0.2:1", Some("junk"))),
            None
        );
    }

    #[tokio::test]
    async fn a_buyer_over_the_burst_is_told_when_to_come_back() {
        let limits = limits(&[]);
        assert!(limits.buyer(1).is_ok());
        assert!(limits.buyer(1).is_ok());
        let over = limits.buyer(1).unwrap_err();
        assert!(over.retry_after > Duration::ZERO && over.retry_after <= Duration::from_secs(1));
        // Another buyer has a bucket of their own.
        assert!(limits.buyer(2).is_ok());
    }
}
