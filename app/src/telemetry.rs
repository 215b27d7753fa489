//! Logging: `tracing` to stdout, as text or JSON, level from `RUST_LOG` (default `info`,
//! without the access log: a sale's flood would be a line per request; `RUST_LOG=info`
//! turns it on).

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// The filter when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,seckill::access=off";

/// Install the global subscriber. Call once, from `main`.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}
