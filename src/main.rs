//! The `jobmgr` binary: parses arguments, sets up logging, runs the library,
//! and turns the outcome into an exit code.

use std::process::ExitCode;

use jobmgr::cli::{self, Cli};

/// jemalloc rather than glibc's allocator: the many small allocations of
/// each job (its request and report, JSON, environment, buffers) cost the
/// supervisor and the server about 7 % less CPU per job, for 2 to 4 MiB
/// more RSS (BENCHMARKS.md, "The sixth session"; mimalloc did as well on
/// CPU for 8 to 12 MiB more).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = match Cli::parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(error) => match cli::environment::explain(&error) {
            // A bad value from a JOBMGR_* variable: name the variable.
            Some(message) => {
                eprint!("{message}");
                return ExitCode::from(2);
            }
            None => error.exit(),
        },
    };
    // The supervisor's spawner (or, failing it, its job guard) is forked
    // while this process has one thread.
    let spawner = cli
        .command
        .is_none()
        .then(jobmgr::supervisor::spawner::start);
    let guard = matches!(spawner, Some(Err(_))).then(jobmgr::supervisor::job_guard::start);
    jobmgr::logging::init(cli.log_format);
    if let Some(Err(error)) = spawner {
        tracing::warn!(%error, "cannot start the spawner process: workers are forked from the supervisor itself, which costs more CPU per job");
    }
    if let Some(Err(error)) = guard {
        tracing::warn!(%error, "cannot start the job guard: a job's children may outlive a crash of the supervisor");
    }
    cli::environment::warn_unknown();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(cli::run(cli));
    if let Err(error) = &result {
        eprintln!("error: {}", jobmgr::client::with_sources(error));
    }
    cli::exit_code(&result)
}
