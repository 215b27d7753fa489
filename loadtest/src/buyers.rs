//! The load test plays the identity provider: it signs each buyer's token (HS256) with the
//! key the instances check them with (`BUYER_JWT_SECRET`). The instances it starts get the
//! public demo key below; against a deployment of your own, `loadtest --buyer-jwt-secret`
//! names its key.

use std::sync::OnceLock;
use std::time::Duration;

use seckill::identity::Issuer;

/// The key of the instances this tool starts (the demo, the bench, the soak, the tests):
/// public, so never a deployment's key.
pub const DEMO_BUYER_SECRET: &str = "loadtest-demo-buyer-secret-0123456789abcdef";

/// How long a minted token is valid: longer than any run.
const VALID_FOR: Duration = Duration::from_secs(24 * 3_600);

static SECRET: OnceLock<String> = OnceLock::new();
static ISSUER: OnceLock<Issuer> = OnceLock::new();

/// Sign tokens with `secret` from now on, instead of [`DEMO_BUYER_SECRET`]; only before the
/// first token (later calls change nothing).
pub fn use_secret(secret: &str) {
    let _ = SECRET.set(secret.to_owned());
}

/// The key tokens are signed with.
pub fn secret() -> &'static str {
    SECRET.get_or_init(|| DEMO_BUYER_SECRET.to_owned())
}

/// A token for buyer `user`.
pub fn token(user: impl Into<i64>) -> String {
    ISSUER
        .get_or_init(|| Issuer::hs256(secret()))
        .token(user.into(), VALID_FOR)
}
