//! The rules that tie settings together, one function each, with the message that names
//! the settings. [`Settings::check`](super::Settings::check) applies them in turn.

use std::time::Duration;

use secrecy::ExposeSecret;

use crate::redact::redacted;

use super::{
    BuyerIdentity, DatabaseSettings, IdentitySettings, LockSettings, LockStrategy, RedisSettings,
    SaleSettings,
};

/// Under pg-row, a batch waiting for the row waits out another batch's work.
pub(super) fn work_ends_before_a_waiting_batch_gives_up(
    lock: &LockSettings,
    sale: &SaleSettings,
    database: &DatabaseSettings,
) -> Result<(), String> {
    if lock.strategy == LockStrategy::PgRow && sale.work >= database.lock_timeout {
        return Err(format!(
            "WORK_MS ({}) must be below PG_LOCK_TIMEOUT_MS ({}) under LOCK_STRATEGY=pg-row: a batch that waits for the row waits out another batch's work, and would give up every time",
            sale.work.as_millis(),
            database.lock_timeout.as_millis()
        ));
    }
    Ok(())
}

/// A hold shorter than half the wait leaves other instances' buyers time for their turn.
pub(super) fn hold_is_below_half_the_wait(hold: Duration, wait: Duration) -> Result<(), String> {
    if hold * 2 >= wait {
        return Err(format!(
            "HOLD_MS ({}) must be below half of LOCK_WAIT_MS ({}): other instances' buyers would give up waiting for their turn",
            hold.as_millis(),
            wait.as_millis()
        ));
    }
    Ok(())
}

/// The pg-* strategies work inside a transaction, which PostgreSQL ends when idle too long.
pub(super) fn work_ends_before_postgres_ends_the_transaction(
    sale: &SaleSettings,
    database: &DatabaseSettings,
) -> Result<(), String> {
    if sale.work >= database.idle_in_transaction_timeout {
        return Err(format!(
            "WORK_MS ({}) must be below PG_IDLE_IN_TRANSACTION_TIMEOUT_MS ({}): the pg-* strategies work inside a transaction, which PostgreSQL would end",
            sale.work.as_millis(),
            database.idle_in_transaction_timeout.as_millis()
        ));
    }
    Ok(())
}

pub(super) fn sentinels_name_their_primary(redis: &RedisSettings) -> Result<(), String> {
    if !redis.sentinels.is_empty() && redis.sentinel_master.trim().is_empty() {
        return Err("REDIS_SENTINELS needs REDIS_SENTINEL_MASTER, the name the Sentinels monitor the primary under".into());
    }
    Ok(())
}

pub(super) fn redlock_has_masters(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::Redlock && lock.redlock_urls.is_empty() {
        return Err(
            "LOCK_STRATEGY=redlock needs REDLOCK_URLS (comma-separated Redis masters)".into(),
        );
    }
    Ok(())
}

/// Under zookeeper a lock lives only as long as its session.
pub(super) fn zookeeper_session_outlasts_two_leases(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::ZooKeeper && lock.zookeeper_session_timeout < 2 * lock.ttl {
        return Err(format!(
            "ZOOKEEPER_SESSION_TIMEOUT_MS ({}) must be at least twice LOCK_TTL_MS ({}) under LOCK_STRATEGY=zookeeper: a lock lives only as long as its session, and the ensemble may end a session 0.6 of its timeout after the holder last proved it alive, so a holder counting on a longer lease could write after the ensemble gave the lock away",
            lock.zookeeper_session_timeout.as_millis(),
            lock.ttl.as_millis()
        ));
    }
    Ok(())
}

pub(super) fn zookeeper_has_an_ensemble(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::ZooKeeper && lock.zookeeper_connect.trim().is_empty() {
        return Err(
            "LOCK_STRATEGY=zookeeper needs ZOOKEEPER_CONNECT (host:port,host:port,...)".into(),
        );
    }
    Ok(())
}

pub(super) fn etcd_has_endpoints(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::Etcd
        && lock.etcd_endpoints.iter().all(|e| e.trim().is_empty())
    {
        return Err(
            "LOCK_STRATEGY=etcd needs ETCD_ENDPOINTS (comma-separated http://host:2379)".into(),
        );
    }
    Ok(())
}

/// Under zookeeper and etcd the prefix starts every lock's name, which cannot hold a '/'.
pub(super) fn lock_names_hold_no_slash(
    lock: &LockSettings,
    redis: &RedisSettings,
) -> Result<(), String> {
    if lock.strategy.locks_in_consensus() && redis.key_prefix.contains('/') {
        return Err(format!(
            "REDIS_KEY_PREFIX ({:?}) must not contain '/' under LOCK_STRATEGY={}: it starts every lock's name there, and a lock's name cannot hold a '/'",
            redis.key_prefix,
            lock.strategy.name()
        ));
    }
    Ok(())
}

/// The shortest HMAC secret accepted for buyer tokens: 32 bytes, as long as HS256's hash.
pub const MIN_BUYER_SECRET_BYTES: usize = 32;

