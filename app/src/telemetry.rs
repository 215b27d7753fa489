//! Logging: `tracing` to stdout, as text or JSON, level from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Install the global subscriber. Call once, from `main`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}
