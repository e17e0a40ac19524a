//! Integration tests: the real `jobmgr` binary, a real SQLite file, real
//! sockets on 127.0.0.1 with ports from the OS. One binary, topic modules.

mod common;

mod bedrock;
mod bedrock_client;
mod bedrock_leases;
mod bedrock_limits;
mod browser_safety;
mod chaos;
mod children;
mod cli;
mod clock_step;
mod commands;
mod config;
mod crash;
mod demo;
mod edges;
mod handback;
mod harness;
mod hostile;
mod hostile_workers;
mod http_limits;
mod idempotency;
mod job_uids;
mod leases;
mod ledger;
mod lifecycle;
mod local_auth;
mod lockout;
mod log_hygiene;
mod long_poll;
mod metrics;
mod one_server_per_file;
mod openapi;
mod operations;
mod pool_files;
mod repeat;
mod sandbox;
mod store_health;
mod supervisor;
mod tls;
mod wake_ups;