/// With identity on, exactly one way to check a token's signature, and one that fits the
/// algorithm: a secret for HS*, a public key or a JWKS file for the others.
pub(super) fn buyers_have_a_key(identity: &IdentitySettings) -> Result<(), String> {
    if identity.mode == BuyerIdentity::Off {
        return Ok(());
    }
    let algorithm = identity.algorithm;
    let keys = [
        identity.secret.is_some(),
        identity.public_key_file.is_some(),
        identity.jwks_file.is_some(),
    ];
    match keys.iter().filter(|set| **set).count() {
        0 => {
            return Err("buyers need a key to check their tokens with: set BUYER_JWT_SECRET (HS256), BUYER_JWT_PUBLIC_KEY_FILE or BUYER_JWT_JWKS_FILE (with BUYER_JWT_ALGORITHM); or, for a benchmark only, BUYER_IDENTITY=off".into());
        }
        1 => {}
        _ => {
            return Err("set only one of BUYER_JWT_SECRET, BUYER_JWT_PUBLIC_KEY_FILE and BUYER_JWT_JWKS_FILE".into());
        }
    }
    if let Some(secret) = &identity.secret {
        if !algorithm.is_hmac() {
            return Err(format!(
                "BUYER_JWT_SECRET is for BUYER_JWT_ALGORITHM HS256, HS384 or HS512, not {algorithm:?}: an asymmetric algorithm needs BUYER_JWT_PUBLIC_KEY_FILE or BUYER_JWT_JWKS_FILE"
            ));
        }
        let bytes = secret.expose_secret().len();
        if bytes < MIN_BUYER_SECRET_BYTES {
            return Err(format!(
                "BUYER_JWT_SECRET has {bytes} bytes; use at least {MIN_BUYER_SECRET_BYTES} (for example `openssl rand -hex 32`)"
            ));
        }
    } else if algorithm.is_hmac() {
        return Err(format!(
            "BUYER_JWT_ALGORITHM {algorithm:?} needs BUYER_JWT_SECRET; a public key or JWKS file needs an asymmetric algorithm (RS256, ES256, EdDSA, ...)"
        ));
    }
    Ok(())
}

/// Whether `url` names a Redis reached over TLS (`rediss://`, or redis-rs's `valkeys://`).
fn is_tls_redis(url: &str) -> bool {
    scheme_is(url, &["rediss", "valkeys"])
}

/// Whether `url`'s scheme is one of `schemes`, in any case.
fn scheme_is(url: &str, schemes: &[&str]) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    schemes.iter().any(|s| scheme.eq_ignore_ascii_case(s))
}

/// Redis over TLS is all or nothing: with a Redis CA every Redis URL the service uses must be
/// `rediss://` (a plain one would stay plain text, and redis-rs refuses a CA for it), and the
/// Sentinels' primary is never reached over TLS, so Sentinels over TLS would be a half.
pub(super) fn redis_tls_is_all_or_nothing(
    redis: &RedisSettings,
    lock: &LockSettings,
) -> Result<(), String> {
    if let Some(sentinel) = redis
        .sentinels
        .iter()
        .find(|url| is_tls_redis(url.expose_secret()))
    {
        return Err(format!(
            "REDIS_SENTINELS has a TLS URL ({}): the primary they name is reached in plain text by this service, so Sentinels are not supported over TLS",
            redacted(sentinel.expose_secret())
        ));
    }
    let Some(ca) = &redis.ca_file else {
        return Ok(());
    };
    let shown = ca.path.display();
    if !redis.sentinels.is_empty() {
        return Err(format!(
            "REDIS_CA_FILE ({shown}) with REDIS_SENTINELS: Redis through Sentinels is not reached over TLS by this service"
        ));
    }
    let redlock = (lock.strategy == LockStrategy::Redlock).then_some(&lock.redlock_urls);
    let urls = std::iter::once(redis.url()).chain(
        redlock
            .into_iter()
            .flatten()
            .map(ExposeSecret::expose_secret),
    );
    for url in urls {
        if !is_tls_redis(url) {
            return Err(format!(
                "REDIS_CA_FILE ({shown}) is set, but {} is not rediss://: every Redis URL the service uses (REDIS_URL, and REDLOCK_URLS under redlock) must be over TLS with it",
                redacted(url)
            ));
        }
    }
    Ok(())
}

/// An etcd CA that no link would use (another strategy, or a plain endpoint) is a mistake
/// that would leave etcd in plain text.
pub(super) fn etcd_ca_has_only_tls_endpoints(lock: &LockSettings) -> Result<(), String> {
    let Some(ca) = &lock.etcd_ca_file else {
        return Ok(());
    };
    let shown = ca.path.display();
    if lock.strategy != LockStrategy::Etcd {
        return Err(format!(
            "ETCD_CA_FILE ({shown}) is set, but LOCK_STRATEGY is {}: only the etcd lock reaches etcd",
            lock.strategy.name()
        ));
    }
    match lock
        .etcd_endpoints
        .iter()
        .find(|e| !scheme_is(e, &["https"]))
    {
        Some(plain) => Err(format!(
            "ETCD_CA_FILE ({shown}) is set, but ETCD_ENDPOINTS has {}, which is not https://: that member would be reached in plain text",
            redacted(plain)
        )),
        None => Ok(()),
    }
}
