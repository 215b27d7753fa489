//! Who is buying: a bearer token, a JWT signed by the deployment's identity provider, whose
//! subject (`sub`) is the buyer's id.
//!
//! [`Verifier`] checks a token with the one algorithm and key the settings name: the
//! signature, `exp` (required), `nbf` when present, `iss` and `aud` when configured, with a
//! small clock leeway. A token signed with another algorithm, `none` included, is refused
//! before its signature is looked at. A shared secret's tokens, the common case, are checked
//! by `shared_secret`, in one pass; public keys and key sets by `jsonwebtoken`. [`Issuer`]
//! makes tokens with a shared secret: for the load test, the demo and the tests, which play
//! the identity provider.

mod shared_secret;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};

use crate::domain::UserId;
use crate::settings::{BuyerIdentity, IdentitySettings, JwtAlgorithm};
use shared_secret::SharedSecret;

/// The longest `Authorization` header a purchase may carry: real tokens are well under 2 KiB.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// How buyers are known to this instance.
pub enum Identity {
    /// By their tokens (boxed: the verifier is large, and read once per purchase).
    Verified(Box<Verifier>),
    /// UNSAFE: by the `user_id` they claim (`BUYER_IDENTITY=off`).
    Off,
}

impl Identity {
    /// As the settings say (checked before: one key, fitting the algorithm).
    ///
    /// # Errors
    /// A key file that cannot be read or parsed, named in the message.
    pub fn from_settings(settings: &IdentitySettings) -> anyhow::Result<Self> {
        match settings.mode {
            BuyerIdentity::Off => Ok(Identity::Off),
            BuyerIdentity::Jwt => Verifier::from_settings(settings)
                .map(|verifier| Identity::Verified(Box::new(verifier))),
        }
    }

    /// The name `/readyz` shows.
    pub fn name(&self) -> &'static str {
        match self {
            Identity::Verified(_) => "jwt",
            Identity::Off => "off",
        }
    }
}

/// Checks buyer tokens.
pub struct Verifier(Check);

// A process holds one, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Check {
    /// With a shared secret (`BUYER_JWT_SECRET`).
    SharedSecret(SharedSecret),
    /// With a public key or a key set, by `jsonwebtoken`.
    PublicKey { keys: Keys, validation: Validation },
}

/// One key, or a set picked from by the token's `kid`.
enum Keys {
    One(DecodingKey),
    Set(Vec<(Option<String>, DecodingKey)>),
}

/// Why a token was refused: the message a `401` carries (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this route needs `Authorization: Bearer <token>`, a buyer token")]
    Missing,
    #[error("the buyer token is not valid: {0}")]
    Invalid(&'static str),
}

/// What the service reads of a token signed with a public key (`exp`, `nbf`, `iss`, `aud`
/// are checked by [`Validation`]); a shared secret's tokens are read by [`SharedSecret`].
#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl Verifier {
    fn from_settings(settings: &IdentitySettings) -> anyhow::Result<Self> {
        if let Some(secret) = &settings.secret {
            return SharedSecret::new(
                settings.algorithm,
                secret.expose_secret().as_bytes(),
                u64::from(settings.leeway_s),
                settings.issuer.clone(),
                settings.audience.clone(),
            )
            .map(|secret| Verifier(Check::SharedSecret(secret)))
            .with_context(|| {
                format!(
                    "BUYER_JWT_SECRET is for HS256, HS384 or HS512, not {:?}",
                    settings.algorithm
                )
            });
        }
        let algorithm = algorithm(settings.algorithm);
        let keys = if let Some(path) = &settings.public_key_file {
            Keys::One(public_key(path, algorithm)?)
        } else if let Some(path) = &settings.jwks_file {
            Keys::Set(key_set(path)?)
        } else {
            anyhow::bail!("buyers need a key to check their tokens with (BUYER_JWT_SECRET)");
        };
        Ok(Verifier(Check::PublicKey {
            keys,
            validation: validation(settings, algorithm),
        }))
    }

    /// The buyer an `Authorization` header names, or why not.
    ///
    /// # Errors
    /// [`Refused::Missing`] without a bearer token; [`Refused::Invalid`] for anything else
    /// wrong with it.
    pub fn buyer(&self, authorization: Option<&[u8]>) -> Result<UserId, Refused> {
        let Some(header) = authorization else {
            return Err(Refused::Missing);
        };
        if header.len() > MAX_TOKEN_BYTES {
            return Err(Refused::Invalid("the Authorization header is too long"));
        }
        let token = std::str::from_utf8(header)
            .ok()
            .and_then(|value| value.split_once(' '))
            // The scheme is case-insensitive (RFC 9110).
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or(Refused::Missing)?;
        match &self.0 {
            Check::SharedSecret(secret) => secret.buyer(token),
            Check::PublicKey { keys, validation } => {
                let key = keys.key_for(token)?;
                let claims = jsonwebtoken::decode::<Claims>(token, key, validation)
                    .map_err(|error| Refused::Invalid(reason(error.kind())))?
                    .claims;
                buyer_id(&claims.sub)
            }
        }
    }
}

