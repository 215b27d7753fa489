//! What checking a buyer's token costs, on one thread: the service's check of a shared
//! secret's token (`Verifier`, one pass) against `jsonwebtoken::decode` with the same
//! checks, over the same tokens, in rounds that alternate so the machine's noise falls on
//! both. Prints each round's nanoseconds per token and the median ratio.
//!
//! `cargo bench -p seckill --bench token_check [-- ROUNDS TOKENS]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use seckill::Settings;
use seckill::identity::{Identity, Issuer};

const SECRET: &str = "a-buyer-secret-of-at-least-32-bytes";

#[derive(serde::Deserialize)]
struct Claims {
    sub: String,
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
    let rounds: usize = args.next().map_or(5, |n| n.parse().expect("ROUNDS"));
    let count: usize = args.next().map_or(200_000, |n| n.parse().expect("TOKENS"));

    let mut settings = Settings::new("postgres://x", "redis://r").identity;
    settings.secret = Some(SECRET.into());
    let Identity::Verified(verifier) = Identity::from_settings(&settings).unwrap() else {
        unreachable!("a secret makes a verifier");
    };
    // The checks the service asks of the library (`identity::validation`).
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = u64::from(settings.leeway_s);
    validation.validate_nbf = true;
    validation.validate_aud = false;
    validation.set_required_spec_claims(&["exp", "sub"]);
    let key = DecodingKey::from_secret(SECRET.as_bytes());

    // A new buyer per token, as in bench-http.
    let issuer = Issuer::hs256(SECRET);
    let headers: Vec<String> = (0..count)
        .map(|i| {
            let buyer = 100_000_000_000 + i64::try_from(i).unwrap();
            format!("Bearer {}", issuer.token(buyer, Duration::from_secs(3_600)))
        })
        .collect();

    let time = |check: &dyn Fn(&str) -> i64| {
        let started = Instant::now();
        let mut sum = 0i64;
        for header in &headers {
            sum = sum.wrapping_add(check(black_box(header)));
        }
        black_box(sum);
        started.elapsed().as_nanos() as f64 / count as f64
    };
    let ours = |header: &str| verifier.buyer(Some(header.as_bytes())).unwrap().get();
    let library = |header: &str| {
        let token = header.strip_prefix("Bearer ").unwrap();
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .unwrap()
            .claims;
        claims.sub.parse::<i64>().unwrap()
    };

    // A round not counted, to warm caches and the allocator.
    time(&ours);
    time(&library);
    let mut ratios = Vec::new();
    println!("round  service ns/token  jsonwebtoken::decode ns/token  ratio");
    for round in 1..=rounds {
        let (a, b) = if round % 2 == 1 {
            let a = time(&ours);
            (a, time(&library))
        } else {
            let b = time(&library);
            (time(&ours), b)
        };
        println!("{round:>5}  {a:>16.0}  {b:>29.0}  {:.3}", a / b);
        ratios.push(a / b);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median service / jsonwebtoken::decode: {:.3}",
        ratios[ratios.len() / 2]
    );
}
