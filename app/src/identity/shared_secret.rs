//! Tokens signed with a shared secret (HS256, HS384, HS512), checked in one pass.
//!
//! This is the check every purchase pays for, so it is written for that. It gives the
//! verdict `jsonwebtoken::decode` gives with the same settings (the tests below hold the two
//! to the same answer over a corpus of good, forged, tampered and malformed tokens) at less
//! than half its cost: per call, the library reads the header twice, schedules the HMAC key
//! afresh, and reads the claims twice (once for its checks, once for the caller's type).
//! Here the key is scheduled once, at start-up, and header and claims are read once each
//! (docs/performance.md, "Buyers' tokens").
//!
//! Agreeing is by construction where it can be: the header is read as the library's own
//! [`jsonwebtoken::Header`], and the claims as the library reads them for its checks (each
//! claim either read, unreadable or absent, an unreadable one counting as missing).

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, Header};
use serde::Deserialize;
use serde::de::{self, Deserializer};
use sha2::{Sha256, Sha384, Sha512};

use super::{MAX_TOKEN_BYTES, Refused};
use crate::domain::UserId;
use crate::settings::JwtAlgorithm;

/// Checks tokens signed with one secret by one HMAC algorithm.
pub(super) struct SharedSecret {
    key: Key,
    /// The `alg` a token's header must name.
    algorithm: Algorithm,
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

/// The claims, read as the library reads them for its checks.
#[derive(Deserialize)]
struct Claims<'a> {
    #[serde(default, deserialize_with = "numeric_date")]
    exp: Claim<u64>,
    #[serde(default, deserialize_with = "numeric_date")]
    nbf: Claim<u64>,
    #[serde(borrow)]
    sub: Claim<Cow<'a, str>>,
    #[serde(borrow)]
    iss: Claim<OneOrMany<'a>>,
    #[serde(borrow)]
    aud: Claim<OneOrMany<'a>>,
}

/// One claim: read, present but not of its type, or absent.
#[derive(Default)]
enum Claim<T> {
    Read(T),
    Unreadable,
    #[default]
    Absent,
}

impl<T> Claim<T> {
    /// The claim, if it was read: an unreadable claim counts as missing.
    fn read(self) -> Option<T> {
        match self {
            Claim::Read(value) => Some(value),
            Claim::Unreadable | Claim::Absent => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Claim<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A claim of the wrong type is not an error of the whole: the library reads on.
        Ok(match Option::<T>::deserialize(deserializer) {
            Ok(Some(value)) => Claim::Read(value),
            Ok(None) => Claim::Absent,
            Err(_) => Claim::Unreadable,
        })
    }
}

/// `iss` or `aud`: one name or several.
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

/// A NumericDate (RFC 7519): whole seconds, or a fraction rounded as the library does;
/// anything else (a string, a negative number) is unreadable.
fn numeric_date<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Claim<u64>, D::Error> {
    struct Seconds;

    impl de::Visitor<'_> for Seconds {
        type Value = Claim<u64>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("a NumericDate")
        }

        fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Claim<u64>, E> {
            Ok(Claim::Read(seconds))
        }

        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Claim<u64>, E> {
            if seconds.is_finite() && seconds >= 0.0 && seconds < u64::MAX as f64 {
                Ok(Claim::Read(seconds.round() as u64))
            } else {
                Err(E::custom("not a NumericDate"))
            }
        }
    }

    Ok(deserializer
        .deserialize_any(Seconds)
        .unwrap_or(Claim::Unreadable))
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
        let (key, algorithm) = match algorithm {
            JwtAlgorithm::HS256 => (
                Key::Hs256(Hmac::new_from_slice(secret).ok()?),
                Algorithm::HS256,
            ),
            JwtAlgorithm::HS384 => (
                Key::Hs384(Hmac::new_from_slice(secret).ok()?),
                Algorithm::HS384,
            ),
            JwtAlgorithm::HS512 => (
                Key::Hs512(Hmac::new_from_slice(secret).ok()?),
                Algorithm::HS512,
            ),
            _ => return None,
        };
        Some(Self {
            key,
            algorithm,
            leeway_s,
            issuer,
            audience,
        })
    }

    /// The buyer `token` names, or why it is refused.
    pub(super) fn buyer(&self, token: &str) -> Result<UserId, Refused> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| Refused::Invalid("this server's clock is before 1970"))?
            .as_secs();
        self.buyer_at(token, now)
    }

    /// [`Self::buyer`] at `now`, in seconds since 1970.
    fn buyer_at(&self, token: &str, now: u64) -> Result<UserId, Refused> {
        let (signed, signature) = token.rsplit_once('.').ok_or(MALFORMED)?;
        let (header, payload) = signed.rsplit_once('.').ok_or(MALFORMED)?;

        // The algorithm first: a token signed otherwise (`none` included) is refused before
        // its signature is looked at.
        let header: Header = serde_json::from_slice(&decode(header)?).map_err(|_| MALFORMED)?;
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
        let exp = claims.exp.read().ok_or(MISSING)?;
        if exp < now.saturating_sub(self.leeway_s) {
            return Err(Refused::Invalid("it has expired"));
        }
        match claims.nbf {
            Claim::Read(nbf) if nbf > now.saturating_add(self.leeway_s) => {
                return Err(Refused::Invalid("it is not valid yet (nbf)"));
            }
            // A `nbf` that is there but not a date is refused, as the library does.
            Claim::Unreadable => return Err(MALFORMED),
            Claim::Read(_) | Claim::Absent => {}
        }
        check_named(claims.iss, self.issuer.as_deref(), "wrong issuer")?;
        check_named(claims.aud, self.audience.as_deref(), "wrong audience")?;
        super::buyer_id(&claims.sub.read().ok_or(MISSING)?)
    }
}

