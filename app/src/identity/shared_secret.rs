//! Tokens signed with a shared secret (HS256, HS384, HS512), checked in one pass.
//!
//! This is the check every purchase pays for, so it is written for that. It checks what
//! `jsonwebtoken::decode` checks with the same settings (the test below holds the two to
//! the same answers over a corpus of good and bad tokens), at about a third of the cost:
//! the library, per call, reads the header twice, schedules the HMAC key afresh and reads
//! the claims twice, into owned strings. Here the key is scheduled once, at start-up, and
//! header and claims are read once each, borrowed where they can be (docs/performance.md,
//! "Buyers' tokens").
//!
//! One difference, on purpose: of the header only `alg` is read, so a header whose other
//! fields the library would not parse (a `kid` that is a number, say) is not refused for it.
//! The header is signed: only the holder of the secret can write one.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::value::RawValue;
use sha2::{Sha256, Sha384, Sha512};

use super::{MAX_TOKEN_BYTES, Refused};
use crate::domain::UserId;
use crate::settings::JwtAlgorithm;

/// Checks tokens signed with one secret by one HMAC algorithm.
pub(super) struct SharedSecret {
    key: Key,
    /// The `alg` a token's header must name, exactly.
    algorithm: &'static str,
    leeway_s: u64,
    issuer: Option<String>,
    audience: Option<String>,
}

/// The secret, its HMAC key schedule done (cloned per token: a copy, not a rehash).
enum Key {
    Hs256(Hmac<Sha256>),
    Hs384(Hmac<Sha384>),
    Hs512(Hmac<Sha512>),
}

impl Key {
    /// Whether `signature` is `message`'s MAC (compared in constant time).
    fn signed(&self, message: &[u8], signature: &[u8]) -> bool {
        match self {
            Key::Hs256(key) => verify(key, message, signature),
            Key::Hs384(key) => verify(key, message, signature),
            Key::Hs512(key) => verify(key, message, signature),
        }
    }
}

fn verify<M: Mac + Clone>(key: &M, message: &[u8], signature: &[u8]) -> bool {
    key.clone()
        .chain_update(message)
        .verify_slice(signature)
        .is_ok()
}

/// What is read of the header.
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
}

/// What is read of the claims. `iss` and `aud` are kept unread (raw) until a setting asks
/// for them, as the library ignores them, whatever their type, when none is configured.
#[derive(Deserialize)]
struct Claims<'a> {
    #[serde(borrow, default)]
    sub: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "numeric_date")]
    exp: Option<u64>,
    #[serde(default, deserialize_with = "numeric_date")]
    nbf: Option<u64>,
    #[serde(borrow, default)]
    iss: Option<&'a RawValue>,
    #[serde(borrow, default)]
    aud: Option<&'a RawValue>,
}

/// A claim naming one value or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Many(#[serde(borrow)] Vec<Cow<'a, str>>),
}

impl OneOrMany<'_> {
    fn names(&self, wanted: &str) -> bool {
        match self {
            OneOrMany::One(one) => one == wanted,
            OneOrMany::Many(many) => many.iter().any(|one| one == wanted),
        }
    }
}

/// A NumericDate (RFC 7519): whole seconds, or a fraction rounded as the library does.
/// Present, it must be one (`null` is not).
fn numeric_date<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seconds {
        Whole(u64),
        Fraction(f64),
    }
    match Seconds::deserialize(deserializer)? {
        Seconds::Whole(seconds) => Ok(Some(seconds)),
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        Seconds::Fraction(seconds)
            if seconds.is_finite() && seconds >= 0.0 && seconds < u64::MAX as f64 =>
        {
            Ok(Some(seconds.round() as u64))
        }
        Seconds::Fraction(_) => Err(de::Error::custom("not a NumericDate")),
    }
}

const MALFORMED: Refused = Refused::Invalid("malformed");
const MISSING: Refused = Refused::Invalid("a required claim is missing (exp, sub, iss, aud)");

