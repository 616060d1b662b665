//! The `counterd` binary: parse the command line, load settings, hand over to the library.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: the worker allocates and frees many small BSON
/// documents per event, which glibc's malloc served with much consolidation work and a peak
/// RSS that kept growing over a long backlog (see bench/RESULTS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = counterd::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("counterd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(counterd::cli::main(cli))
}
