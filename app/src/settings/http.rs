//! The HTTP group of settings: the two listeners, their connection bounds, and the admin
//! token. Split from `groups.rs` for its size; same conventions (each field names its flag
//! and its variable).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use secrecy::SecretString;

use super::groups::secret;
use super::range;

/// Where the service listens, and who may use its admin routes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP")]
pub struct HttpSettings {
    /// Address buyers reach: the sale (a product, a purchase, an order) and `/healthz`. Port 0
    /// picks a free port; the bound address is printed on stdout as `listening on <address>`.
    #[arg(
        long = "bind-addr",
        id = "bind_addr",
        value_name = "BIND_ADDR",
        env = "BIND_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub bind_addr: SocketAddr,

    /// Address of the operators' listener: the admin routes, `/metrics`, `/readyz` and the
    /// OpenAPI document, besides everything the public one serves. Keep it private
    /// (loopback, or a network only operators and Prometheus reach). Port 0 picks a free
    /// port, printed on stdout as `operations on <address>`.
    #[arg(
        long = "ops-bind-addr",
        id = "ops_bind_addr",
        value_name = "OPS_BIND_ADDR",
        env = "OPS_BIND_ADDR",
        default_value = "127.0.0.1:9080"
    )]
    pub ops_bind_addr: SocketAddr,

    /// Most client connections open at once; beyond it, new connections wait in the
    /// listener's backlog until one closes. Each takes a file descriptor: keep it below the
    /// process's `ulimit -n`, less the database and Redis connections.
    #[arg(
        long = "http-max-connections",
        id = "http_max_connections",
        value_name = "HTTP_MAX_CONNECTIONS",
        env = "HTTP_MAX_CONNECTIONS",
        default_value_t = 10_000,
        value_parser = range::HTTP_MAX_CONNECTIONS.parser(),
    )]
    pub max_connections: u32,

    /// How long a client has to send a request, in ms: its head (then the connection is
    /// closed with 408), and separately its body once a handler reads it (408
    /// `request_timeout`). A client that trickles a body a byte at a time holds a connection
    /// this long at most.
    #[arg(
        long = "http-request-timeout-ms",
        id = "http_request_timeout_ms",
        value_name = "HTTP_REQUEST_TIMEOUT_MS",
        env = "HTTP_REQUEST_TIMEOUT_MS",
        default_value = "5000",
        value_parser = range::HTTP_REQUEST_TIMEOUT.parser(),
    )]
    pub request_timeout: Duration,

    /// How long an idle keep-alive connection stays open between requests, in ms.
    #[arg(
        long = "http-keep-alive-ms",
        id = "http_keep_alive_ms",
        value_name = "HTTP_KEEP_ALIVE_MS",
        env = "HTTP_KEEP_ALIVE_MS",
        default_value = "5000",
        value_parser = range::HTTP_KEEP_ALIVE.parser(),
    )]
    pub keep_alive: Duration,

    /// Token for the admin routes (`Authorization: Bearer <token>`), at least 16 characters
    /// and not blank. Unset (and no ADMIN_TOKEN_FILE): admin routes answer 403. Kept out of
    /// logs, error messages and debug output; prefer ADMIN_TOKEN_FILE (a flag shows in `ps`).
    #[arg(
        long = "admin-token",
        id = "admin_token",
        value_name = "ADMIN_TOKEN",
        env = "ADMIN_TOKEN",
        hide_env_values = true,
        value_parser = secret,
        conflicts_with = "admin_token_file",
    )]
    pub admin_token: Option<SecretString>,

    /// A file with the admin token, or two (one per line) during a rotation: both are
    /// accepted. Read at start-up, and again within a second of each change, so a rotation
    /// needs no restart: add the new token, move the callers to it, remove the old one. A
    /// file that becomes unreadable or invalid keeps the tokens read last (logged).
    #[arg(
        long = "admin-token-file",
        id = "admin_token_file",
        value_name = "ADMIN_TOKEN_FILE",
        env = "ADMIN_TOKEN_FILE"
    )]
    pub admin_token_file: Option<PathBuf>,

    /// Accept the admin token published in docker-compose.yml. Off: start-up fails with it
    /// (and a token file that names it is refused). For the demo stack only.
    #[arg(
        long = "allow-demo-admin-token",
        id = "allow_demo_admin_token",
        value_name = "ALLOW_DEMO_ADMIN_TOKEN",
        env = "ALLOW_DEMO_ADMIN_TOKEN",
        action = clap::ArgAction::Set,
        default_value_t = false,
    )]
    pub allow_demo_admin_token: bool,
}
