//! wrk, the load generator: its Lua scripts, one run, and what its report says.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};

/// Every request a new buyer, in every run: run `r` (the first argument), thread `t` counts
/// from `r * 10^11 + t * 10^9`. (Lua numbers are doubles: exact up to 2^53.)
///
/// With more arguments, the second is the number of threads and the others the paths to buy
/// at, shared out among the threads (thread `t` takes paths `t`, `t + threads`, ...) and each
/// thread's taken in turn by its requests. With a thread per path every path has connections
/// of its own, so a product that sells slowly holds up only its own buyers and sells less;
/// with fewer threads each thread's requests go to its paths in turn, whichever connection
/// sends them, and every path sells alike, the slow one holding everyone up. Without them,
/// every request goes to the URL's path.
///
/// Each request carries its buyer's token, signed here as the identity provider would (see
/// [`TOKEN_LUA`]).
pub fn buy_script(secret: &str) -> String {
    TOKEN_LUA.replace("__SECRET__", &lua_string(secret)) + BUY_LUA
}

/// One fixed purchase: for the sold-out answer, whose cost does not depend on the buyer.
pub(crate) fn fixed_script(token: &str) -> String {
    format!(
        "wrk.method = \"POST\"\nwrk.body = '{{\"user_id\": 3}}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"Authorization\"] = \"Bearer {token}\"\n"
    )
}

/// `token(user)`: an HS256 JWT for the buyer, valid for a day, in wrk's LuaJIT: HMAC-SHA256
/// from the libcrypto wrk is linked with (through LuaJIT's FFI), base64url by hand. About
/// a microsecond of wrk's time per request: the service's own check of it is what is
/// measured.
const TOKEN_LUA: &str = include_str!("lua/token.lua");

/// The buy script after [`TOKEN_LUA`]: a new buyer each request, their token, their path.
const BUY_LUA: &str = include_str!("lua/buy.lua");

/// `text` as a Lua string literal.
fn lua_string(text: &str) -> String {
    let mut quoted = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            c if c.is_ascii_graphic() || c == ' ' => quoted.push(c),
            c => {
                let mut bytes = [0; 4];
                for byte in c.encode_utf8(&mut bytes).bytes() {
                    quoted.push_str(&format!("\\{byte:03}"));
                }
            }
        }
    }
    quoted.push('"');
    quoted
}

pub(crate) const GET_SCRIPT: &str = "wrk.method = \"GET\"\n";

/// Numbers wrk runs, so no two runs (three at once included) share a buyer.
static RUNS: AtomicU64 = AtomicU64::new(1);

/// What one wrk run reported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Report {
    pub requests: f64,
    pub per_sec: f64,
    /// Answers other than 2xx and 3xx, and socket errors (timeouts included).
    pub failed: f64,
    /// The 99th percentile of the latency of every answer, failed ones included, in ms.
    pub p99_ms: Option<f64>,
}

/// One wrk process: where it sends, how.
#[derive(Debug, Clone)]
pub(crate) struct Load<'a> {
    pub url: &'a str,
    /// The path in the URL; for the buy script, the first of `paths` will do.
    pub path: &'a str,
    pub script: &'a Path,
    pub threads: u32,
    pub connections: u32,
    pub seconds: u64,
    /// Extra arguments for the script after the run number (the buy script's paths).
    pub paths: &'a [String],
}

/// Run wrk once, with latency percentiles (`--latency`).
///
/// # Errors
/// wrk fails to start, or its report shows no request at all.
pub(crate) async fn run(load: Load<'_>) -> anyhow::Result<Report> {
    let output = tokio::process::Command::new("wrk")
        .args([
            &format!("-t{}", load.threads),
            &format!("-c{}", load.connections),
            &format!("-d{}s", load.seconds),
            "--timeout",
            "10s",
            "--latency",
        ])
        .arg("-s")
        .arg(load.script)
        .arg(format!("{}{}", load.url, load.path))
        .arg("--")
        .arg(RUNS.fetch_add(1, Ordering::Relaxed).to_string())
        .args(
            (!load.paths.is_empty())
                .then(|| load.threads.to_string())
                .into_iter()
                .chain(load.paths.iter().cloned()),
        )
        .kill_on_drop(true)
        .output()
        .await
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    match parse(&text) {
        Some(report) => Ok(report),
        None => bail!(
            "wrk measured nothing: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// What wrk's report says; `None` when it shows no request.
pub(crate) fn parse(text: &str) -> Option<Report> {
    let number = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0)
    };
    let requests: f64 = text
        .lines()
        .find(|line| line.contains(" requests in "))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let socket_errors = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("Socket errors:"))
        .map(|rest| {
            rest.split(',')
                .filter_map(|part| part.split_whitespace().last())
                .filter_map(|n| n.parse::<f64>().ok())
                .sum::<f64>()
        })
        .unwrap_or(0.0);
    // Under "Latency Distribution": `     99%    1.20ms`.
    let p99_ms = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("99%"))
        .and_then(|rest| milliseconds(rest.trim()));
    (requests > 0.0).then_some(Report {
        requests,
        per_sec: number("Requests/sec:"),
        failed: number("Non-2xx or 3xx responses:") + socket_errors,
        p99_ms,
    })
}

/// A wrk duration (`635.91us`, `1.20ms`, `2.00s`, `1.50m`) in ms.
fn milliseconds(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (value, unit) = text.split_at(split);
    let value: f64 = value.parse().ok()?;
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3_600e3,
        _ => return None,
    };
    Some(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "Running 2s test @ http://127.0.0.1:40000/api/products/1/purchase
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.45ms    1.02ms  20.11ms   80.00%
    Req/Sec     9.31k   500.00    10.00k    70.00%
  Latency Distribution
     50%    3.20ms
     75%    3.90ms
     90%    4.70ms
     99%  812.50us
  37240 requests in 2.00s, 6.11MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 15
Requests/sec:  18615.53
Transfer/sec:      3.05MB
";

    #[test]
    fn a_report_gives_requests_failures_and_the_99th_percentile() {
        let report = parse(REPORT).unwrap();

        assert_eq!(report.requests, 37_240.0);
        assert_eq!(report.per_sec, 18_615.53);
        // 15 non-2xx answers and 5 socket errors.
        assert_eq!(report.failed, 20.0);
        assert!((report.p99_ms.unwrap() - 0.8125).abs() < 1e-9);
    }

    #[test]
    fn a_report_without_requests_is_no_report() {
        assert_eq!(
            parse("unable to connect to 127.0.0.1:1 Connection refused"),
            None
        );
    }

    #[test]
    fn durations_in_every_unit_wrk_prints_become_milliseconds() {
        assert_eq!(milliseconds("2.00s"), Some(2_000.0));
        assert_eq!(milliseconds("1.50m"), Some(90_000.0));
        assert_eq!(milliseconds("12.00ms"), Some(12.0));
        assert_eq!(milliseconds("12.00"), None);
    }
}
