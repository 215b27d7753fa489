//! Two more groups of settings: who a buyer is ([`IdentitySettings`]), and how often one
//! buyer or one address may try to buy ([`LimitSettings`]).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use ipnet::IpNet;
use secrecy::SecretString;

use super::groups::secret;
use super::range;

/// Whether buyers must prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BuyerIdentity {
    /// A purchase carries `Authorization: Bearer <JWT>`; the buyer is the token's subject.
    Jwt,
    /// UNSAFE: the `user_id` in the body is believed, as before identity existed. For
    /// benchmarks that measure the sale without it; logged loudly, shown in `/readyz`.
    Off,
}

/// The JWT algorithms a buyer token may be signed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "verbatim")]
pub enum JwtAlgorithm {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl JwtAlgorithm {
    /// Whether the algorithm takes a shared secret (the others a public key).
    pub fn is_hmac(self) -> bool {
        matches!(self, Self::HS256 | Self::HS384 | Self::HS512)
    }
}

/// Buyers: each purchase and each order read carries a bearer token, a JWT signed by the
/// deployment's identity provider. The buyer is the token's `sub`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Buyers")]
pub struct IdentitySettings {
    /// `jwt`: every purchase and order read needs a buyer token (the default). `off`: the
    /// body's `user_id` is believed and order reads are public: UNSAFE, for benchmarks only,
    /// logged at start-up and shown in `/readyz`.
    #[arg(
        long = "buyer-identity",
        id = "buyer_identity",
        value_name = "BUYER_IDENTITY",
        env = "BUYER_IDENTITY",
        value_enum,
        default_value_t = BuyerIdentity::Jwt,
    )]
    pub mode: BuyerIdentity,

    /// The shared secret buyer tokens are signed with, for BUYER_JWT_ALGORITHM HS256, HS384
    /// or HS512: at least 32 bytes. Kept out of logs and debug output.
    #[arg(
        long = "buyer-jwt-secret",
        id = "buyer_jwt_secret",
        value_name = "BUYER_JWT_SECRET",
        env = "BUYER_JWT_SECRET",
        hide_env_values = true,
        value_parser = secret,
    )]
    pub secret: Option<SecretString>,

    /// A PEM file with the identity provider's public key (RSA, EC or Ed25519), for an
    /// asymmetric BUYER_JWT_ALGORITHM.
    #[arg(
        long = "buyer-jwt-public-key-file",
        id = "buyer_jwt_public_key_file",
        value_name = "BUYER_JWT_PUBLIC_KEY_FILE",
        env = "BUYER_JWT_PUBLIC_KEY_FILE"
    )]
    pub public_key_file: Option<PathBuf>,

    /// A JWKS file (`{"keys": [...]}`, as providers publish at `/.well-known/jwks.json`):
    /// a token's `kid` picks its key. Read at start-up; restart to take new keys.
    #[arg(
        long = "buyer-jwt-jwks-file",
        id = "buyer_jwt_jwks_file",
        value_name = "BUYER_JWT_JWKS_FILE",
        env = "BUYER_JWT_JWKS_FILE"
    )]
    pub jwks_file: Option<PathBuf>,

    /// The one algorithm buyer tokens are accepted with; a token signed with another (or
    /// with `none`) is refused.
    #[arg(
        long = "buyer-jwt-algorithm",
        id = "buyer_jwt_algorithm",
        value_name = "BUYER_JWT_ALGORITHM",
        env = "BUYER_JWT_ALGORITHM",
        value_enum,
        default_value_t = JwtAlgorithm::HS256,
    )]
    pub algorithm: JwtAlgorithm,

    /// When set, a token's `iss` must be this.
    #[arg(
        long = "buyer-jwt-issuer",
        id = "buyer_jwt_issuer",
        value_name = "BUYER_JWT_ISSUER",
        env = "BUYER_JWT_ISSUER"
    )]
    pub issuer: Option<String>,

    /// When set, a token's `aud` must hold this.
    #[arg(
        long = "buyer-jwt-audience",
        id = "buyer_jwt_audience",
        value_name = "BUYER_JWT_AUDIENCE",
        env = "BUYER_JWT_AUDIENCE"
    )]
    pub audience: Option<String>,

    /// How far apart the provider's clock and this instance's may be, in seconds, when
    /// `exp` and `nbf` are checked.
    #[arg(
        long = "buyer-jwt-leeway-s",
        id = "buyer_jwt_leeway_s",
        value_name = "BUYER_JWT_LEEWAY_S",
        env = "BUYER_JWT_LEEWAY_S",
        default_value_t = 5,
        value_parser = range::BUYER_JWT_LEEWAY.parser(),
    )]
    pub leeway_s: u32,
}

/// How often one client may try to buy, per instance: per buyer (the token's subject) and
/// per client address, each a rate with a burst. Over it: `429` with `Retry-After`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitSettings {
    /// Purchase attempts per second one buyer may make on this instance (0: no limit).
    #[arg(
        long = "buyer-rate",
        id = "buyer_rate",
        value_name = "BUYER_RATE",
        env = "BUYER_RATE",
        default_value_t = 5,
        value_parser = range::BUYER_RATE.parser(),
    )]
    pub buyer_rate: u32,

    /// Attempts one buyer may make at once before BUYER_RATE applies.
    #[arg(
        long = "buyer-burst",
        id = "buyer_burst",
        value_name = "BUYER_BURST",
        env = "BUYER_BURST",
        default_value_t = 10,
        value_parser = range::BUYER_BURST.parser(),
    )]
    pub buyer_burst: u32,

    /// Purchase attempts per second from one client address on this instance (0: no
    /// limit). Many buyers can share an address (a carrier's NAT, an office): keep it well
    /// above BUYER_RATE.
    #[arg(
        long = "address-rate",
        id = "address_rate",
        value_name = "ADDRESS_RATE",
        env = "ADDRESS_RATE",
        default_value_t = 200,
        value_parser = range::ADDRESS_RATE.parser(),
    )]
    pub address_rate: u32,

    /// Attempts from one address at once before ADDRESS_RATE applies.
    #[arg(
        long = "address-burst",
        id = "address_burst",
        value_name = "ADDRESS_BURST",
        env = "ADDRESS_BURST",
        default_value_t = 400,
        value_parser = range::ADDRESS_BURST.parser(),
    )]
    pub address_burst: u32,

    /// Proxies whose `X-Forwarded-For` is believed, comma-separated addresses or networks
    /// (`10.0.0.0/8`). A request from one of them is limited by the address it forwarded
    /// for (the nearest one that is not itself a trusted proxy); a request from anywhere
    /// else by its own address, whatever it claims. Behind a proxy not listed here, every
    /// buyer has the proxy's address.
    #[arg(
        long = "trusted-proxies",
        id = "trusted_proxies",
        value_name = "TRUSTED_PROXIES",
        env = "TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpNet>,
}