/// The buyer a subject names: digits only, written as the id is (`007` is not buyer 7).
fn buyer_id(sub: &str) -> Result<UserId, Refused> {
    sub.parse::<i64>()
        .ok()
        .filter(|id| id.to_string() == sub)
        .and_then(|id| UserId::parse(id).ok())
        .ok_or(Refused::Invalid("its subject is not a buyer id"))
}

/// What `jsonwebtoken` checks of a token signed for `settings`.
fn validation(settings: &IdentitySettings, algorithm: Algorithm) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.leeway = u64::from(settings.leeway_s);
    validation.validate_nbf = true;
    let mut required = vec!["exp", "sub"];
    if let Some(issuer) = &settings.issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    if let Some(audience) = &settings.audience {
        validation.set_audience(&[audience]);
        required.push("aud");
    } else {
        validation.validate_aud = false;
    }
    validation.set_required_spec_claims(&required);
    validation
}

impl Keys {
    fn key_for(&self, token: &str) -> Result<&DecodingKey, Refused> {
        match self {
            Keys::One(key) => Ok(key),
            Keys::Set(keys) => {
                let header = jsonwebtoken::decode_header(token)
                    .map_err(|error| Refused::Invalid(reason(error.kind())))?;
                let found = match header.kid {
                    Some(kid) => keys.iter().find(|(id, _)| id.as_deref() == Some(&kid)),
                    None if keys.len() == 1 => keys.first(),
                    None => None,
                };
                found
                    .map(|(_, key)| key)
                    .ok_or(Refused::Invalid("no key of the set has its kid"))
            }
        }
    }
}

/// What a `401` says about a token refused for `kind`.
fn reason(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "it has expired",
        ErrorKind::ImmatureSignature => "it is not valid yet (nbf)",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            "it is not signed with the algorithm this service takes"
        }
        ErrorKind::MissingRequiredClaim(_) => "a required claim is missing (exp, sub, iss, aud)",
        _ => "malformed",
    }
}