/// `iss` or `aud` against its setting: present and naming it, when one is configured.
fn check_named(
    claim: Claim<OneOrMany>,
    wanted: Option<&str>,
    wrong: &'static str,
) -> Result<(), Refused> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    if claim.read().ok_or(MISSING)?.names(wanted) {
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

    /// `header.payload.signature` from parts already encoded, signed by HS256.
    fn signed_raw(header: &str, payload: &str) -> String {
        let signed = format!("{header}.{payload}");
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        let signature =
            jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).unwrap();
        format!("{signed}.{signature}")
    }

    /// What `jsonwebtoken::decode` answers for `token` under `settings`.
    fn library(settings: &IdentitySettings, token: &str) -> Result<UserId, Refused> {
        let key = jsonwebtoken::DecodingKey::from_secret(SECRET.as_bytes());
        let algorithm = crate::identity::algorithm(settings.algorithm);
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
            // Fields the library's header type does not read as they are.
            r#"{"alg":"HS256","kid":5}"#.into(),
            r#"{"alg":"HS256","x":1}"#.into(),
            r#"{"alg":"HS256","x":"y"}"#.into(),
            r#"{"alg":"HS256","typ":"JWT","typ":"JWT"}"#.into(),
            r#"{"alg":"HS256","x5c":["a"],"crit":["b"],"jwk":{"kty":"oct"}}"#.into(),
            r#"{"alg":"HS256","zip":"DEF","enc":"A128GCM"}"#.into(),
            r#"{"alg":{"HS256":null}}"#.into(),
            r#"{"alg":"HS256","x":"\udc00"}"#.into(),
            r#"{"alg":"HS256"} "#.into(),
            r#"{"alg":"HS256"}x"#.into(),
            "\u{feff}{\"alg\":\"HS256\"}".into(),
            format!(
                r#"{{"alg":"HS256","x":{}1{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
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
            json!(1e10),
            json!(-0.0),
            json!({"exp": now + 3_600}),
            json!([now + 3_600]),
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
            format!(r#"{{"sub":"5","exp":{exp},"iss":"\udc00"}}"#),
            format!(r#"{{"sub":"5","exp":{exp},"aud":"\udc00"}}"#),
            format!(
                r#"{{"sub":"5","exp":{exp},"aud":{}"a"{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            format!(r#"{{"sub":"5","exp":{exp},"iss":"shop","aud":"seckill","x":"\udc00"}}"#),
            format!(r#" {{"sub":"5","exp":{exp},"iss":"shop","aud":"seckill"}} "#),
            format!(r#"{{"sub":"5","exp":{exp},"iss":"shop","aud":"seckill"}}x"#),
            format!("\u{feff}{{\"sub\":\"5\",\"exp\":{exp}}}"),
            format!("\u{c}{{\"sub\":\"5\",\"exp\":{exp}}}"),
            format!(r#"{{"sub":"5","exp":{exp},"iss":"shop","aud":["seckill","seckill"]}}"#),
            format!(r#"{{"sub":"5","exp":{exp},"iss":"shop","aud":["seckill",5]}}"#),
        ]);

        let mut tokens = Vec::new();
        // Each header and each payload signed by each algorithm, so that every setting
        // sees each variant with a good signature.
        for (algorithm, name) in [
            (Algorithm::HS256, "HS256"),
            (Algorithm::HS384, "HS384"),
            (Algorithm::HS512, "HS512"),
        ] {
            for header in &headers {
                let header = header.replace("HS256", name);
                tokens.push(token(&header, &payloads[0], algorithm, SECRET));
            }
            let header = good_header.replace("HS256", name);
            for payload in &payloads {
                tokens.push(token(&header, payload, algorithm, SECRET));
            }
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
        // Parts that are not canonical base64url, signed as they are, so that only their
        // encoding is wrong; and a signature cut short.
        let exp_only = format!(r#"{{"sub":"5","exp":{exp}}}"#);
        let (header64, payload64) = (
            URL_SAFE_NO_PAD.encode(good_header),
            URL_SAFE_NO_PAD.encode(&exp_only),
        );
        let standard = base64::engine::general_purpose::STANDARD.encode(&exp_only);
        let mut trailing_bits = payload64.clone();
        if payload64.len() % 4 != 0 {
            // The last character's unused low bits set: the same bytes, not canonical.
            let last = trailing_bits.pop().unwrap();
            let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            let index = alphabet.find(last).unwrap();
            trailing_bits.push(alphabet.as_bytes()[index | 1].into());
        }
        tokens.extend([
            signed_raw(&header64, &payload64),
            signed_raw(&header64, &standard),
            signed_raw(&header64, standard.trim_end_matches('=')),
            signed_raw(&format!("{header64}="), &payload64),
            signed_raw(&header64, &trailing_bits),
            signed_raw(&header64, &format!(" {payload64}")),
        ]);
        let whole = signed_raw(&header64, &payload64);
        tokens.push(whole[..whole.len() - 2].to_owned());
        tokens
    }

    #[test]
    fn it_answers_as_the_library_does() {
        let mut checked = 0;
        let settings_tried = [
            (None, None),
            (Some("shop"), Some("seckill")),
            (Some("shop"), None),
            (None, Some("seckill")),
        ];
        for (issuer, audience) in settings_tried {
            for leeway_s in [0, 60] {
                for algorithm in [
                    JwtAlgorithm::HS256,
                    JwtAlgorithm::HS384,
                    JwtAlgorithm::HS512,
                ] {
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
                        // Both at the same second (the library reads the clock itself).
                        let (ours, theirs) = loop {
                            let now = now();
                            let answers = (ours.buyer_at(&token, now), library(&settings, &token));
                            if self::now() == now {
                                break answers;
                            }
                        };
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
    fn it_says_why_it_refuses() {
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
        let other = token(r#"{"alg":"HS384"}"#, "{}", Algorithm::HS384, SECRET);
        assert_eq!(
            ours.buyer(&other),
            Err(Refused::Invalid(
                "it is not signed with the algorithm this service takes"
            ))
        );
        // `none` is no algorithm the library's header knows.
        let none = token(r#"{"alg":"none"}"#, "{}", Algorithm::HS256, SECRET);
        assert_eq!(ours.buyer(&none), Err(Refused::Invalid("malformed")));
    }
}
