//! The `counterd` binary: parse the command line, load settings, hand over to the library.
//!
//! It allocates with jemalloc (two arenas: `MALLOC_CONF` below): on the benchmark's catch-up it
//! spends a fifth to a quarter less CPU per event than glibc's malloc, whose malloc, free and
//! chunk consolidation were half of the worker's CPU, at a lower peak RSS than glibc's
//! (bench/RESULTS.md, 2026-12-06 afternoon). glibc's malloc had replaced mimalloc for its lower
//! peak RSS (2026-12-04).

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: two arenas (the runtime's two worker threads and the
/// driver's threads share them; its default, four per core, holds more memory apart for no
/// CPU measured). Its decay is left at its default (dirty pages returned after ten seconds): a
/// decay of one second cost about 7 % more CPU per event for 2-3 MB less peak RSS.
/// `_RJEM_MALLOC_CONF` in the environment (jemalloc's `MALLOC_CONF`, under the prefix of the
/// crate's build) is read after these options and may override them.
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"narenas:2\0";

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
            return ExitCode::from(counterd::cli::exit::INTERNAL);
        }
    };
    runtime.block_on(counterd::cli::main(cli))
}