pub(super) fn algorithm(algorithm: JwtAlgorithm) -> Algorithm {
    match algorithm {
        JwtAlgorithm::HS256 => Algorithm::HS256,
        JwtAlgorithm::HS384 => Algorithm::HS384,
        JwtAlgorithm::HS512 => Algorithm::HS512,
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::RS384 => Algorithm::RS384,
        JwtAlgorithm::RS512 => Algorithm::RS512,
        JwtAlgorithm::PS256 => Algorithm::PS256,
        JwtAlgorithm::PS384 => Algorithm::PS384,
        JwtAlgorithm::PS512 => Algorithm::PS512,
        JwtAlgorithm::ES256 => Algorithm::ES256,
        JwtAlgorithm::ES384 => Algorithm::ES384,
        JwtAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

fn public_key(path: &Path, algorithm: Algorithm) -> anyhow::Result<DecodingKey> {
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read BUYER_JWT_PUBLIC_KEY_FILE {}", path.display()))?;
    let key = match algorithm {
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
        _ => DecodingKey::from_rsa_pem(&pem),
    };
    key.with_context(|| {
        format!(
            "BUYER_JWT_PUBLIC_KEY_FILE {} is not a {algorithm:?} public key in PEM",
            path.display()
        )
    })
}

fn key_set(path: &Path) -> anyhow::Result<Vec<(Option<String>, DecodingKey)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read BUYER_JWT_JWKS_FILE {}", path.display()))?;
    let set: JwkSet = serde_json::from_str(&text)
        .with_context(|| format!("BUYER_JWT_JWKS_FILE {} is not a JWKS", path.display()))?;
    let keys = set
        .keys
        .iter()
        .map(|jwk| {
            let key = DecodingKey::from_jwk(jwk).with_context(|| {
                format!(
                    "a key in BUYER_JWT_JWKS_FILE {} cannot be used",
                    path.display()
                )
            })?;
            Ok((jwk.common.key_id.clone(), key))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !keys.is_empty(),
        "BUYER_JWT_JWKS_FILE {} holds no key",
        path.display()
    );
    Ok(keys)
}

/// Makes buyer tokens signed with a shared secret (HS256): what the load test, the demo and
/// the tests use in place of an identity provider.
#[derive(Clone)]
pub struct Issuer {
    key: EncodingKey,
    header: Header,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(Serialize)]
struct Minted<'a> {
    sub: String,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
}

impl Issuer {
    /// Tokens signed with `secret` (`BUYER_JWT_SECRET` of the instances that check them).
    pub fn hs256(secret: &str) -> Self {
        Self {
            key: EncodingKey::from_secret(secret.as_bytes()),
            header: Header::new(Algorithm::HS256),
            issuer: None,
            audience: None,
        }
    }

    /// With `iss` and `aud` claims (for instances that check them).
    pub fn with_claims(mut self, issuer: Option<String>, audience: Option<String>) -> Self {
        self.issuer = issuer;
        self.audience = audience;
        self
    }

    /// A token for `buyer`, valid for `valid_for` from now.
    pub fn token(&self, buyer: i64, valid_for: Duration) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let claims = Minted {
            sub: buyer.to_string(),
            exp: (now + valid_for).as_secs(),
            iss: self.issuer.as_deref(),
            aud: self.audience.as_deref(),
        };
        jsonwebtoken::encode(&self.header, &claims, &self.key).expect("HS256 signing cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    const SECRET: &str = "a-buyer-secret-of-at-least-32-bytes";

    fn verifier(change: impl FnOnce(&mut IdentitySettings)) -> Verifier {
        let mut settings = Settings::new("postgres://x", "redis://r").identity;
        settings.secret = Some(SECRET.into());
        change(&mut settings);
        Verifier::from_settings(&settings).unwrap()
    }

    fn bearer(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    /// An Ed25519 key pair made for these tests (`openssl genpkey -algorithm ed25519`), as
    /// an identity provider signing asymmetrically would hold it.
    const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIIJJ7dmtsWcGfPBZobXTQfdArvcOfu48osNFOn0RTfGr
-----END PRIVATE KEY-----
";
    const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA51YSs3ATcO1njIN8f9srZKVreONWpaMdT3N02ssn4wE=
-----END PUBLIC KEY-----
";
    /// The same public key as a JWK's `x`, and another key's.
    const ED_X: &str = "51YSs3ATcO1njIN8f9srZKVreONWpaMdT3N02ssn4wE";
    const OTHER_ED_X: &str = "JtbnZrRLTpVhVY90VVDJueqXGpnmbYQAOF3DVJ2RHys";

    fn ed_token(kid: Option<&str>, buyer: i64) -> Vec<u8> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = kid.map(Into::into);
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60;
        let claims = serde_json::json!({"sub": buyer.to_string(), "exp": exp});
        let key = EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
        bearer(&jsonwebtoken::encode(&header, &claims, &key).unwrap())
    }

    /// `text` in a file of this test process's own.
    fn key_file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("seckill-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_public_key_or_a_key_set_checks_tokens_an_identity_provider_signed() {
        let public_key = key_file("ed.pem", ED_PUBLIC);
        let by_key = verifier(|s| {
            s.secret = None;
            s.algorithm = JwtAlgorithm::EdDSA;
            s.public_key_file = Some(public_key.clone());
        });
        assert_eq!(by_key.buyer(Some(&ed_token(None, 42))).unwrap().get(), 42);
        let hs256 = Issuer::hs256(SECRET).token(42, Duration::from_secs(60));
        assert!(by_key.buyer(Some(&bearer(&hs256))).is_err());

        let jwks = serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "old", "x": OTHER_ED_X},
            {"kty": "OKP", "crv": "Ed25519", "kid": "new", "x": ED_X},
        ]});
        let set = key_file("jwks.json", &jwks.to_string());
        let by_set = verifier(|s| {
            s.secret = None;
            s.algorithm = JwtAlgorithm::EdDSA;
            s.jwks_file = Some(set.clone());
        });
        assert_eq!(
            by_set.buyer(Some(&ed_token(Some("new"), 7))).unwrap().get(),
            7
        );
        assert_eq!(
            by_set.buyer(Some(&ed_token(Some("old"), 7))),
            Err(Refused::Invalid("bad signature"))
        );
        for kid in [Some("gone"), None] {
            assert_eq!(
                by_set.buyer(Some(&ed_token(kid, 7))),
                Err(Refused::Invalid("no key of the set has its kid")),
                "{kid:?}"
            );
        }
        std::fs::remove_file(public_key).unwrap();
        std::fs::remove_file(set).unwrap();
    }

    #[test]
    fn a_token_names_its_buyer_and_a_changed_one_is_refused() {
        let verifier = verifier(|_| {});
        let token = Issuer::hs256(SECRET).token(42, Duration::from_secs(60));
        assert_eq!(verifier.buyer(Some(&bearer(&token))).unwrap().get(), 42);
        // The scheme in any case; the payload changed under the signature is refused.
        let lower = format!("bearer {token}").into_bytes();
        assert_eq!(verifier.buyer(Some(&lower)).unwrap().get(), 42);
        let (head, rest) = token.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let other = Issuer::hs256(SECRET).token(43, Duration::from_secs(60));
        let other_payload = other.split('.').nth(1).unwrap();
        let forged = format!("{head}.{other_payload}.{signature}");
        assert_eq!(
            verifier.buyer(Some(&bearer(&forged))),
            Err(Refused::Invalid("bad signature"))
        );
    }

    #[test]
    fn issuer_and_audience_are_checked_only_when_configured() {
        let strict = verifier(|s| {
            s.issuer = Some("shop".into());
            s.audience = Some("seckill".into());
        });
        let plain = Issuer::hs256(SECRET).token(7, Duration::from_secs(60));
        assert!(strict.buyer(Some(&bearer(&plain))).is_err());
        let right = Issuer::hs256(SECRET)
            .with_claims(Some("shop".into()), Some("seckill".into()))
            .token(7, Duration::from_secs(60));
        assert_eq!(strict.buyer(Some(&bearer(&right))).unwrap().get(), 7);
        let wrong = Issuer::hs256(SECRET)
            .with_claims(Some("other".into()), Some("seckill".into()))
            .token(7, Duration::from_secs(60));
        assert_eq!(
            strict.buyer(Some(&bearer(&wrong))),
            Err(Refused::Invalid("wrong issuer"))
        );
        // A token with an audience is taken where none is configured.
        assert_eq!(
            verifier(|_| {}).buyer(Some(&bearer(&right))).unwrap().get(),
            7
        );
    }

    #[test]
    fn a_missing_or_foreign_scheme_is_missing_and_a_huge_header_is_refused() {
        let verifier = verifier(|_| {});
        assert_eq!(verifier.buyer(None), Err(Refused::Missing));
        assert_eq!(
            verifier.buyer(Some(b"Basic dXNlcjpwYXNz")),
            Err(Refused::Missing)
        );
        let huge = bearer(&"a".repeat(MAX_TOKEN_BYTES));
        assert!(matches!(
            verifier.buyer(Some(&huge)),
            Err(Refused::Invalid(_))
        ));
    }
}
