//! The load test: floods seckill instances with buyers through goose, then checks the books
//! in PostgreSQL, not only the answers.
//!
//! - `cli`: the command line (attack options, `demo`, the hidden `serve`).
//! - `attack`: product creation, the goose scenario, the tally of answers.
//! - `books`: the figures read from PostgreSQL and the verdict.
//! - `instances`: seckill child processes for the demo.
//! - `demo`: every strategy, one comparison table.

pub mod attack;
pub mod books;
pub mod cli;
pub mod demo;
pub mod instances;
