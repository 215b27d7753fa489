//! The files a [`PatroniCluster`](super::PatroniCluster) runs on: each member's
//! `patroni.yml`, and HAProxy's `haproxy.cfg`.

use std::path::Path;

use super::TTL_SECS;

/// What one member's `patroni.yml` says.
pub(super) struct MemberFile<'a> {
    pub name: &'a str,
    pub api_port: u16,
    pub etcd_port: u16,
    pub pg_port: u16,
    pub data: &'a Path,
    pub bin: &'a Path,
    /// The member's directory: its socket and its `pgpass` go there.
    pub home: &'a Path,
    /// PostgreSQL settings besides the usual ones.
    pub settings: &'a [(&'a str, &'a str)],
}

/// A member's `patroni.yml`: etcd (`etcd3`) as its store, `synchronous_mode_strict`, and
/// the settings that must agree across members in the dynamic configuration
/// (`bootstrap.dcs.postgresql.parameters`), where Patroni reads them (it overrides a
/// member's own value of those).
pub(super) fn patroni_yml(m: &MemberFile) -> String {
    let parameters: String = [("max_connections", "300"), ("wal_log_hints", "on")]
        .iter()
        .chain(m.settings)
        .map(|(name, value)| format!("        {name}: \"{value}\"\n"))
        .collect();
    format!(
        "scope: seckill\n\
         name: {name}\n\
         restapi:\n  listen: 127.0.0.1:{api}\n  connect_address: 127.0.0.1:{api}\n\
         etcd3:\n  hosts: 127.0.0.1:{etcd}\n\
         bootstrap:\n  dcs:\n    ttl: {TTL_SECS}\n    loop_wait: 1\n    retry_timeout: 4\n\
         \x20   maximum_lag_on_failover: 1048576\n\
         \x20   synchronous_mode: true\n    synchronous_mode_strict: true\n\
         \x20   postgresql:\n      use_pg_rewind: true\n      use_slots: true\n\
         \x20     parameters:\n{parameters}\
         \x20 initdb:\n  - encoding: UTF8\n  - auth: trust\n\
         \x20 pg_hba:\n  - local all all trust\n  - host all all 127.0.0.1/32 trust\n\
         \x20 - host replication all 127.0.0.1/32 trust\n\
         postgresql:\n  listen: 127.0.0.1:{pg}\n  connect_address: 127.0.0.1:{pg}\n\
         \x20 data_dir: {data}\n  bin_dir: {bin}\n  pgpass: {home}/pgpass\n\
         \x20 authentication:\n    superuser: {{username: postgres}}\n\
         \x20   replication: {{username: postgres}}\n    rewind: {{username: postgres}}\n\
         \x20 parameters:\n    unix_socket_directories: \"{home}\"\n",
        name = m.name,
        api = m.api_port,
        etcd = m.etcd_port,
        pg = m.pg_port,
        data = m.data.display(),
        bin = m.bin.display(),
        home = m.home.display(),
    )
}

/// HAProxy in TCP mode on `port`, in front of `servers` (name, PostgreSQL port, Patroni
/// REST port): checks every 500 ms of `GET /primary`; a member is out after two failed
/// checks and in after one good one; the sessions of a member marked out are cut, so that
/// no client goes on writing to a demoted primary.
pub(super) fn haproxy_cfg(port: u16, servers: &[(&str, u16, u16)]) -> String {
    let servers: String = servers
        .iter()
        .map(|(name, pg, api)| format!("    server {name} 127.0.0.1:{pg} check port {api}\n"))
        .collect();
    format!(
        "global\n    maxconn 2000\n\
         defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 1h\n\
         \x20   timeout server 1h\n    timeout check 1s\n\
         listen primary\n    bind 127.0.0.1:{port}\n\
         \x20   option httpchk GET /primary\n    http-check expect status 200\n\
         \x20   default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
         {servers}"
    )
}
