//! The load test: floods seckill instances with buyers through goose, then checks the books
//! in PostgreSQL, not only the answers.
//!
//! - `cli`: the command line (attack options, `demo`, `bench-http`, the hidden `serve`).
//! - `attack`: product creation, the goose scenario, the tally of answers.
//! - `books`: the figures read from PostgreSQL and the verdict.
//! - `buyers`: each buyer's token, signed as the instances expect.
//! - `instances`: seckill child processes for the demo and the tests.
//! - `servers`: the demo's PostgreSQL, Redis, ZooKeeper and etcd, private ones on a bare
//!   machine.
//! - `demo`: every strategy, one comparison table, `chart`: its SVG.
//! - `bench`: instances measured with wrk against the ceiling (pgbench), with the CPU per
//!   order by where it is spent.
//! - `router`: the compose stack's router (HAProxy) run in front of local instances, for the
//!   bench and the tests.
//! - `chaos`: a fault soak: a seeded nemesis, every answer recorded, a checker of the whole
//!   history against PostgreSQL.
//!
//! It depends on `seckill` only to run instances (`serve`) and to name strategies.

pub mod attack;
pub mod bench;
pub mod books;
pub mod buyers;
pub mod chaos;
pub mod chart;
pub mod cli;
pub mod demo;
pub mod instances;
pub mod router;
pub mod servers;
