//! Integration tests: the real `jobmgr` binary, a real SQLite file, real
//! sockets on 127.0.0.1 with ports from the OS. One binary, topic modules.

mod common;

mod bedrock;
mod bedrock_client;
mod chaos;
mod children;
mod cli;
mod commands;
mod config;
mod crash;
mod edges;
mod handback;
mod hostile;
mod hostile_workers;
mod leases;
mod ledger;
mod lifecycle;
mod long_poll;
mod metrics;
mod openapi;
mod operations;
mod repeat;
mod sandbox;
mod supervisor;