impl SharedSecret {
    pub(super) fn new(
        algorithm: JwtAlgorithm,
        secret: &[u8],
        leeway_s: u64,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Option<Self> {
        // HMAC takes a key of any length: these cannot fail.
        let (key, name) = match algorithm {
            JwtAlgorithm::HS256 => (Key::Hs256(Hmac::new_from_slice(secret).ok()?), "HS256"),
            JwtAlgorithm::HS384 => (Key::Hs384(Hmac::new_from_slice(secret).ok()?), "HS384"),
            JwtAlgorithm::HS512 => (Key::Hs512(Hmac::new_from_slice(secret).ok()?), "HS512"),
            _ => return None,
        };
        Some(Self {
            key,
            algorithm: name,
            leeway_s,
            issuer,
            audience,
        })
    }

    /// The buyer `token` names, or why it is refused.
    pub(super) fn buyer(&self, token: &str) -> Result<UserId, Refused> {
        let (signed, signature) = token.rsplit_once('.').ok_or(MALFORMED)?;
        let (header, payload) = signed.rsplit_once('.').ok_or(MALFORMED)?;

        // The algorithm first: a token signed otherwise (`none` included) is refused before
        // its signature is looked at.
        let header = decode(header)?;
        let header: Header = object(&header)?;
        if header.alg != self.algorithm {
            return Err(Refused::Invalid(
                "it is not signed with the algorithm this service takes",
            ));
        }
        if !self.key.signed(signed.as_bytes(), &decode(signature)?) {
            return Err(Refused::Invalid("bad signature"));
        }

        let claims = decode(payload)?;
        let claims: Claims = object(&claims)?;
        let exp = claims.exp.ok_or(MISSING)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if exp < now.saturating_sub(self.leeway_s) {
            return Err(Refused::Invalid("it has expired"));
        }
        if claims.nbf.is_some_and(|nbf| nbf > now + self.leeway_s) {
            return Err(Refused::Invalid("it is not valid yet (nbf)"));
        }
        check_named(claims.iss, self.issuer.as_deref(), "wrong issuer")?;
        check_named(claims.aud, self.audience.as_deref(), "wrong audience")?;
        super::buyer_id(&claims.sub.ok_or(MISSING)?)
    }
}

/// `iss` or `aud` against its setting: present and naming it, when one is configured.
fn check_named(
    claim: Option<&RawValue>,
    wanted: Option<&str>,
    wrong: &'static str,
) -> Result<(), Refused> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    // A claim of another type is, for the library, as good as missing.
    let named = claim
        .and_then(|raw| serde_json::from_str::<OneOrMany>(raw.get()).ok())
        .ok_or(MISSING)?;
    if named.names(wanted) {
        Ok(())
    } else {
        Err(Refused::Invalid(wrong))
    }
}

/// A JSON object read as `T` (only an object: serde would read a struct from an array too).
fn object<'a, T: Deserialize<'a>>(json: &'a [u8]) -> Result<T, Refused> {
    if json.trim_ascii_start().first() != Some(&b'{') {
        return Err(MALFORMED);
    }
    serde_json::from_slice(json).map_err(|_| MALFORMED)
}

