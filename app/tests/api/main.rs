//! The service over HTTP, against a fresh PostgreSQL database per test (`#[sqlx::test]`)
//! and a real Redis (the shared one under a unique key prefix, or a private `redis-server`
//! for tests that kill it); ZooKeeper and etcd as private servers of their own.

mod admin_writes;
mod batches;
mod bounds;
mod buyers;
mod clients;
mod concurrency;
mod consensus;
mod fencing;
mod health;
mod helpers;
mod holders_together;
mod listeners;
mod openapi;
mod outcomes;
mod privileges;
mod products;
mod purchase;
mod reads;
mod redis_faults;
mod retries;
mod sold_out;
mod startup;
mod tls;
