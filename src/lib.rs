//! jobmgr: a worker manager for job queues, and the job server it talks to.
//!
//! - [`protocol`]: the job model and Bedrock::Jobs commands as pure types.
//! - [`server`]: the job server (SQLite store, queue with blocking GetJob and
//!   leases, HTTP/JSON API).
//! - [`client`]: clients of a job server.
//! - [`supervisor`]: the worker manager that runs jobs as child processes.
//! - [`config`]: supervisor options from flags and configuration files.
//! - [`auth`]: the API token every client shows.
//! - [`cli`]: the command line.

pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod future;
pub mod logging;
pub mod metrics;
pub mod protocol;
pub mod server;
pub mod supervisor;
