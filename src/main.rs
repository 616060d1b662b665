//! The `counterd` binary: parse the command line, load settings, hand over to the library.
//!
//! It allocates with jemalloc, with a short decay and two arenas (`MALLOC_CONF` below): on the
//! benchmark's catch-up it spends about a quarter less CPU per event than glibc's malloc, whose
//! malloc, free and chunk consolidation were half of the worker's CPU, at a lower peak RSS
//! (bench/RESULTS.md, 2026-12-06, "CPU per event"). glibc's malloc had replaced mimalloc for
//! its lower peak RSS (2026-12-04); jemalloc's returns its dirty pages after a second.

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: two arenas (the runtime's two worker threads and the
/// driver's share them: more arenas hold more memory apart), and freed pages returned to the
/// system a second after they fall dirty (the default keeps them ten), none kept "muzzy".
/// `MALLOC_CONF` in the environment is read after them and may override them.
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

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