/// One base64url part of a token, decoded (a token is at most [`MAX_TOKEN_BYTES`]).
fn decode(part: &str) -> Result<Vec<u8>, Refused> {
    debug_assert!(part.len() <= MAX_TOKEN_BYTES);
    URL_SAFE_NO_PAD.decode(part).map_err(|_| MALFORMED)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{Algorithm, EncodingKey};
    use serde_json::json;

    use super::*;
    use crate::identity::{Claims as LibraryClaims, buyer_id, reason, validation};
    use crate::settings::{IdentitySettings, Settings};

    const SECRET: &str = "a-buyer-secret-of-at-least-32-bytes";

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// `header.payload.signature`, from raw JSON, signed by `algorithm` with `secret`.
    fn token(header: &str, payload: &str, algorithm: Algorithm, secret: &str) -> String {
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let key = EncodingKey::from_secret(secret.as_bytes());
        let signature = jsonwebtoken::crypto::sign(signed.as_bytes(), &key, algorithm).unwrap();
        format!("{signed}.{signature}")
    }

    /// What `jsonwebtoken::decode` answers for `token` under `settings`.
    fn library(settings: &IdentitySettings, token: &str) -> Result<UserId, Refused> {
        let key = jsonwebtoken::DecodingKey::from_secret(SECRET.as_bytes());
        let algorithm = match settings.algorithm {
            JwtAlgorithm::HS384 => Algorithm::HS384,
            _ => Algorithm::HS256,
        };
        let claims =
            jsonwebtoken::decode::<LibraryClaims>(token, &key, &validation(settings, algorithm))
                .map_err(|error| Refused::Invalid(reason(error.kind())))?
                .claims;
        buyer_id(&claims.sub)
    }

    /// Good and bad tokens, each varying one thing from a good one.
    fn corpus() -> Vec<String> {
        let now = now();
        let good_header = r#"{"alg":"HS256","typ":"JWT"}"#;
        let headers = [
            good_header.to_owned(),
            r#"{"alg":"HS384"}"#.into(),
            r#"{"alg":"HS512"}"#.into(),
            r#"{"alg":"none"}"#.into(),
            r#"{"alg":"hs256"}"#.into(),
            r#"{"typ":"JWT"}"#.into(),
            r#"{"alg":"HS256","kid":"k1","cty":"x"}"#.into(),
            r#"{"alg":"HS256","alg":"none"}"#.into(),
            r#"{"alg":"\u0048S256"}"#.into(),
            r#"{"alg":5}"#.into(),
            r#"["HS256"]"#.into(),
            r#" {"alg":"HS256"}"#.into(),
            "not json".into(),
        ];
        let exps = [
            json!(now + 3_600),
            json!(now),
            json!(now - 30),
            json!(now - 100),
            json!(now as f64 + 3_600.6),
            json!(now as f64 - 30.4),
            json!("9999999999"),
            json!(-5),
            json!(null),
            json!(1e300),
            json!(u64::MAX),
        ];
        let nbfs = [
            json!(now - 10),
            json!(now + 30),
            json!(now + 100),
            json!(now as f64 + 29.6),
            json!("0"),
            json!(null),
            json!(-1),
        ];
        let subs = [
            json!("5"),
            json!("9223372036854775807"),
            json!("0"),
            json!("-5"),
            json!("005"),
            json!("alice"),
            json!(""),
            json!(5),
            json!(null),
        ];
        let names = |one: &str| {
            [
                json!(one),
                json!("other"),
                json!(["other", one]),
                json!(["other"]),
                json!([]),
                json!(5),
                json!(null),
            ]
        };
        let base = || {
            json!({"sub": "5", "exp": now + 3_600, "iss": "shop", "aud": "seckill"})
                .as_object()
                .unwrap()
                .clone()
        };
        let mut payloads: Vec<String> = Vec::new();
        let mut vary = |claim: &str, values: &[serde_json::Value]| {
            for value in values {
                let mut claims = base();
                claims.insert(claim.into(), value.clone());
                payloads.push(serde_json::Value::Object(claims).to_string());
            }
            let mut without = base();
            without.remove(claim);
            payloads.push(serde_json::Value::Object(without).to_string());
        };
        vary("exp", &exps);
        vary("nbf", &nbfs);
        vary("sub", &subs);
        vary("iss", &names("shop"));
        vary("aud", &names("seckill"));
        let exp = now + 3_600;
        payloads.extend([
            format!(r#"{{"sub":"\u0035","exp":{exp},"iss":"shop","aud":"seckill"}}"#),
            format!(r#"{{"sub":"5","sub":"6","exp":{exp},"iss":"shop","aud":"seckill"}}"#),
            format!(r#"{{"sub":"5","exp":{exp},"exp":1,"iss":"shop","aud":"seckill"}}"#),
            format!(r#"{{"sub":"5","exp":{exp},"iss":"sh\u006fp","aud":["seckill"]}}"#),
            "[]".into(),
            "\"5\"".into(),
            "{}".into(),
        ]);

        let mut tokens = Vec::new();
        for header in &headers {
            tokens.push(token(header, &payloads[0], Algorithm::HS256, SECRET));
        }
        for payload in &payloads {
            tokens.push(token(good_header, payload, Algorithm::HS256, SECRET));
            tokens.push(token(
                r#"{"alg":"HS384"}"#,
                payload,
                Algorithm::HS384,
                SECRET,
            ));
        }
        let good = token(good_header, &payloads[0], Algorithm::HS256, SECRET);
        let (signed, signature) = good.rsplit_once('.').unwrap();
        let (header, payload) = signed.split_once('.').unwrap();
        tokens.extend([
            token(
                good_header,
                &payloads[0],
                Algorithm::HS256,
                "another-secret-of-at-least-32-bytes!",
            ),
            format!("{signed}."),
            format!("{signed}.{signature}="),
            format!("{signed}.{signature}A"),
            format!("{signed}.{signature}{signature}"),
            format!("{header}.{payload}x.{signature}"),
            format!("{header}..{payload}.{signature}"),
            format!("{header}.{payload}.{signature}.{signature}"),
            format!(".{payload}.{signature}"),
            format!("{header}.{payload}"),
            format!("{header}=.{payload}.{signature}"),
            "..".into(),
            String::new(),
            good,
        ]);
        tokens
    }

    #[test]
    fn it_answers_as_the_library_does() {
        let mut checked = 0;
        for (issuer, audience) in [(None, None), (Some("shop"), Some("seckill"))] {
            for leeway_s in [0, 60] {
                for algorithm in [JwtAlgorithm::HS256, JwtAlgorithm::HS384] {
                    let mut settings = Settings::new("postgres://x", "redis://r").identity;
                    settings.algorithm = algorithm;
                    settings.leeway_s = leeway_s;
                    settings.issuer = issuer.map(Into::into);
                    settings.audience = audience.map(Into::into);
                    let ours = SharedSecret::new(
                        algorithm,
                        SECRET.as_bytes(),
                        u64::from(leeway_s),
                        settings.issuer.clone(),
                        settings.audience.clone(),
                    )
                    .unwrap();
                    let mut accepted = 0;
                    for token in corpus() {
                        let (ours, theirs) = (ours.buyer(&token), library(&settings, &token));
                        // The reasons may differ (the library reads the subject before it
                        // checks the claims, and says "malformed" when it is missing), the
                        // verdict and the buyer may not.
                        assert_eq!(
                            ours.as_ref().ok(),
                            theirs.as_ref().ok(),
                            "{token}: ours {ours:?}, the library's {theirs:?}, \
                             {issuer:?} {audience:?} leeway {leeway_s} {algorithm:?}"
                        );
                        accepted += usize::from(ours.is_ok());
                        checked += 1;
                    }
                    // The corpus holds good tokens too, so agreeing is not refusing all.
                    assert!(accepted >= 10, "only {accepted} accepted");
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }

    #[test]
    fn it_refuses_for_the_reasons_the_library_gives() {
        let ours = SharedSecret::new(
            JwtAlgorithm::HS256,
            SECRET.as_bytes(),
            0,
            Some("shop".into()),
            None,
        )
        .unwrap();
        let now = now();
        let header = r#"{"alg":"HS256"}"#;
        let cases = [
            (
                format!(r#"{{"sub":"5","exp":{},"iss":"shop"}}"#, now - 5),
                "it has expired",
            ),
            (
                format!(
                    r#"{{"sub":"5","exp":{},"nbf":{},"iss":"shop"}}"#,
                    now + 60,
                    now + 30
                ),
                "it is not valid yet (nbf)",
            ),
            (
                format!(r#"{{"sub":"5","exp":{},"iss":"other"}}"#, now + 60),
                "wrong issuer",
            ),
            (
                format!(r#"{{"sub":"5","exp":{}}}"#, now + 60),
                "a required claim is missing (exp, sub, iss, aud)",
            ),
            (
                format!(r#"{{"sub":"x","exp":{},"iss":"shop"}}"#, now + 60),
                "its subject is not a buyer id",
            ),
        ];
        for (payload, why) in cases {
            let token = token(header, &payload, Algorithm::HS256, SECRET);
            assert_eq!(ours.buyer(&token), Err(Refused::Invalid(why)), "{payload}");
        }
        let foreign = token(header, "{}", Algorithm::HS256, "another-secret");
        assert_eq!(ours.buyer(&foreign), Err(Refused::Invalid("bad signature")));
        let none = token(r#"{"alg":"none"}"#, "{}", Algorithm::HS256, SECRET);
        assert_eq!(
            ours.buyer(&none),
            Err(Refused::Invalid(
                "it is not signed with the algorithm this service takes"
            ))
        );
    }
}
